"""The k3s-side roles' logic run for real by ansible-playbook on this machine, against a fake `k3s` binary.

The fake answers the kubectl calls the roles make (`get nodes -o json`, `get daemonsets`, `get nodes,runtimeclass`,
`label`, `wait`, `rollout status`) from JSON files in a folder and logs every call, so the tests see what the
roles asked, in which order, and what they concluded. The roles run unchanged: only their documented
variables (k3s bin dir, manifests dir) point into a temporary folder.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

# Each test runs ansible-playbook once or more (a few seconds each).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = pathlib.Path(sys.executable).parent / "ansible-playbook"

UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
GPU_FACTS = [{"index": 0, "uuid": UUID0, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576}]

FAKE_K3S = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    # Fake k3s: answers kubectl calls from JSON files in STATE and logs each call.
    import json, os, pathlib, sys
    state = pathlib.Path(__file__).resolve().parent.parent / "state"
    args = sys.argv[1:]
    manifests = sorted(p.name for p in (state.parent / "manifests").glob("*.yaml"))
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps({"args": args, "manifests": manifests}) + "\\n")
    if args[:1] != ["kubectl"]:
        sys.exit(2)
    a = args[1:]
    if a[:2] == ["get", "nodes"]:
        print((state / "nodes.json").read_text())
    elif a[:2] == ["get", "nodes,runtimeclass"]:
        # one List of both kinds, as kubectl prints it; k3s' RuntimeClass nvidia unless file no-runtimeclass
        items = json.loads((state / "nodes.json").read_text())["items"]
        if not (state / "no-runtimeclass").exists():
            items.append({"kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
        print(json.dumps({"kind": "List", "items": items}))
    elif a[:1] == ["create"] and "--dry-run=server" in a:
        # HAMi's webhook: the scheduler it writes into a GPU pod (file webhook-scheduler), hami-scheduler by default
        path = state / "webhook-scheduler"
        sys.stdout.write(path.read_text() if path.exists() else "hami-scheduler")
    elif a[2:4] == ["get", "pods"] and (state / "pods.json").exists():
        print((state / "pods.json").read_text())
    elif a[2:4] == ["get", "pods"] and (state / "pulls.json").exists():
        print((state / "pulls.json").read_text())
    elif a[2:4] == ["get", "pods"] and "-l" not in a:
        print(json.dumps({"items": []}))
    elif a[2:4] == ["get", "pods"]:
        name = a[a.index("-l") + 1].split("=", 1)[1]
        path = state / "pod-scheduler"
        scheduler = path.read_text() if path.exists() else "hami-scheduler"
        pod = {"metadata": {"name": name + "-0"}, "spec": {"schedulerName": scheduler}}
        print(json.dumps({"items": [pod]}))
    elif a[2:4] == ["get", "endpointslices"]:
        # the webhook Service's EndpointSlices: file endpointslices.json, else one ready endpoint
        path = state / "endpointslices.json"
        ready = {"items": [{"endpoints": [{"addresses": ["10.42.0.9"], "conditions": {"ready": True}}]}]}
        print(path.read_text() if path.exists() else json.dumps(ready))
    elif a[:2] == ["get", "mutatingwebhookconfigurations"]:
        hook = {"name": "vgpu.hami.io", "failurePolicy": "Ignore",
                "clientConfig": {"service": {"name": "hami-scheduler", "namespace": "kube-system", "port": 443}}}
        print(json.dumps({"items": [{"metadata": {"name": "hami-webhook"}, "webhooks": [hook]}]}))
    elif a[:2] == ["get", "deployment"] or a[2:4] == ["get", "deployment"]:
        print((state / "deployment.json").read_text())
    elif a[:2] == ["get", "daemonsets"]:
        print((state / "daemonsets.json").read_text())
    elif a[:3] == ["get", "runtimeclass", "nvidia"]:
        sys.stdout.write("nvidia")
    elif a[:1] == ["label"]:
        print("node/%s labeled" % a[2])
    elif a[2:4] == ["delete", "secret"]:
        print('secret "%s" deleted' % a[4])
    elif "wait" in a or "rollout" in a:
        if (state / "not-ready").exists():
            sys.stderr.write("error: timed out waiting for the condition\\n")
            sys.exit(1)
        print("ok")
    else:
        sys.exit(3)
    """
)


# ansible-core ships no JSON output callback: this one collects each task result and the recap, and prints
# them as one JSON document at the end, in the shape of ansible.posix.json (plays > tasks > hosts, stats).
JSON_CALLBACK = textwrap.dedent(
    """\
    import json
    from ansible.plugins.callback import CallbackBase

    class CallbackModule(CallbackBase):
        CALLBACK_VERSION = 2.0
        CALLBACK_TYPE = "stdout"
        CALLBACK_NAME = "gpulab_test_json"

        def __init__(self):
            super().__init__()
            self.tasks = []

        def _add(self, result, **extra):
            data = dict(result._result)
            data.update(extra)
            self.tasks.append({"task": result._task.get_name(), "hosts": {result._host.get_name(): data}})

        def v2_runner_on_ok(self, result):
            self._add(result)

        def v2_runner_on_failed(self, result, ignore_errors=False):
            self._add(result, failed=not ignore_errors)

        def v2_runner_on_skipped(self, result):
            self._add(result, skipped=True)

        def v2_runner_on_unreachable(self, result):
            self._add(result, failed=True, unreachable=True)

        def v2_playbook_on_stats(self, stats):
            recap = {h: stats.summarize(h) for h in sorted(stats.processed)}
            print(json.dumps({"plays": [{"tasks": self.tasks}], "stats": recap}, default=str))
    """
)


def register(cards=GPU_FACTS, split=10):
    """hami.io/node-nvidia-register as HAMi's device plugin writes it (guest-stack.md 6.2)."""
    return json.dumps(
        [
            {
                "id": g["uuid"],
                "count": split,
                "devmem": g["memory_total_mib"],
                "devcore": 100,
                "type": g["name"],
            }
            | ({"index": g["index"]} if g["index"] else {})
            | {"mode": "hami-core", "health": True}
            for g in cards
        ]
    )


def node(name, ready=True, labels=None, gpus=None, annotations=None, version="v1.33.5+k3s1"):
    if name == "vm-1":
        labels = {"node-role.kubernetes.io/control-plane": "true", **(labels or {})}
    if gpus is not None and annotations is None:
        annotations = {"hami.io/node-nvidia-register": register()}
    status = {
        "conditions": [
            {"type": "MemoryPressure", "status": "False"},
            {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"},
        ],
        "allocatable": {"cpu": "8", "memory": "16318796Ki", "pods": "110"},
        "nodeInfo": {"kubeletVersion": version},
    }
    if gpus is not None:
        status["allocatable"]["nvidia.com/gpu"] = str(gpus)
    meta = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    return {"kind": "Node", "metadata": meta, "status": status}


def scheduler(tag="v1.33.5"):
    """HAMi's scheduler Deployment with its kube-scheduler image."""
    containers = [
        {"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:{tag}"},
        {"name": "vgpu-scheduler-extender", "image": "docker.io/projecthami/hami:v2.10.0"},
    ]
    meta = {"name": "hami-scheduler", "namespace": "kube-system"}
    return {
        "kind": "Deployment",
        "metadata": meta,
        "spec": {"template": {"spec": {"containers": containers}}},
    }


class FakeK3sFolder:
    """A temporary folder with the fake k3s, its state, a manifests folder and an inventory."""

    def __init__(self, root):
        self.root = root
        (root / "bin").mkdir()
        (root / "state").mkdir()
        (root / "manifests").mkdir()
        (root / "callbacks").mkdir()
        (root / "callbacks" / "gpulab_test_json.py").write_text(JSON_CALLBACK)
        smi = root / "bin" / "nvidia-smi"
        lines = "".join(
            f"{g['uuid']}, {g['name']}, {g['memory_total_mib']}, 580.173.02, 00000000:0{g['index'] + 1}:00.0\\n"
            for g in GPU_FACTS
        )
        smi.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
        smi.chmod(0o755)
        k3s = root / "bin" / "k3s"
        k3s.write_text(FAKE_K3S)
        k3s.chmod(0o755)
        self.nodes([])
        self.daemonsets([])
        self.scheduler(scheduler())
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        inventory = {
            "all": {
                "children": {
                    "k3s_cluster": {
                        "children": {
                            "k3s_server": {"hosts": {"vm-1": local}},
                            "k3s_agent": {
                                "hosts": {
                                    "vm-2": local,
                                    "vm-gpu": {**local, "vm_gpu": "rtx3090"},
                                }
                            },
                        }
                    }
                }
            }
        }
        (root / "hosts.yml").write_text(yaml.safe_dump(inventory))

    def nodes(self, items):
        (self.root / "state" / "nodes.json").write_text(json.dumps({"kind": "List", "items": items}))

    def scheduler(self, deployment):
        (self.root / "state" / "deployment.json").write_text(json.dumps(deployment))

    def daemonsets(self, items):
        (self.root / "state" / "daemonsets.json").write_text(json.dumps({"kind": "List", "items": items}))

    def calls(self):
        path = self.root / "state" / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def write_play(self, tasks) -> pathlib.Path:
        """The test playbook on vm-1: the GPU node's facts from the module itself, as in the stages
        (delegated, facts kept on vm-gpu), then `tasks`."""
        facts = {
            "name": "GPU facts of vm-gpu",
            "gpulab.homelab.gpu_facts": {"nvidia_smi": str(self.root / "bin" / "nvidia-smi")},
            "delegate_to": "vm-gpu",
            "delegate_facts": True,
        }
        playbook = [{"name": "test", "hosts": "vm-1", "gather_facts": False, "tasks": [facts, *tasks]}]
        path = self.root / "play.yml"
        path.write_text(yaml.safe_dump(playbook, sort_keys=False))
        return path

    @staticmethod
    def result(proc):
        """(rc, the JSON callback's output) of an ansible-playbook run."""
        try:
            return proc.returncode, json.loads(proc.stdout)
        except json.JSONDecodeError:
            pytest.fail(
                f"ansible-playbook printed no JSON: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )

    def play(self, tasks, *, check=False, extra_vars=None):
        path = self.write_play(tasks)
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LIBRARY": str(ROOT / "plugins" / "modules"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_STDOUT_CALLBACK": "gpulab_test_json",
            "ANSIBLE_CALLBACK_PLUGINS": str(self.root / "callbacks"),
            "ANSIBLE_LOCAL_TEMP": str(self.root / "tmp"),
            "ANSIBLE_HOME": str(self.root / "ansible-home"),
            "ANSIBLE_FORCE_COLOR": "0",
        }
        cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(self.root / "hosts.yml"), str(path)]
        if check:
            cmd.append("--check")
        all_vars = {
            "bin": str(self.root / "bin"),
            "manifests": str(self.root / "manifests"),
            **(extra_vars or {}),
        }
        cmd += ["-e", json.dumps(all_vars)]
        return self.result(
            subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
        )

    @staticmethod
    def failures(out):
        msgs = []
        for play in out["plays"]:
            for task in play["tasks"]:
                for result in task["hosts"].values():
                    if result.get("failed"):
                        msgs.append(result.get("msg", ""))
        return msgs


@pytest.fixture
def lab(tmp_path):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"{ANSIBLE_PLAYBOOK} is missing (run inside the project's virtualenv)")
    return FakeK3sFolder(tmp_path)


def stats(out):
    return out["stats"]["vm-1"]


def include_role(role, tasks_from=None, **role_vars):
    """A task that includes `role` (its tasks file `tasks_from`, if given), named after what it runs, with
    `role_vars` under the role's prefix (ready_timeout is hami_ready_timeout for role hami)."""
    included = {"name": role, **({"tasks_from": tasks_from} if tasks_from else {})}
    return {
        "name": tasks_from or role,
        "ansible.builtin.include_role": included,
        "vars": {f"{role}_{name}": value for name, value in role_vars.items()},
    }


#: the fake lab's k3s binary and manifests folders and its GPU host, as the HAMi and workloads roles take them
ON_THE_FAKE = {"k3s_bin_dir": "{{ bin }}", "manifests_dir": "{{ manifests }}", "gpu_hosts": ["vm-gpu"]}
#: every wait of the roles as short as it goes (1 s, polled each second)
NO_WAIT = {"ready_timeout": 1, "poll_interval": 1}

CLUSTER = include_role(
    "k3s_server",
    "cluster",
    bin_dir="{{ bin }}",
    expected_nodes=["vm-1", "vm-2", "vm-gpu"],
    gpu_nodes=["vm-gpu"],
    **NO_WAIT,
)


def test_cluster_labels_a_gpu_node_once_and_checks_the_runtimeclass(lab):
    lab.nodes([node("vm-1"), node("vm-2"), node("vm-gpu")])
    rc, out = lab.play([CLUSTER])
    assert rc == 0, lab.failures(out)
    labels = [c["args"] for c in lab.calls() if c["args"][1] == "label"]
    assert labels == [["kubectl", "label", "node", "vm-gpu", "gpu=on", "--overwrite"]]
    # one read for the nodes and the RuntimeClass
    assert [c["args"][1:3] for c in lab.calls() if c["args"][1] == "get"] == [["get", "nodes,runtimeclass"]]
    assert stats(out)["changed"] == 1

    # The node now carries the label: nothing to do, nothing changed.
    lab.nodes([node("vm-1"), node("vm-2"), node("vm-gpu", labels={"gpu": "on"})])
    rc, out = lab.play([CLUSTER])
    assert rc == 0 and stats(out)["changed"] == 0


def test_cluster_waits_and_names_the_node_that_is_not_ready(lab):
    lab.nodes([node("vm-1"), node("vm-2", ready=False), node("vm-gpu", labels={"gpu": "on"})])
    rc, out = lab.play([CLUSTER])
    assert rc != 0
    (msg,) = lab.failures(out)
    assert "Not Ready" in msg and "vm-2" in msg and "vm-gpu" not in msg.split("(")[0]
    gets = [c for c in lab.calls() if c["args"][1:3] == ["get", "nodes,runtimeclass"]]
    assert len(gets) >= 2  # it retried before giving up


def test_cluster_waits_for_the_runtimeclass_and_says_it_is_missing(lab):
    lab.nodes([node("vm-1"), node("vm-2"), node("vm-gpu", labels={"gpu": "on"})])
    (lab.root / "state" / "no-runtimeclass").write_text("")
    rc, out = lab.play([CLUSTER])
    assert rc != 0
    (msg,) = lab.failures(out)
    assert "RuntimeClass nvidia is missing after 1 s" in msg and "Not Ready" not in msg
    assert len([c for c in lab.calls() if c["args"][1:3] == ["get", "nodes,runtimeclass"]]) >= 2


def test_cluster_notices_a_node_that_never_registered(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"})])
    rc, out = lab.play([CLUSTER])
    assert rc != 0 and "vm-2" in lab.failures(out)[0]


HAMI = include_role("hami", **ON_THE_FAKE, **NO_WAIT)


def device_plugin(name, image, namespace="kube-system"):
    container = {"name": "p", "image": image}
    return {
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }


def test_hami_installs_once_and_verifies_allocatable(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10)])
    lab.daemonsets([device_plugin("hami-device-plugin", "docker.io/projecthami/hami:v2.10.0")])
    rc, out = lab.play([HAMI], check=True)
    assert rc == 0, lab.failures(out)
    assert not (lab.root / "manifests" / "hami.yaml").exists()  # --check wrote nothing

    rc, out = lab.play([HAMI])
    assert rc == 0, lab.failures(out)
    chart = yaml.safe_load((lab.root / "manifests" / "hami.yaml").read_text())
    assert chart["kind"] == "HelmChart" and chart["spec"]["version"] == "2.10.0"
    values = yaml.safe_load(chart["spec"]["valuesContent"])
    assert values["devicePlugin"]["nvidiaNodeSelector"] == {"gpu": "on"}
    assert stats(out)["changed"] == 1
    waits = [" ".join(c["args"]) for c in lab.calls() if "wait" in c["args"] or "rollout" in c["args"]]
    assert any("job/helm-install-hami" in w for w in waits)
    assert any("daemonset/hami-device-plugin" in w for w in waits)

    rc, out = lab.play([HAMI])
    assert rc == 0 and stats(out)["changed"] == 0


def test_hami_refuses_beside_the_nvidia_device_plugin(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10)])
    lab.daemonsets(
        [device_plugin("nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0")]
    )
    rc, out = lab.play([HAMI])
    assert rc != 0
    assert "kube-system/nvidia-device-plugin-daemonset" in lab.failures(out)[0]
    assert not (lab.root / "manifests" / "hami.yaml").exists()


def test_hami_refuses_an_unknown_chart_key(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10)])
    task = {
        **HAMI,
        "vars": {**HAMI["vars"], "hami_extra_values": {"scheduler": {"kubeScheduler": {"imageTag": "x"}}}},
    }
    rc, out = lab.play([task])
    assert rc != 0 and "scheduler.kubeScheduler.image.tag" in lab.failures(out)[0]
    assert not (lab.root / "manifests" / "hami.yaml").exists()


def test_hami_names_what_is_not_ready_and_reads_no_nodes_before(lab):
    # The install job never completes: the one call per look stops before listing the nodes.
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10)])
    (lab.root / "state" / "not-ready").write_text("")
    rc, out = lab.play([HAMI])
    assert rc != 0
    msg = lab.failures(out)[0]
    assert "HAMi is not ready after 1 s (kubectl: error: timed out waiting for the condition)" in msg
    assert not [c for c in lab.calls() if c["args"][1:3] == ["get", "nodes"]]


def test_hami_reports_the_wrong_allocatable(lab):
    # The node still shows the physical count (another plugin, or HAMi not registered): 1, not 1 x 10.
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=1)])
    rc, out = lab.play([HAMI])
    assert rc != 0
    msg = lab.failures(out)[0]
    assert "vm-gpu: allocatable nvidia.com/gpu = 1: node vm-gpu offers 1 nvidia.com/gpu, expected 10" in msg


def hami_fails_at_once(lab):
    """Stage hami on the fake cluster with a ready timeout of 60 s: (its message, the number of looks)."""
    task = {**HAMI, "vars": {**HAMI["vars"], "hami_ready_timeout": 60}}
    rc, out = lab.play([task])
    assert rc != 0
    looks = [c for c in lab.calls() if c["args"][1:3] == ["get", "nodes"]]
    return lab.failures(out)[0], len(looks)


def test_hami_stops_at_once_on_a_node_without_the_gpu_label(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={}, gpus=0, annotations={})])
    msg, looks = hami_fails_at_once(lab)
    assert "vm-gpu: label gpu = (none): node vm-gpu does not carry the label gpu=on (no such label)" in msg
    assert "k3s kubectl label node vm-gpu gpu=on --overwrite" in msg
    assert looks == 1, "a missing label is not waited for"


def test_hami_stops_on_a_registered_card_that_is_not_the_guests(lab):
    other = [dict(GPU_FACTS[0], uuid="GPU-00000000-1111-2222-3333-444444444444")]
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10,
                                   annotations={"hami.io/node-nvidia-register": register(other)})])  # fmt: skip
    msg, looks = hami_fails_at_once(lab)
    assert f"the guest's nvidia-smi reports card {UUID0} (NVIDIA GeForce RTX 3090), which HAMi did not" in msg
    assert (
        "GPU-00000000-1111-2222-3333-444444444444" in msg and "restart HAMi's device plugin on vm-gpu" in msg
    )
    assert looks == 1


def test_hami_stops_on_registered_memory_that_is_not_the_cards(lab):
    smaller = [dict(GPU_FACTS[0], memory_total_mib=16384)]
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10,
                                   annotations={"hami.io/node-nvidia-register": register(smaller)})])  # fmt: skip
    msg, _ = hami_fails_at_once(lab)
    assert f"HAMi registered card {UUID0} on node vm-gpu with 16384 MiB, but the guest's nvidia-smi" in msg


def test_hami_waits_for_the_register_annotation_then_names_it(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10, annotations={})])
    rc, out = lab.play([HAMI])
    assert rc != 0
    assert "has not registered the cards of node vm-gpu" in lab.failures(out)[0]


def test_hami_stops_on_a_kube_scheduler_tag_that_is_not_the_servers_version(lab):
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=10)])
    lab.scheduler(scheduler(tag="v1.36.2"))
    msg, _ = hami_fails_at_once(lab)
    assert "runs kube-scheduler registry.k8s.io/kube-scheduler:v1.36.2, but the server is Kubernetes" in msg
    assert "set hami_kube_scheduler_image.tag to 'v1.33.5'" in msg


WORKLOADS = include_role("workloads", **ON_THE_FAKE, k3s_version="v1.33.5+k3s1")


def engines(*shares):
    return [
        {
            "name": f"e{i}",
            "image": "vllm/vllm-openai:v0.11.0",
            "node": "vm-gpu",
            "gpus": [0],
            "gpu_memory_percent": share,
            "cuda_disable_control": True,
            "port": 8000,
            "readiness_path": "/health",
        }
        for i, share in enumerate(shares)
    ]


def test_engines_sharing_a_card_start_one_after_the_other(lab):
    pytest.importorskip(
        "kubernetes_validate", reason="manifest validation needs the kubernetes-validate package"
    )
    rc, out = lab.play([WORKLOADS], extra_vars={"workloads_engines": engines(45, 30, 20)})
    assert rc == 0, lab.failures(out)
    rollouts = [c for c in lab.calls() if "rollout" in c["args"]]
    # e0 and e1 are waited for (a later engine shares their card); e2 is the last one.
    assert [c["args"][-2] for c in rollouts] == ["deployment/e0", "deployment/e1"]
    # When e0 was checked, e1's manifest was not placed yet; when e1 was, e2's was not.
    assert rollouts[0]["manifests"] == ["gpulab-workload-default-e0.yaml"]
    assert rollouts[1]["manifests"] == ["gpulab-workload-default-e0.yaml", "gpulab-workload-default-e1.yaml"]
    deployment = next(
        yaml.safe_load_all((lab.root / "manifests" / "gpulab-workload-default-e0.yaml").read_text())
    )
    assert deployment["spec"]["template"]["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == UUID0
    assert stats(out)["changed"] == 3

    rc, out = lab.play([WORKLOADS], extra_vars={"workloads_engines": engines(45, 30, 20)})
    assert rc == 0 and stats(out)["changed"] == 0


def test_the_token_secret_goes_when_no_engine_reads_it(lab):
    """A run that placed the Hugging Face token Secret for an engine with hf_token, then a run where no engine
    reads it (hf_token taken off, workloads_hf_token emptied): the Secret is deleted from the cluster (k3s deletes
    nothing when a manifest file goes) and its file removed; --check says so first and changes nothing; the next
    run finds nothing to take out."""
    secret = lab.root / "manifests" / "gpulab-hf-token-default.yaml"
    gated = [dict(engines(45)[0], hf_token=True)]
    rc, out = lab.play([WORKLOADS], extra_vars={"workloads_engines": gated, "workloads_hf_token": "hf_x"})
    assert rc == 0 and secret.exists(), lab.failures(out)
    assert "hf_x" not in out

    plain = {"workloads_engines": engines(45), "workloads_hf_token": ""}
    rc, out = lab.play([WORKLOADS], check=True, extra_vars=plain)
    assert rc == 0 and secret.exists() and stats(out)["changed"] >= 1, lab.failures(out)
    assert not [c for c in lab.calls() if "secret" in c["args"]]

    rc, out = lab.play([WORKLOADS], extra_vars=plain)
    assert rc == 0, lab.failures(out)
    assert not secret.exists()
    deletes = [c["args"] for c in lab.calls() if "secret" in c["args"]]
    assert deletes == [
        ["kubectl", "-n", "default", "delete", "secret", "gpulab-hf-token", "--ignore-not-found"]
    ]
    # the engine's manifest (no HF_TOKEN now), the Secret deleted, its file removed
    assert stats(out)["changed"] == 3

    rc, out = lab.play([WORKLOADS], extra_vars=plain)
    assert rc == 0 and stats(out)["changed"] == 0, lab.failures(out)
    assert len([c for c in lab.calls() if "secret" in c["args"]]) == 1


def test_a_plan_above_100_percent_applies_nothing(lab):
    rc, out = lab.play([WORKLOADS], extra_vars={"workloads_engines": engines(45, 60)})
    assert rc != 0 and "105%" in lab.failures(out)[0]
    assert list((lab.root / "manifests").iterdir()) == []


def test_workloads_check_mode_places_nothing(lab):
    rc, out = lab.play([WORKLOADS], check=True, extra_vars={"workloads_engines": engines(45, 30)})
    assert rc == 0, lab.failures(out)
    assert list((lab.root / "manifests").iterdir()) == []
    assert not [c for c in lab.calls() if "rollout" in c["args"]]


def test_workloads_wait_for_hamis_webhook_and_place_nothing_while_it_fails_open(lab):
    (lab.root / "state" / "webhook-scheduler").write_text("default-scheduler")
    deployment = scheduler()
    deployment["spec"]["replicas"] = 0
    lab.scheduler(deployment)
    extra = {"workloads_engines": engines(45), "workloads_webhook_timeout": 3}
    rc, out = lab.play([WORKLOADS], extra_vars=extra)
    assert rc != 0
    msg = lab.failures(out)[0]
    assert (
        "a server dry run of a one-vGPU pod in namespace default got schedulerName default-scheduler" in msg
    )
    assert (
        "webhook vgpu.hami.io of hami-webhook: failurePolicy Ignore, service kube-system/hami-scheduler:443"
        in msg
    )
    assert "has 0 of 0 replica(s) ready" in msg and "scale deployment/hami-scheduler --replicas=1" in msg
    assert "UnexpectedAdmissionError" in msg and "delete pods" not in msg  # nothing was made to delete
    assert list((lab.root / "manifests").iterdir()) == [], "no GPU pod before the webhook answers"


def around_pod(name, **status):
    return {"metadata": {"namespace": "default", "name": name}, "spec": {"schedulerName": "default-scheduler",
            **({"nodeName": "vm-gpu"} if status.get("phase") == "Failed" else {})}, "status": status}  # fmt: skip


def test_workloads_stop_on_an_engine_pod_that_went_around_hami(lab):
    # as a cluster shows it: the kubelet rejected the pods default-scheduler bound (HAMi's device plugin found no
    # pod bound by HAMi) and the ReplicaSet made new ones; the webhook's Service has no ready endpoint
    rejected = (
        "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = no binding pod found on node "
        "vm-gpu, which is unexpected"
    )
    pods = [around_pod(f"e0-{i}", phase="Failed", reason="UnexpectedAdmissionError", message=rejected)
            for i in range(2)] + [around_pod("e0-2", phase="Pending")]  # fmt: skip
    (lab.root / "state" / "pods.json").write_text(json.dumps({"items": pods}))
    (lab.root / "state" / "endpointslices.json").write_text(json.dumps({"items": [{"endpoints": None}]}))
    rc, out = lab.play([WORKLOADS], extra_vars={"workloads_engines": engines(45)})
    assert rc != 0
    msg = lab.failures(out)[0]
    assert "Engine default/e0 has pods that went around HAMi" in msg
    assert (
        "2 pod(s) were bound by default-scheduler and rejected by the kubelet (UnexpectedAdmissionError"
        in msg
    )
    assert "again and again" in msg and "1 pod(s) are Pending under default-scheduler" in msg
    assert "default/e0-0 (schedulerName default-scheduler) was bound to vm-gpu and then rejected" in msg
    assert "no binding pod found on node vm-gpu" in msg
    assert "its Service kube-system/hami-scheduler has 0 ready endpoint(s)" in msg
    assert (
        "delete pods -l app.kubernetes.io/name=e0 --field-selector spec.schedulerName!=hami-scheduler" in msg
    )
    assert msg.index("get the webhook answering") < msg.index("delete pods -l")
    assert not [c for c in lab.calls() if "rollout" in c["args"]], "not waited for"


# containerd's answer to a manifest GET over Docker Hub's anonymous limit, as the kubelet shows it (ErrImagePull's
# message is the runtime's error; the back-off that follows names it again): library/labsim/UPSTREAM.md k3s.pull.*
TOO_MANY = (
    'rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/projecthami/hami:v2.10.0": '
    "failed to copy: httpReadSeeker: failed open: unexpected status code "
    "https://registry-1.docker.io/v2/projecthami/hami/manifests/sha256:0f: 429 Too Many Requests - Server message: "
    "toomanyrequests: You have reached your unauthenticated pull rate limit. https://www.docker.com/increase-rate-limit"
)


def pull_pod(name, image, reason="ImagePullBackOff", namespace="kube-system", labels=None):
    """A pod whose container waits for an image the kubelet cannot pull (reason and message as the kubelet sets)."""
    message = (
        TOO_MANY
        if reason == "ErrImagePull"
        else f'Back-off pulling image "{image}": ErrImagePull: {TOO_MANY}'
    )
    status = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "main",
                "ready": False,
                "image": image,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }
    spec = {
        "schedulerName": "hami-scheduler",
        "nodeName": "vm-gpu",
        "containers": [{"name": "main", "image": image}],
    }
    return {"metadata": {"namespace": namespace, "name": name, "labels": labels or {}}, "spec": spec,
            "status": status}  # fmt: skip


def test_hami_stops_at_once_on_a_pod_that_cannot_pull_its_image(lab):
    # Docker Hub answers 429 for HAMi's image: the device plugin never rolls out; the first look names the pod, the
    # image, the kubelet's reason and the fix instead of waiting for hami_ready_timeout
    lab.nodes([node("vm-1"), node("vm-gpu", labels={"gpu": "on"}, gpus=0, annotations={})])
    (lab.root / "state" / "not-ready").write_text("")
    pod = pull_pod("hami-device-plugin-x2k9p", "docker.io/projecthami/hami:v2.10.0")
    (lab.root / "state" / "pulls.json").write_text(
        json.dumps({"items": [pod]}, indent=4)
    )  # kubectl's many lines
    task = {**HAMI, "vars": {**HAMI["vars"], "hami_ready_timeout": 60, "hami_poll_interval": 1}}
    rc, out = lab.play([task])
    assert rc != 0
    msg = lab.failures(out)[0]
    assert (
        "pod kube-system/hami-device-plugin-x2k9p container main image = docker.io/projecthami/hami:v2.10.0"
        in msg
    )
    assert "vm-gpu" in msg and "ImagePullBackOff" in msg and "toomanyrequests" in msg
    assert "k3s_registries" in msg and "hami_image_registry" in msg
    looks = [c for c in lab.calls() if c["args"][3:5] == ["get", "pods"]]
    assert len(looks) == 1, "a pod that cannot pull is not waited for"


def test_workloads_stop_on_an_engine_that_cannot_pull_its_image(lab):
    pod = pull_pod("e0-7d9c-abcde", "vllm/vllm-openai:v0.11.0", "ErrImagePull", "default",
                   {"app.kubernetes.io/name": "e0"})  # fmt: skip
    (lab.root / "state" / "pulls.json").write_text(
        json.dumps({"items": [pod]}, indent=4)
    )  # kubectl's many lines
    (lab.root / "state" / "pods.json").write_text(json.dumps({"items": [pod]}))
    (lab.root / "state" / "not-ready").write_text("")
    rc, out = lab.play(
        [WORKLOADS],
        extra_vars={
            "workloads_engines": engines(45, 30),
            "workloads_ready_timeout": 60,
            "workloads_poll_interval": 1,
        },
    )
    assert rc != 0
    msg = lab.failures(out)[0]
    assert msg.startswith(
        "Engine default/e0 cannot start: [1] vm-gpu: pod default/e0-7d9c-abcde container main"
    )
    assert "vllm/vllm-openai:v0.11.0" in msg and "ErrImagePull" in msg and "429 Too Many Requests" in msg
    assert "k3s_registries" in msg
    assert len([c for c in lab.calls() if "rollout" in c["args"]]) == 1, "stopped at the first look"
    assert not (lab.root / "manifests" / "gpulab-workload-default-e1.yaml").exists()


def test_fake_is_executable_python():
    assert shutil.which("python3"), "the fake k3s runs with python3"
