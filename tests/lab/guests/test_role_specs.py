"""Each guest-stack role documents every variable twice, in defaults/main.yml and meta/argument_specs.yml:
the two must list the same variables with the same defaults (Ansible takes the value from defaults/)."""

import pathlib

import pytest
import yaml

from gpulab.docs import ROLE_EXAMPLES

ROOT = pathlib.Path(__file__).resolve().parents[3]
ROLES = [
    "guest_base",
    "nvidia_driver",
    "nvidia_container_toolkit",
    "k3s_server",
    "k3s_agent",
    "k3s_install",
    "k3s_upgrade",
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


@pytest.mark.slow
def test_every_role_validates_its_arguments_before_any_task(tmp_path):
    """Ansible validates each role's arguments first (tagged always): with the inventory's defaults and
    only the required inputs given, as each role's README example play gives them (gpulab.docs), every role
    passes it. Only the validation tasks run (an unknown tag)."""
    import json
    import os
    import subprocess
    import sys

    book = [
        {
            "name": "validate",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"vault_k3s_token": "secret-token"},
            "roles": [{"role": r, "vars": ROLE_EXAMPLES.get(r, {})} for r in ROLES],
        }
    ]
    path = tmp_path / "play.yml"
    path.write_text(json.dumps(book))
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_LIBRARY": str(ROOT / "plugins" / "modules"),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    cmd = [
        playbook,
        "-i",
        "localhost,",
        "-c",
        "local",
        "--check",
        "--tags",
        "gpulab-validation-only",
        str(path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.stdout.count("Validating arguments against arg spec 'main'") == len(ROLES)
    assert "secret-token" not in proc.stdout
