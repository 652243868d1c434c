"""The host modules' DOCUMENTATION, EXAMPLES and RETURN are valid YAML and match their argument specs."""

import pytest
import yaml

from .conftest import load_module

MODULES = ["gpulab_kernel_cmdline", "gpulab_pci_facts"]


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    mod = load_module(name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    options, spec = doc["options"], mod.ARGUMENT_SPEC
    assert set(options) == set(spec)
    for key, arg in spec.items():
        opt = options[key]
        assert opt["type"] == arg["type"], key
        assert opt.get("default") == arg.get("default"), key
        assert opt.get("choices") == arg.get("choices"), key
        assert opt.get("elements") == arg.get("elements"), key
        assert opt.get("description"), key
    assert doc["attributes"]["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_only_documented_options(name):
    mod = load_module(name)
    options = set(yaml.safe_load(mod.DOCUMENTATION)["options"])
    tasks = yaml.safe_load(mod.EXAMPLES)
    used = [t[name] for t in tasks if name in t]
    assert used, "no example calls the module"
    for args in used:
        assert set(args or {}) <= options


def test_return_documents_what_the_modules_return(tmp_path):
    cmdline = load_module("gpulab_kernel_cmdline")
    documented = set(yaml.safe_load(cmdline.RETURN))
    (tmp_path / "cmdline").write_text("root=x \n")
    (tmp_path / "proc").write_text("root=x\n")
    from .conftest import run_module

    result = run_module(
        "gpulab_kernel_cmdline",
        {"cmdline_file": str(tmp_path / "cmdline"), "proc_cmdline": str(tmp_path / "proc"), "present": ["a"]},
    )
    returned = set(result) - {"changed", "invocation", "warnings", "diff", "failed"}
    assert returned == documented

    facts = load_module("gpulab_pci_facts")
    contains = yaml.safe_load(facts.RETURN)["ansible_facts"]["contains"]["gpulab_pci"]["contains"]
    from gpulab.labsim import sysfs_tree

    root = sysfs_tree.materialise(tmp_path / "n", "vfio")
    pci = run_module("gpulab_pci_facts", {"root": str(root)})["ansible_facts"]["gpulab_pci"]
    assert set(pci) == set(contains)
