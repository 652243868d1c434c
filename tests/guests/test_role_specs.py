"""Each guest-stack role documents every variable twice, in defaults/main.yml and meta/argument_specs.yml:
the two must list the same variables with the same defaults (Ansible takes the value from defaults/)."""

import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = [
    "guest_base",
    "nvidia_driver",
    "nvidia_container_toolkit",
    "k3s_server",
    "k3s_agent",
    "hami",
    "workloads",
]


def load(path):
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_argument_specs(role):
    base = ROOT / "roles" / role
    defaults = load(base / "defaults" / "main.yml")
    specs = load(base / "meta" / "argument_specs.yml")["argument_specs"]
    options = {}
    for entry in specs.values():
        for name, spec in entry.get("options", {}).items():
            options.setdefault(name, spec)
    assert all(name.startswith(role + "_") for name in options), "role variables carry the role prefix"
    main = specs["main"]["options"]
    for name, spec in main.items():
        if spec.get("required"):
            assert name not in defaults, f"{name} is required, so it has no default"
        else:
            assert name in defaults, f"{name} is documented but has no default"
    for name, value in defaults.items():
        assert name in options, f"{name} has a default but no argument spec"
        spec = options[name]
        assert spec.get("default") == value, f"{name}: spec default {spec.get('default')!r} != {value!r}"
        if spec.get("choices"):
            assert value in spec["choices"]


@pytest.mark.parametrize("role", ROLES)
def test_secrets_are_no_log(role):
    specs = load(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    for entry in specs.values():
        for name, spec in entry.get("options", {}).items():
            if name.endswith("_token") or "password" in name:
                assert spec.get("no_log") is True, name
