"""k3s_registries on lab hosts: roles k3s_server and k3s_agent write k3s' registries.yaml before k3s first starts
(the stand-in reads it at start, as k3s does), keep it, restart the unit when it changes and never show its
secrets; a registry over its pull limit stops stage workloads at its first look, and the mirror lets it pass.

Each host is a mount namespace of its own (labsim.net.mount_ns_host), as in test_k3s_roles_ns.
"""

import json
import time

import pytest
import yaml
from unit.k3s.conftest import free_port, recap

from labsim.net.k3s import registry

from .test_k3s_roles_ns import lab_agent_vars, lab_server_vars, play_on, wait_nodes
from .test_roles_local import CLUSTER, HAMI, WORKLOADS, FakeK3sFolder, engines

pytestmark = [pytest.mark.root, pytest.mark.slow]

SECRET = "Vault-S3cret-pw-9f2c"
MIRROR = "https://mirror.lan:5000"
REGISTRIES = {
    "mirrors": {"docker.io": {"endpoint": [MIRROR]}},
    "configs": {"mirror.lan:5000": {"auth": {"username": "lab", "password": SECRET}}},
}
STATE = "/var/lib/rancher/k3s/server/db/gpulab-state.json"


def state(server):
    return json.loads(server.upper(STATE).read_text())


def test_registries_yaml_before_k3s_starts_and_pulls_through_the_mirror(nshosts, tmp_path):
    port = free_port()
    server = nshosts("vm-1", airgap=True)
    # Docker Hub gives the lab's address no anonymous pull (the registry knob of the stand-in's cluster, on the server)
    server.put(registry.KNOB, json.dumps({"registry-1.docker.io": {"limit": 0}}))
    server_vars = lab_server_vars("vm-1", port, k3s_server_registries=REGISTRIES)

    # (1) written with its content and mode before k3s first started: the node registered with it, no restart but
    # the install's own; the secret is in no output, -v and --diff included
    first = server.play("k3s_server", server_vars, "--diff")
    assert recap(first)["failed"] == 0, first.stdout[-4000:]
    path = server.upper("/etc/rancher/k3s/registries.yaml")
    assert yaml.safe_load(path.read_text()) == REGISTRIES
    assert oct(path.stat().st_mode & 0o777) == "0o600" and path.stat().st_uid == 0
    assert server.systemctl_calls().count(["restart", "k3s"]) == 1
    assert wait_nodes(server, ["vm-1"]) and state(server)["nodes"]["vm-1"]["registries"] == REGISTRIES
    assert SECRET not in first.stdout + first.stderr
    again = server.play("k3s_server", server_vars, "--diff")
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]
    assert server.systemctl_calls().count(["restart", "k3s"]) == 1

    # a change: --check --diff writes nothing and shows no secret; for real, k3s restarts and reads it
    rewritten = {
        **REGISTRIES,
        "mirrors": {"docker.io": {"endpoint": [MIRROR], "rewrite": {"^rancher/(.*)": "r/$1"}}},
    }
    changed_vars = {**server_vars, "k3s_server_registries": rewritten}
    check = server.play("k3s_server", changed_vars, "--check", "--diff")
    assert recap(check)["changed"] > 0 and recap(check)["failed"] == 0, check.stdout[-4000:]
    assert yaml.safe_load(path.read_text()) == REGISTRIES and SECRET not in check.stdout + check.stderr
    apply = server.play("k3s_server", changed_vars, "--diff")
    assert recap(apply)["failed"] == 0 and SECRET not in apply.stdout + apply.stderr, apply.stdout[-4000:]
    assert server.systemctl_calls().count(["restart", "k3s"]) == 2
    assert yaml.safe_load(path.read_text()) == rewritten

    # (3) a GPU agent without a mirror: the engine's image is refused 429 by Docker Hub, and stage workloads stops
    # at its first look, naming the pod, the image, the kubelet's reason and the fix
    token = server.upper("/var/lib/rancher/k3s/server/token").read_text().strip()
    agent_vars = lab_agent_vars(token, f"https://127.0.0.1:{port}")
    gpu = nshosts("vm-gpu", gpu=True, toolkit=True, airgap=True)
    assert recap(gpu.play("k3s_agent", agent_vars))["failed"] == 0
    assert not gpu.upper("/etc/rancher/k3s/registries.yaml").exists()
    wait_nodes(server, ["vm-1", "vm-gpu"])
    (tmp_path / "controller").mkdir()
    lab = FakeK3sFolder(tmp_path / "controller")
    where = {"bin": "/usr/local/bin", "manifests": "/var/lib/rancher/k3s/server/manifests"}
    cluster = {**CLUSTER, "vars": {**CLUSTER["vars"], "k3s_server_ready_timeout": 30,
                                   "k3s_server_expected_nodes": ["vm-1", "vm-gpu"]}}  # fmt: skip
    hami = {**HAMI, "vars": {**HAMI["vars"], "hami_ready_timeout": 120, "hami_poll_interval": 2}}
    rc, out = play_on(server, lab, [cluster, hami], where)
    assert rc == 0, lab.failures(out)
    pytest.importorskip(
        "kubernetes_validate", reason="manifest validation needs the kubernetes-validate package"
    )
    plan = {**where, "workloads_engines": engines(45, 30), "workloads_poll_interval": 2}
    started = time.monotonic()
    rc, out = play_on(server, lab, [WORKLOADS], plan)
    assert rc != 0 and time.monotonic() - started < 60
    msg = lab.failures(out)[-1]
    assert msg.startswith("Engine default/e0 cannot start: [1] vm-gpu: pod default/e0-"), msg
    assert (
        "image = vllm/vllm-openai:v0.11.0" in msg
        and "429 Too Many Requests" in msg
        and "toomanyrequests" in msg
    )
    assert "k3s_registries" in msg and "hami_image_registry" in msg
    refused = [p for p in state(server)["pulls"] if p["node"] == "vm-gpu"]
    assert {(p["endpoint"], p["status"]) for p in refused} == {("https://registry-1.docker.io", 429)}

    # (4) the mirror in k3s_registries: written, the agent restarted, the pull goes to the mirror, the stage passes
    mirrored = gpu.play("k3s_agent", {**agent_vars, "k3s_agent_registries": REGISTRIES}, "--diff")
    assert recap(mirrored)["failed"] == 0 and SECRET not in mirrored.stdout + mirrored.stderr
    assert gpu.systemctl_calls().count(["restart", "k3s-agent"]) == 2  # the install's, and this change's
    assert oct(gpu.upper("/etc/rancher/k3s/registries.yaml").stat().st_mode & 0o777) == "0o600"
    rc, out = play_on(server, lab, [WORKLOADS], plan)
    assert rc == 0, lab.failures(out)
    pulled = [p for p in state(server)["pulls"] if p["node"] == "vm-gpu" and p["status"] == 200]
    assert "vllm/vllm-openai:v0.11.0" in [p["image"] for p in pulled]
    assert {p["endpoint"] for p in pulled} == {MIRROR}
