"""The k3s roles' input rules checked before any change (gpulab.k8s.install_inputs through gpulab.labdef.k3s_inputs):
the air-gap folder on the controller, and the join inputs a run gives with -e; and the roles assert the same rule
through the same function (their filters)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from gpulab import labdef
from gpulab.k8s import install_inputs

ROOT = pathlib.Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = pathlib.Path(sys.executable).parent / "ansible-playbook"


def _airgap(tmp_path, *files):
    folder = tmp_path / "airgap"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("#!/bin/sh\n")
    return folder


def test_preflight_refuses_an_airgap_folder_without_its_files(inv, tmp_path):
    missing = tmp_path / "nowhere"
    inv.globals.update(k3s_server_airgap=True, k3s_server_airgap_dir=str(missing))
    [msg] = inv.messages()
    assert msg.startswith(f"vm-1: k3s_server_airgap_dir='{missing}': no such folder on the controller. Fix: ")
    folder = _airgap(tmp_path, "k3s")
    inv.globals["k3s_server_airgap_dir"] = str(folder)
    [msg] = inv.messages()
    assert "the folder lacks install.sh" in msg and f"{folder}/install.sh" in msg
    (folder / "install.sh").write_text("#!/bin/sh\n")
    assert inv.messages() == []


def test_preflight_refuses_a_relative_airgap_folder_and_checks_the_agents_too(inv):
    inv.hosts["vm-2"].update(k3s_agent_airgap=True, k3s_agent_airgap_dir="airgap")
    [msg] = inv.messages()
    assert msg.startswith("vm-2: k3s_agent_airgap_dir='airgap': a relative path")
    # not air-gapped: the folder is not read
    inv.hosts["vm-2"]["k3s_agent_airgap"] = False
    assert inv.messages() == []


def test_the_plan_refuses_it_too(inv, tmp_path):
    # gpulab plan and preflight share labdef.check: the same problem, before any change
    inv.globals.update(k3s_agent_airgap=True, k3s_agent_airgap_dir=str(tmp_path / "nowhere"))
    _definition, problems = labdef.check(inv.groups, inv.hostvar, inv.names)
    assert [(p.host, p.field) for p in problems] == [("vm-2", "k3s_agent_airgap_dir")]


def test_preflight_refuses_join_inputs_given_with_e(inv):
    definition, problems = inv.check()
    assert problems == []
    msgs = [str(p) for p in labdef.check_extra_vars({"k3s_agent_server_url": "10.0.0.5:6443"}, definition)]
    assert msgs == [
        f"{h}: k3s_agent_server_url='10.0.0.5:6443': the agent registers through '10.0.0.5:6443', not an "
        "https:// URL. Fix: give the URL as https://ADDRESS:6443, or leave it to the playbook "
        "(k3s_registration_address)."
        for h in ("vm-2", "vm-gpu")
    ]
    assert labdef.check_extra_vars({"k3s_agent_server_url": "https://10.0.0.5:6443"}, definition) == []
    empty = [str(p) for p in labdef.check_extra_vars({"k3s_agent_token": ""}, definition)]
    assert len(empty) == 2 and all("the agent needs the cluster's token" in m for m in empty), empty


def test_preflight_refuses_a_server_that_would_both_start_and_join(inv):
    # three servers: embedded etcd, vm-1 starts the cluster (cluster-init) and the others join it
    inv.groups.update(k3s_server=["vm-1", "vm-2", "vm-gpu"], k3s_agent=[])
    definition, problems = inv.check()
    assert problems == [], problems
    msgs = [str(p) for p in labdef.check_extra_vars({"k3s_server_join_url": "https://x:6443"}, definition)]
    assert len(msgs) == 1 and msgs[0].startswith(
        "vm-1: k3s_server_join_url='https://x:6443': the server both"
    )


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook is not in this virtualenv")
@pytest.mark.parametrize(
    ("role", "role_vars", "problem"),
    [
        (
            "k3s_install",
            {
                "k3s_install_version": "v1.36.2+k3s1",
                "k3s_install_exec": "agent",
                "k3s_install_airgap": True,
                "k3s_install_airgap_dir": "/nope",
            },
            install_inputs.airgap_folder_problem("/nope"),
        ),
        (
            "k3s_agent",
            {
                "k3s_agent_version": "v1.36.2+k3s1",
                "k3s_agent_server_url": "10.0.0.5:6443",
                "k3s_agent_token": "t",
            },
            install_inputs.agent_join_problem("10.0.0.5:6443", "t", False),
        ),
        (
            "k3s_server",
            {
                "k3s_server_version": "v1.36.2+k3s1",
                "k3s_server_cluster_init": True,
                "k3s_server_join_url": "https://x",
            },
            install_inputs.server_join_problem(True, "https://x", "", False),
        ),
    ],
    ids=["k3s_install", "k3s_agent", "k3s_server"],
)
def test_the_roles_assert_the_same_rule(tmp_path, role, role_vars, problem):
    # each role stops at its first task with the message of the function preflight applies
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": f"gpulab.homelab.{role}"}, "vars": role_vars}]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_HOME": str(tmp_path / "home"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)
    assert done.returncode != 0
    assert problem is not None and install_inputs.message(problem) in " ".join(done.stdout.split()), (
        done.stdout
    )
