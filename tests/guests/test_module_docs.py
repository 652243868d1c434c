"""DOCUMENTATION, EXAMPLES and RETURN of the guest-stack modules parse and match their argument specs."""

import pytest
import yaml

from .conftest import load_module

MODULES = ["gpulab_gpu_facts", "gpulab_hami_values", "gpulab_hami_workloads"]


def compare(doc, spec, where=""):
    problems = []
    for name in sorted(set(doc) | set(spec)):
        if name not in doc or name not in spec:
            problems.append(
                f"{where}{name}: only in {'the argument spec' if name in spec else 'the documentation'}"
            )
            continue
        d, s = doc[name], spec[name]
        for key, default in (
            ("type", "str"),
            ("required", False),
            ("default", None),
            ("choices", None),
            ("elements", None),
        ):
            if d.get(key, default) != s.get(key, default):
                problems.append(
                    f"{where}{name}: {key} {d.get(key, default)!r} (doc) != {s.get(key, default)!r}"
                )
        if not d.get("description"):
            problems.append(f"{where}{name}: no description")
        if "options" in s or "suboptions" in d:
            problems += compare(d.get("suboptions") or {}, s.get("options") or {}, f"{where}{name}.")
    return problems


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    mod = load_module(name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    assert compare(doc["options"], mod.ARGUMENT_SPEC) == []
    assert doc["attributes"]["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_the_documented_options(name):
    mod = load_module(name)
    options = set(yaml.safe_load(mod.DOCUMENTATION)["options"])
    examples = yaml.safe_load(mod.EXAMPLES)
    used = [task[name] for task in examples if name in task]
    assert used, "at least one example calls the module"
    for args in used:
        assert set(args or {}) <= options


@pytest.mark.parametrize("name", MODULES)
def test_return_parses(name):
    ret = yaml.safe_load(load_module(name).RETURN)
    assert ret and all("description" in v and "returned" in v for v in ret.values())
