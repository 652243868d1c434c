"""Molecule writes its own ansible.cfg: the scenario must carry every setting of ours that matters."""

import configparser
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
# Settings that only shape how output reads; a scenario may leave them at Ansible's defaults.
COSMETIC = {"stdout_callback", "display_skipped_hosts", "nocows", "retry_files_enabled", "inventory"}


def _project_cfg():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "ansible.cfg")
    return {section: dict(parser[section]) for section in parser.sections()}


def _scenario_cfg(name):
    scenario = yaml.safe_load((ROOT / "molecule" / name / "molecule.yml").read_text())
    return scenario["ansible"]["cfg"]


def _scenarios():
    return sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


def test_every_scenario_finds_our_plugins_roles_and_module_utils():
    """The checkout is the collection through .collections (collections_path): a scenario finds our modules,
    plugins and module_utils by their full names there, and our roles by roles_path."""
    project = _project_cfg()["defaults"]
    paths = {key: value for key, value in project.items() if "/" in value or key.endswith("_path")}
    assert set(paths) >= {"collections_path", "roles_path"}
    for name in _scenarios():
        scenario = _scenario_cfg(name)["defaults"]
        for key, value in paths.items():
            if key in COSMETIC:
                continue
            want = "${MOLECULE_PROJECT_DIRECTORY}/" + value
            assert scenario.get(key) == want, f"molecule/{name}: defaults.{key} must be {want}"
        # no short-name plugin paths: one spelling, as in an installed copy
        assert not {k for k in scenario if k.endswith("_plugins") or k in ("library", "module_utils")}, name


def test_every_scenario_keeps_pipelining_and_host_key_checking():
    project = _project_cfg()
    for name in _scenarios():
        scenario = _scenario_cfg(name)
        assert (
            str(scenario["ssh_connection"]["pipelining"]).lower() == project["ssh_connection"]["pipelining"]
        )
        assert (
            str(scenario["defaults"]["host_key_checking"]).lower() == project["defaults"]["host_key_checking"]
        )
        assert scenario["defaults"]["gathering"] == project["defaults"]["gathering"]
