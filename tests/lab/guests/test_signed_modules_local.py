"""The nvidia_driver role's proof of Canonical's signed modules under Secure Boot (roles/nvidia_driver/tasks/
verify.yml, issue 31), run on this machine against the role's first read as a GPU guest would give it: it holds
when modinfo names one of Canonical's module-signing keys and mokutil says Secure Boot is on, and fails with the
fix otherwise. And its refusal of a kernel Ubuntu has no signed modules for (tasks/kernel.yml, issue 43)."""

import json

import pytest

from lab.k3s.test_roles_local import FakeK3sFolder

pytestmark = pytest.mark.slow
CANONICAL = "Canonical Ltd. Kernel Module Signing"


def _found(
    signer, sb_state, kernel="6.8.0-90-generic", series="generic", candidate="580.173.02-0ubuntu0.24.04.1"
):
    return {
        "gpu_count": 1,
        "gpus": [{"name": "NVIDIA GeForce RTX 5090"}],
        "uuids": ["GPU-0"],
        "driver_version": "580.173.02",
        "kernel": kernel,
        "kernel_series": {"series": series, "meta": f"linux-image-{series}" if series else None},
        "signed_modules": {
            "package": f"linux-modules-nvidia-580-server-open-{series}" if series else None,
            "candidate": candidate,
        },
        "module_signer": signer,
        "mokutil": {"rc": 0, "stdout": sb_state, "stderr": ""},
    }


def _role_task(tasks_from, found):
    return {
        "name": tasks_from,
        "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": tasks_from},
        "vars": {
            "nvidia_driver_signed_modules": True,
            "nvidia_driver_flavour": "server-open",
            "nvidia_driver_found": found,
            "nvidia_driver_packages": {"changed": False},
            "nvidia_driver_blacklist": {"changed": False},
        },
    }


@pytest.mark.parametrize(
    ("signer", "series", "refused"),
    [
        (CANONICAL, "generic", False),
        # the key newer kernels also trust (issue 43): accepted by the name's stable start
        (f"{CANONICAL} 2025 Kmod", "generic-hwe-24.04", False),
        ("ubuntu Secure Boot Module Signature key", "generic", True),
        (f"{CANONICAL}s of Somebody Else", "generic", True),
    ],
)
def test_the_signed_modules_proof(tmp_path, signer, series, refused):
    lab = FakeK3sFolder(tmp_path)
    rc, out = lab.play([_role_task("verify", _found(signer, "SecureBoot enabled\n", series=series))])
    assert (rc != 0) == refused, lab.failures(out)
    if refused:
        msg = lab.failures(out)[0]
        assert (
            f"signed by {signer}" in msg
            and f"linux-modules-nvidia-580-server-open-{series} is installed" in msg
        )
    else:
        assert f"nvidia module signed by {signer}" in json.dumps(out)


def test_a_kernel_without_signed_modules_is_refused_with_the_fix(tmp_path):
    lab = FakeK3sFolder(tmp_path)
    kvm = _found(CANONICAL, "SecureBoot enabled\n", kernel="6.8.0-1020-kvm", series="kvm", candidate=None)
    rc, out = lab.play([_role_task("kernel", kvm)])
    assert rc != 0
    msg = " ".join(lab.failures(out)[0].split())
    assert msg.startswith("vm-1 runs kernel 6.8.0-1020-kvm (series kvm, linux-image-kvm), and apt has no ")
    assert "linux-modules-nvidia-580-server-open-kvm: Ubuntu ships no Canonical-signed NVIDIA modules" in msg
    assert "(1) turn Secure Boot off for this VM (vm_efi_pre_enrolled_keys false, then the DKMS build)" in msg
    assert "the GA kernel (sudo apt install linux-generic, reboot into it)" in msg
    # the HWE kernel has them: nothing refused
    hwe = _found(CANONICAL, "SecureBoot enabled\n", kernel="6.17.0-14-generic", series="generic-hwe-24.04")
    rc, out = lab.play([_role_task("kernel", hwe)])
    assert rc == 0, lab.failures(out)
