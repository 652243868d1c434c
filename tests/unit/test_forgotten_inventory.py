"""A forgotten -i runs nothing: ansible.cfg names no default inventory, and preflight says what to pass.

Before, ansible.cfg named inventory/demo, so `ansible-playbook site.yml` typed without -i on the user's
machine ran against the simulated lab. Every path that wants the simulated lab names it itself (`make demo`,
the molecule scenarios, the tests, scripts/benchmark.py), and every ansible-playbook command the docs show
(library/gpulab/data/commands.yml) names its inventory.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml
from ansible_runs import ansible_playbook, playbook_env
from doc_commands import commands as doc_commands_of

ROOT = Path(__file__).resolve().parents[2]


def test_ansible_cfg_names_no_default_inventory():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "ansible.cfg")
    assert "inventory" not in parser["defaults"], "ansible.cfg must not name a default inventory"


def test_site_yml_without_inventory_stops_in_preflight_and_names_the_flag(tmp_path):
    env = playbook_env()
    if Path("/etc/ansible/hosts").exists():  # this machine's own default: stand in for a machine without one
        env["ANSIBLE_INVENTORY"] = str(tmp_path / "none")
    proc = ansible_playbook("site.yml", env=env, timeout=300)
    out = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode != 0, out
    assert "No lab to run against" in out and "nothing was run or changed" in out, out
    assert "ansible-playbook -i inventory/mylab site.yml" in out and "-i inventory/demo" in out, out
    assert "export ANSIBLE_INVENTORY=" in out, out
    # preflight was the only task: no stage ran, on no host
    recap = proc.stdout.split("PLAY RECAP", 1)[1]
    assert re.findall(r"^(\S+)\s+:", recap, re.M) == ["localhost"], recap
    assert re.search(r"localhost\s+: ok=0\s+changed=0\s+unreachable=0\s+failed=1", recap), recap


def test_every_demo_path_names_its_inventory():
    make = (ROOT / "Makefile").read_text()
    runs = [line for line in make.splitlines() if "ansible-playbook" in line and line.startswith("\t")]
    assert runs and all("-i inventory/demo" in line for line in runs), runs
    for scenario in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        args = yaml.safe_load(scenario.read_text())["ansible"]["executor"]["args"]["ansible_playbook"]
        assert any(a.startswith(("--inventory=", "-i")) for a in args), f"{scenario}: no --inventory"
    bench = (ROOT / "scripts" / "benchmark.py").read_text()
    assert 'DEFAULT_INVENTORY = "inventory/demo"' in bench and '"-i", inventory' in bench


def test_every_ansible_playbook_command_of_the_docs_names_its_inventory():
    commands = [c for c in doc_commands_of() if re.search(r"\bansible-playbook\b", c)]
    assert commands, "the docs show no ansible-playbook command"
    missing = [c for c in commands if not re.search(r"\s(-i|--inventory)[\s=]\S", c)]
    assert not missing, f"commands of the docs without -i: {missing}"
