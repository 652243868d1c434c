"""Logic of the guest roles that can run on this machine without changing it: the Secure Boot gate of
nvidia_driver (against a fake mokutil first on the PATH) and the package names the roles compute."""

import os

import pytest

from lab.k3s.test_roles_local import ROOT, FakeK3sFolder

pytestmark = pytest.mark.slow


@pytest.fixture
def lab(tmp_path):
    return FakeK3sFolder(tmp_path)


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


DRIVER_NAMES = [
    (580, "server", "nvidia-driver-580-server"),
    ("580", "server-open", "nvidia-driver-580-server-open"),
    (570, "", "nvidia-driver-570"),
    (580, "open", "nvidia-driver-580-open"),
]
TOOLKIT_PINS = [
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
]


def test_package_names(lab):
    """One play: each case templates the roles' vars/main.yml expressions with its own inputs."""
    driver_vars = str(ROOT / "roles/nvidia_driver/vars/main.yml")
    toolkit_vars = str(ROOT / "roles/nvidia_container_toolkit/vars/main.yml")
    tasks = [
        {"name": "driver vars", "ansible.builtin.include_vars": {"file": driver_vars, "name": "driver"}},
        {"name": "toolkit vars", "ansible.builtin.include_vars": {"file": toolkit_vars, "name": "toolkit"}},
    ]
    for branch, flavour, package in DRIVER_NAMES:
        tasks.append(
            {
                "name": f"driver {branch} {flavour}",
                "ansible.builtin.assert": {"that": [f"nvidia_driver_package == '{package}'"]},
                "vars": {
                    "nvidia_driver_branch": branch,
                    "nvidia_driver_flavour": flavour,
                    "nvidia_driver_package": "{{ driver.nvidia_driver_package }}",
                },
            }
        )
    for version, packages in TOOLKIT_PINS:
        tasks.append(
            {
                "name": f"toolkit {version}",
                "ansible.builtin.assert": {"that": [f"nvidia_container_toolkit_packages == {packages}"]},
                "vars": {
                    "nvidia_container_toolkit_version": version,
                    "nvidia_container_toolkit_package_names": "{{ toolkit.nvidia_container_toolkit_package_names }}",
                    "nvidia_container_toolkit_packages": "{{ toolkit.nvidia_container_toolkit_packages }}",
                },
            }
        )
    rc, out = lab.play(tasks)
    assert rc == 0, lab.failures(out)
    passed = [t for t in out["plays"][0]["tasks"] if t["hosts"]["vm-1"].get("msg") == "All assertions passed"]
    assert len(passed) == len(DRIVER_NAMES) + len(TOOLKIT_PINS)


@pytest.mark.parametrize(
    ("expected", "min_gpus", "refused"), [(2, 1, True), (1, 1, False), (0, 2, True), (0, 1, False)]
)
def test_the_driver_check_wants_every_card_passed_to_the_vm(lab, monkeypatch, expected, min_gpus, refused):
    """The fake nvidia-smi sees one card; playbooks/guests.yml gives the role the count of vm_gpu's cards."""
    monkeypatch.setenv("PATH", f"{lab.root / 'bin'}:{os.environ['PATH']}")
    task = {
        "name": "verify",
        "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "verify"},
        "vars": {
            "nvidia_driver_expected_gpus": expected,
            "nvidia_driver_min_gpus": min_gpus,
            # the role's first read, before the install: the one card the fake nvidia-smi shows
            "nvidia_driver_found": {
                "gpu_count": 1,
                "gpus": [{"name": "NVIDIA GeForce RTX 3090"}],
                "uuids": ["GPU-0"],
                "driver_version": "580.173.02",
            },
            "nvidia_driver_packages": {"changed": False},
            "nvidia_driver_blacklist": {"changed": False},
        },
    }
    rc, out = lab.play([task])
    assert (rc != 0) == refused, lab.failures(out)
    if refused:
        assert f"found 1 GPU(s), {max(expected, min_gpus)} wanted" in lab.failures(out)[0]
