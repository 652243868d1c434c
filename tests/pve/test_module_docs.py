"""DOCUMENTATION, EXAMPLES and RETURN of the PVE modules match their argument specs."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = [
    "gpulab_pve_vm",
    "gpulab_pve_download",
    "gpulab_pve_pci_mapping",
    "gpulab_pve_info",
    "gpulab_lab_table",
]


def load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fragment_options() -> dict:
    frag = load(ROOT / "plugins" / "doc_fragments" / "gpulab_pve.py", "gpulab_pve_fragment")
    return yaml.safe_load(frag.ModuleDocFragment.DOCUMENTATION)["options"]


def compare(doc: dict, spec: dict, where: str) -> list[str]:
    problems = []
    for name in sorted(set(doc) | set(spec)):
        if name not in doc:
            problems.append(f"{where}{name}: in argument_spec, not documented")
            continue
        if name not in spec:
            problems.append(f"{where}{name}: documented, not in argument_spec")
            continue
        d, s = doc[name], spec[name]
        if d.get("type", "str") != s.get("type", "str"):
            problems.append(f"{where}{name}: type {d.get('type')} (doc) != {s.get('type')} (spec)")
        if bool(d.get("required", False)) != bool(s.get("required", False)):
            problems.append(f"{where}{name}: required differs")
        if d.get("default") != s.get("default"):
            problems.append(
                f"{where}{name}: default {d.get('default')!r} (doc) != {s.get('default')!r} (spec)"
            )
        if d.get("choices") != s.get("choices"):
            problems.append(f"{where}{name}: choices differ")
        if d.get("elements") != s.get("elements"):
            problems.append(f"{where}{name}: elements differ")
        if not d.get("description"):
            problems.append(f"{where}{name}: no description")
        if "options" in s or "suboptions" in d:
            problems += compare(d.get("suboptions") or {}, s.get("options") or {}, f"{where}{name}.")
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    mod = load(ROOT / "plugins" / "modules" / f"{name}.py", name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    assert "gpulab_pve" in doc["extends_documentation_fragment"]
    options = {**fragment_options(), **doc["options"]}
    spec = mod.build_argument_spec()
    assert compare(options, spec, "") == []
    assert doc["attributes"]["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_documented_options_and_return_is_yaml(name):
    mod = load(ROOT / "plugins" / "modules" / f"{name}.py", name)
    spec = mod.build_argument_spec()
    examples = yaml.safe_load(mod.EXAMPLES)
    assert examples
    used = 0
    for task in examples:
        args = task.get(name)
        if args is None:
            continue
        used += 1
        assert set(args) <= set(spec), set(args) - set(spec)
        for opt, info in spec.items():
            if info.get("required") and "fallback" not in info:
                assert opt in args, f"example {task['name']!r} lacks required {opt}"
    assert used
    returned = yaml.safe_load(mod.RETURN)
    assert all("description" in v and "type" in v for v in returned.values())


def test_secrets_are_no_log_and_have_env_fallbacks():
    mod = load(ROOT / "plugins" / "modules" / "gpulab_pve_vm.py", "gpulab_pve_vm")
    marker = object()
    spec = mod.build_argument_spec(marker)
    assert spec["api_token_secret"]["no_log"] and spec["api_password"]["no_log"]
    assert spec["api_token_id"]["no_log"] is False
    assert spec["cloudinit"]["options"]["password"]["no_log"]
    assert spec["api_validate_certs"]["default"] is True
    assert spec["api_token_secret"]["fallback"] == (marker, ["PVE_API_TOKEN_SECRET"])
