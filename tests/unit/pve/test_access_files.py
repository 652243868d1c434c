"""playbooks/access.yml's controller part (plugins/action/pve_access.py) edits the inventory's files
line by line: the key's line (or its commented-out example) replaced, everything else kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def action():
    spec = importlib.util.spec_from_file_location(
        "access_action", ROOT / "plugins" / "action" / "pve_access.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_commented_example_line_becomes_the_value_and_the_rest_is_kept():
    main = (ROOT / "inventory" / "homelab" / "group_vars" / "all" / "main.yml").read_text()
    fp = ":".join(["AB"] * 32)
    out = action().set_yaml_key(main, "pve_api_fingerprint", fp)
    assert out.count("pve_api_fingerprint") == 1
    assert yaml.safe_load(out) == {**yaml.safe_load(main), "pve_api_fingerprint": fp}
    assert [ln for ln in out.splitlines() if "pve_api_fingerprint" not in ln] == [
        ln for ln in main.splitlines() if "pve_api_fingerprint" not in ln
    ]
    again = action().set_yaml_key(out, "pve_api_fingerprint", fp)
    assert again == out


def test_a_vault_keeps_its_other_keys_and_a_missing_key_is_added():
    example = (ROOT / "inventory" / "homelab" / "group_vars" / "all" / "vault.yml.example").read_text()
    mod = action()
    out = mod.set_yaml_key(example, mod.VAULT_KEY, "5f0c2b4e-8a4e-4d6b-9c1e-2a7e3b9d1f00")
    data = yaml.safe_load(out)
    assert data[mod.VAULT_KEY] == "5f0c2b4e-8a4e-4d6b-9c1e-2a7e3b9d1f00"
    assert data["vault_router_password"] == yaml.safe_load(example)["vault_router_password"]
    assert yaml.safe_load(mod.set_yaml_key("---\n", mod.VAULT_KEY, "s")) == {mod.VAULT_KEY: "s"}
    assert yaml.safe_load(mod.set_yaml_key("a: 1", mod.VAULT_KEY, "s")) == {"a": 1, mod.VAULT_KEY: "s"}
