"""Constants that several parts must agree on are defined once (gpulab.constants) and used as such."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from gpulab import constants, routers
from gpulab.labdef import rules
from gpulab.pve.client import PveConnection

ROOT = Path(__file__).resolve().parents[2]


def test_the_router_kinds_are_one_list():
    assert tuple(routers.KINDS) == constants.ROUTER_KINDS
    ssh = tuple(name for name, kind in routers.KINDS.items() if kind.reach == "ssh")
    assert ssh == constants.SSH_ROUTER_KINDS
    [rule] = rules.RULES["router_kind"]
    assert [k for k in constants.ROUTER_KINDS if rule.test(k)] == list(constants.ROUTER_KINDS)
    assert not rule.test("fritzbox")
    assert set(constants.SSH_ROUTER_KINDS) | set(constants.PASSWORD_ROUTER_KINDS) == set(
        constants.ROUTER_KINDS
    )


def test_the_dhcp_module_offers_the_router_kinds():
    path = ROOT / "plugins" / "modules" / "dhcp_reservation.py"
    spec = importlib.util.spec_from_file_location("dhcp_module_kinds", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.ARGUMENT_SPEC["kind"]["choices"] == list(constants.ROUTER_KINDS)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["options"]["kind"]["choices"] == list(constants.ROUTER_KINDS)


def _client_accepts(**kwargs) -> bool:
    try:
        PveConnection(api_url="https://pve:8006", **kwargs).check()
    except ValueError:
        return False
    return True


def _definition_accepts(name: str, value: str) -> bool:
    return rules.first_failure(name, value) is None


TOKEN_IDS = [
    ("gpulab@pve!ansible", True),
    ("root@pam!gpulab", True),
    ("first.last@my-ad.example!tok_1", True),
    ("gpulab-token", False),
    ("root@pam", False),
    ("root@p!t", False),  # PVE's realm and token names have at least two characters
    ("ro ot@pam!gpulab", False),
    ("root@pam!", False),
]
FINGERPRINTS = [
    (":".join(["AB"] * 32), True),
    (":".join(["ab"] * 32), True),
    ("AB" * 32, False),  # PVE shows and checks the colon form only
    ("AB:CD", False),
    (":".join(["AB"] * 31), False),
]


@pytest.mark.parametrize(("token_id", "valid"), TOKEN_IDS)
def test_the_definition_and_the_client_agree_on_token_ids(token_id, valid):
    assert _definition_accepts("pve_api_token_id", token_id) is valid
    assert _client_accepts(token_id=token_id, token_secret="s") is valid


@pytest.mark.parametrize(("fingerprint", "valid"), FINGERPRINTS)
def test_the_definition_and_the_client_agree_on_fingerprints(fingerprint, valid):
    assert _definition_accepts("pve_api_fingerprint", fingerprint) is valid
    assert _client_accepts(user="root@pam", password="x", fingerprint=fingerprint) is valid
