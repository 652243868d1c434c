"""The k3s stand-in's image pulls (labsim.net.k3s.registry), stepped by hand (no root, no processes): containerd's
image names and endpoints from registries.yaml, Docker Hub's 429 after N anonymous pulls, the kubelet's
ErrImagePull then ImagePullBackOff, and a mirror or credentials that lift the limit. Each test is a row of
library/labsim/UPSTREAM.md (k3s.pull.*)."""

import json
import time

import pytest

from gpulab.k8s import image_pulls, workloads
from labsim.net.k3s import cluster as k3s
from labsim.net.k3s import registry

from . import engines

UUID = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
FACTS = {"vm-gpu": [{"index": 0, "uuid": UUID, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576}]}
CHART = (
    "apiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: hami, namespace: kube-system}\n"
    "spec:\n  chart: hami\n  valuesContent: |-\n    devicePlugin:\n      runtimeClassName: nvidia\n"
)
MIRROR = {"mirrors": {"docker.io": {"endpoint": ["https://mirror.lan:5000"]}}}


class Lab:
    """One GPU node of the stand-in's cluster in this process, its registries.yaml and the registry knob."""

    def __init__(self, tmp_path, monkeypatch):
        monkeypatch.setattr(k3s, "STATE", str(tmp_path / "state.json"))
        monkeypatch.setattr(k3s, "MANIFESTS", str(tmp_path / "manifests"))
        monkeypatch.setattr(registry, "KNOB", str(tmp_path / "registry.json"))
        self.tmp = tmp_path
        self.manifests = tmp_path / "manifests"
        self.manifests.mkdir()
        (self.manifests / "hami.yaml").write_text(CHART)
        self.cluster = k3s.Cluster()
        self.start("start-1", {})
        self.cluster.apply_manifests()
        self.cluster.state["charts_seen"]["kube-system/hami"] = time.time() - 5

    def start(self, start, registries):
        """The node's k3s starts (again), with the registries.yaml it read then."""
        card = {"uuid": UUID, "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}
        self.cluster.register({"name": "vm-gpu", "address": "10.0.0.3", "runtimes": ["nvidia"],
                               "labels": {"gpu": "on"}, "gpus": 1, "gpu_uuids": [UUID], "gpu_cards": [card],
                               "boot_id": "boot-1", "start": start, "registries": registries})  # fmt: skip

    def knob(self, **hosts):
        (self.tmp / "registry.json").write_text(json.dumps(hosts))

    def place(self, engine_list):
        for item in workloads.plan(engine_list, FACTS)["engines"]:
            (self.manifests / f"gpulab-workload-default-{item['name']}.yaml").write_text(item["manifest"])

    def step(self, seconds=0):
        for pod in self.cluster.state.get("pods", []):
            if pod["started"] is not None:
                pod["started"] -= seconds
            if pod.get("pull"):
                pod["pull"]["next"] -= seconds
        self.cluster.apply_manifests()
        return {p["name"].rsplit("-", 2)[0]: k3s.pod_status(p) for p in self.cluster.state["pods"]}

    def objects(self):
        return [k3s.pod_object(p) for p in self.cluster.state["pods"]]

    def pulled(self):
        return [(p["image"], p["endpoint"], p["status"]) for p in self.cluster.state["pulls"]]


@pytest.fixture
def lab(tmp_path, monkeypatch):
    return Lab(tmp_path, monkeypatch)


def test_k3s_pull_image_names_as_containerd_normalises():
    assert registry.normalize("busybox:1.37.0")[3] == "docker.io/library/busybox:1.37.0"
    assert registry.normalize("vllm/vllm-openai:v0.11.0")[:3] == ("docker.io", "vllm/vllm-openai", "v0.11.0")
    assert registry.normalize("registry.k8s.io/kube-scheduler:v1.33.5")[:2] == (
        "registry.k8s.io",
        "kube-scheduler",
    )
    assert registry.normalize("localhost:5000/x")[3] == "localhost:5000/x:latest"
    assert registry.normalize("ubuntu@sha256:ab")[3] == "docker.io/library/ubuntu@sha256:ab"
    assert registry.normalize("index.docker.io/grafana/grafana:12")[3] == "docker.io/grafana/grafana:12"
    assert registry.normalize("Mirror/x:1")[:2] == ("Mirror", "x")


def test_k3s_pull_mirror_endpoints_in_order_then_the_default():
    conf = {"mirrors": {"docker.io": {"endpoint": ["https://a.lan", "http://b.lan:5000/"],
                                      "rewrite": {"^library/(.*)": "hub/$1"}},
                        "*": {"endpoint": ["https://any.lan"]}}}  # fmt: skip
    assert [u for u, _ in registry.endpoints(conf, "docker.io")] == [
        "https://a.lan", "http://b.lan:5000", "https://registry-1.docker.io"]  # fmt: skip
    assert [u for u, _ in registry.endpoints(conf, "quay.io")] == ["https://any.lan", "https://quay.io"]
    assert [u for u, _ in registry.endpoints({}, "ghcr.io")] == ["https://ghcr.io"]
    # the mirror's rewrite applies to its endpoints, never to the default one
    state = {}
    registry.pull(
        state, "n", "busybox:1.37.0", conf, knob={"a.lan": {"limit": 0}, "b.lan:5000": {"limit": 0}}
    )
    assert [(p["endpoint"], p["repository"], p["status"]) for p in state["pulls"]] == [
        ("https://a.lan", "hub/busybox", 429), ("http://b.lan:5000", "hub/busybox", 429),
        ("https://registry-1.docker.io", "library/busybox", 200)]  # fmt: skip


def test_k3s_pull_registry_429_after_n_pulls(lab):
    # Docker Hub gives the lab's one address 1 anonymous pull: vLLM's passes, the next image is refused with
    # Docker Hub's 429; the kubelet shows ErrImagePull, then ImagePullBackOff
    lab.knob(**{"registry-1.docker.io": {"limit": 1}})
    lab.place([engines.SHARED_CARD[0]])
    assert lab.step() == {"vllm": "Running"}
    lab.place([{**engines.SHARED_CARD[1], "name": "ollama2", "gpu_memory_percent": 10}])
    assert lab.step()["ollama2"] == "ErrImagePull"
    [pod] = [p for p in lab.objects() if p["metadata"]["name"].startswith("ollama2")]
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "ErrImagePull"
    assert waiting["message"] == (
        'rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/ollama/ollama:0.12.6": failed '
        "to copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/ollama/ollama/"
        "manifests/sha256:"
        + waiting["message"].split("manifests/sha256:")[1].split(":")[0]
        + ": 429 Too Many "
        "Requests - Server message: toomanyrequests: You have reached your unauthenticated pull rate limit. "
        "https://www.docker.com/increase-rate-limit"
    )
    assert lab.step()["ollama2"] == "ImagePullBackOff"
    [pod] = [p for p in lab.objects() if p["metadata"]["name"].startswith("ollama2")]
    back_off = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert (
        back_off["message"]
        == f'Back-off pulling image "ollama/ollama:0.12.6": ErrImagePull: {waiting["message"]}'
    )
    # gpulab names it from the pod as kubectl shows it
    [problem] = image_pulls.problems({"items": lab.objects()})
    assert problem["value"] == "ollama/ollama:0.12.6" and "k3s_registries" in problem["fix"]
    # after the back-off (10 s) the kubelet tries again, and is refused again
    assert lab.step(10)["ollama2"] == "ErrImagePull"
    assert [s for _, _, s in lab.pulled()] == [200, 429, 429]


def test_k3s_pull_through_the_mirror_after_a_restart(lab):
    lab.knob(**{"registry-1.docker.io": {"limit": 0}})
    lab.place([engines.VLLM])
    assert lab.step() == {"vllm": "ErrImagePull"}
    # registries.yaml with a mirror, read at the next start of the node's k3s: its kubelet forgets the back-off
    lab.start("start-2", MIRROR)
    assert lab.step() == {"vllm": "Running"}
    assert lab.pulled()[-1] == ("vllm/vllm-openai:v0.11.0", "https://mirror.lan:5000", 200)
    assert lab.cluster.state["registry_pulls"] == {"mirror.lan:5000": 1}
    # an image on the node is not pulled again
    lab.cluster.state["deployment_history"]["default/vllm"]["pod"] = None
    lab.step()
    assert len(lab.pulled()) == 2


def test_k3s_pull_credentials_are_not_limited(lab):
    lab.knob(**{"registry-1.docker.io": {"limit": 0}})
    lab.start("start-2", {"configs": {"registry-1.docker.io": {"auth": {"username": "u", "password": "p"}}}})
    lab.place([engines.VLLM])
    assert lab.step() == {"vllm": "Running"}


def test_k3s_pull_not_found(lab):
    lab.knob(**{"registry-1.docker.io": {"missing": ["vllm/vllm-openai"]}})
    lab.place([engines.VLLM])
    assert lab.step() == {"vllm": "ErrImagePull"}
    [problem] = image_pulls.problems({"items": lab.objects()})
    assert problem["cause"].startswith("the registry has no such image or tag (not found)")
    assert "code = NotFound" in problem["cause"]


def test_k3s_pull_error_status_over_not_found():
    # a mirror without the image (404) and Docker Hub over its limit (429): containerd reports the 429
    conf = {"mirrors": {"docker.io": {"endpoint": ["https://m.lan"]}}}
    knob = {"m.lan": {"missing": ["library/busybox"]}, "registry-1.docker.io": {"limit": 0}}
    error = registry.pull({}, "n", "busybox:1.37.0", conf, knob=knob)
    assert "429 Too Many Requests" in error and "code = Unknown" in error
