"""The host modules return exactly what RETURN documents (tests/unit/test_module_docs.py checks the rest)."""

import yaml

from .conftest import load_module


def test_return_documents_what_the_modules_return(tmp_path):
    cmdline = load_module("kernel_cmdline")
    documented = set(yaml.safe_load(cmdline.RETURN))
    (tmp_path / "cmdline").write_text("root=x \n")
    (tmp_path / "proc").write_text("root=x\n")
    from .conftest import run_module

    result = run_module(
        "kernel_cmdline",
        {
            "cmdline_file": str(tmp_path / "cmdline"),
            "proc_cmdline": str(tmp_path / "proc"),
            "present": ["a"],
            "boot_loader": "systemd-boot",  # no ESP registered here: auto would refuse the file
        },
    )
    returned = set(result) - {"changed", "invocation", "warnings", "diff", "failed"}
    assert returned == documented

    facts = load_module("pci_facts")
    contains = yaml.safe_load(facts.RETURN)["ansible_facts"]["contains"]["gpulab_pci"]["contains"]
    from labsim import sysfs_tree

    root = sysfs_tree.materialise(tmp_path / "n", "vfio")
    pci = run_module("pci_facts", {"root": str(root)})["ansible_facts"]["gpulab_pci"]
    assert set(pci) == set(contains)
