"""A GPU VM that is a k3s server gets the GPU agent's prerequisites (issue 43): role k3s_server's gpu.yml, run on
this machine, refuses to start k3s on a GPU server whose driver sees no card or whose container toolkit is
missing (k3s looks for the nvidia runtime once, at start), naming what is missing and the run that installs it;
with both there it goes on."""

import pytest

from lab.k3s.test_roles_local import FakeK3sFolder

pytestmark = pytest.mark.slow

GPU_TASKS = {"name": "gpu", "ansible.builtin.include_role": {"name": "k3s_server", "tasks_from": "gpu"}}


def test_a_gpu_server_without_its_toolkit_is_refused_with_the_run_that_installs_it(tmp_path):
    lab = FakeK3sFolder(tmp_path)
    missing = str(tmp_path / "bin" / "nvidia-container-runtime")  # not there
    read = {
        "name": "the server's GPUs and toolkit",
        "gpulab.homelab.gpu_facts": {
            "nvidia_smi": str(tmp_path / "bin" / "nvidia-smi"),
            "container_runtime": missing,
        },
    }
    rc, out = lab.play([read, GPU_TASKS])
    assert rc != 0
    [msg] = lab.failures(out)
    msg = " ".join(msg.split())
    assert msg.startswith(
        "vm-1 is a GPU server but the NVIDIA container toolkit is missing (/usr/bin/nvidia-container-runtime)"
    ), msg
    assert (
        "site.yml --tags guests --limit vm-1" in msg
        and "k3s must start after the toolkit is installed" in msg
    )


def test_a_gpu_server_with_its_driver_and_toolkit_goes_on(tmp_path):
    lab = FakeK3sFolder(tmp_path)
    runtime = tmp_path / "bin" / "nvidia-container-runtime"
    runtime.write_text("#!/bin/sh\n")
    runtime.chmod(0o755)
    read = {
        "name": "the server's GPUs and toolkit",
        "gpulab.homelab.gpu_facts": {
            "nvidia_smi": str(tmp_path / "bin" / "nvidia-smi"),
            "container_runtime": str(runtime),
        },
    }
    rc, out = lab.play([read, GPU_TASKS])
    assert rc == 0, lab.failures(out)
