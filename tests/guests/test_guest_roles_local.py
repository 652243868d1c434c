"""Logic of the guest roles that can run on this machine without changing it: the Secure Boot gate of
nvidia_driver (against a fake mokutil first on the PATH) and the package names the roles compute."""

import os

import pytest
from k3s.test_roles_local import ROOT, Lab

pytestmark = pytest.mark.slow


@pytest.fixture
def lab(tmp_path):
    return Lab(tmp_path)


@pytest.mark.parametrize(
    ("stdout", "stderr", "rc", "enrolled", "refused"),
    [
        ("SecureBoot enabled", "", 0, False, True),
        ("SecureBoot enabled", "", 0, True, False),
        ("SecureBoot disabled\\nPlatform is in Setup Mode", "", 0, False, False),
        ("", "EFI variables are not supported on this system", 1, False, False),
        ("", "This system doesn't support Secure Boot", 255, False, False),
    ],
)
def test_secure_boot_gate(lab, monkeypatch, stdout, stderr, rc, enrolled, refused):
    script = lab.root / "bin" / "mokutil"
    script.write_text(f'#!/bin/sh\nprintf "{stdout}\\n"\nprintf "{stderr}\\n" >&2\nexit {rc}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{lab.root / 'bin'}:{os.environ['PATH']}")
    task = {
        "name": "gate",
        "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "secure_boot"},
    }
    rc_play, out = lab.play([task], extra_vars={"nvidia_driver_secure_boot_mok_enrolled": enrolled})
    assert (rc_play != 0) == refused, lab.failures(out)
    if refused:
        msg = lab.failures(out)[0]
        assert "pre-enrolled-keys=0" in msg and "mokutil --import" in msg


@pytest.mark.parametrize(
    ("branch", "flavour", "package"),
    [
        (580, "server", "nvidia-driver-580-server"),
        ("580", "server-open", "nvidia-driver-580-server-open"),
        (570, "", "nvidia-driver-570"),
        (580, "open", "nvidia-driver-580-open"),
    ],
)
def test_driver_package_name(lab, branch, flavour, package):
    tasks = [
        {
            "name": "role vars",
            "ansible.builtin.include_vars": str(ROOT / "roles/nvidia_driver/vars/main.yml"),
        },
        {"name": "check", "ansible.builtin.assert": {"that": [f"nvidia_driver_package == '{package}'"]}},
    ]
    rc, out = lab.play(tasks, extra_vars={"nvidia_driver_branch": branch, "nvidia_driver_flavour": flavour})
    assert rc == 0, lab.failures(out)


@pytest.mark.parametrize(
    ("version", "packages"),
    [
        ("", ["nvidia-container-toolkit"]),
        (
            "1.18.1-1",
            [
                "nvidia-container-toolkit=1.18.1-1",
                "nvidia-container-toolkit-base=1.18.1-1",
                "libnvidia-container-tools=1.18.1-1",
                "libnvidia-container1=1.18.1-1",
            ],
        ),
    ],
)
def test_toolkit_packages_pinned_together(lab, version, packages):
    tasks = [
        {
            "name": "role vars",
            "ansible.builtin.include_vars": str(ROOT / "roles/nvidia_container_toolkit/vars/main.yml"),
        },
        {
            "name": "check",
            "ansible.builtin.assert": {"that": [f"nvidia_container_toolkit_packages == {packages}"]},
        },
    ]
    rc, out = lab.play(tasks, extra_vars={"nvidia_container_toolkit_version": version})
    assert rc == 0, lab.failures(out)
