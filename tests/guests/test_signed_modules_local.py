"""The nvidia_driver role's proof of Canonical's signed modules under Secure Boot (roles/nvidia_driver/tasks/
verify.yml, issue 31), run on this machine against the role's first read as a GPU guest would give it: it holds
when modinfo names Canonical's signing key and mokutil says Secure Boot is on, and fails with the fix otherwise."""

import pytest
from k3s.test_roles_local import FakeK3sFolder

pytestmark = pytest.mark.slow
CANONICAL = "Canonical Ltd. Kernel Module Signing"


@pytest.mark.parametrize(
    ("signer", "sb_state", "refused"),
    [
        (CANONICAL, "SecureBoot enabled\n", False),
        ("ubuntu Secure Boot Module Signature key", "SecureBoot enabled\n", True),
    ],
)
def test_the_signed_modules_proof(tmp_path, signer, sb_state, refused):
    lab = FakeK3sFolder(tmp_path)
    task = {
        "name": "verify",
        "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "verify"},
        "vars": {
            "nvidia_driver_signed_modules": True,
            "nvidia_driver_flavour": "server-open",
            "nvidia_driver_found": {
                "gpu_count": 1,
                "gpus": [{"name": "NVIDIA GeForce RTX 5090"}],
                "uuids": ["GPU-0"],
                "driver_version": "580.173.02",
                "kernel": "6.8.0-90-generic",
                "module_signer": signer,
                "mokutil": {"rc": 0, "stdout": sb_state, "stderr": ""},
            },
            "nvidia_driver_packages": {"changed": False},
            "nvidia_driver_blacklist": {"changed": False},
        },
    }
    rc, out = lab.play([task])
    assert (rc != 0) == refused, lab.failures(out)
    if refused:
        msg = lab.failures(out)[0]
        assert (
            f"signed by {signer}" in msg
            and "linux-modules-nvidia-580-server-open-generic is installed" in msg
        )
