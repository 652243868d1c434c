"""Workload plans: UUID pinning, card shares, start order, refusal above 100 %, schema validation."""

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.k8s import workloads
from gpulab.k8s.validate import ManifestError, kubernetes_version, validate_manifest

from .conftest import run_ansible_module

pytest.importorskip("kubernetes_validate", reason="manifest validation needs the kubernetes-validate package")

UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
UUID1 = "GPU-899c71bf-27be-b6a0-ae8f-d8afe5ba0f85"
GPUS = {
    "vm-gpu": [
        {"index": 0, "uuid": UUID0, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576},
        {"index": 1, "uuid": UUID1, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576},
    ]
}
K3S = "v1.33.5+k3s1"

VLLM = {
    "name": "vllm",
    "image": "vllm/vllm-openai:v0.11.0",
    "node": "vm-gpu",
    "gpus": [0],
    "gpu_memory_percent": 45,
    "cuda_disable_control": True,
    "args": ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--gpu-memory-utilization", "0.40"],
    "port": 8000,
    "readiness_path": "/health",
}


def docs_of(item):
    return [d for d in yaml.safe_load_all(item["manifest"]) if d]


def test_reference_vllm_engine_is_pinned_with_45_percent():
    result = workloads.plan([VLLM], GPUS, k3s_version=K3S)
    (item,) = result["engines"]
    deployment, service = docs_of(item)
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == UUID0
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 45}
    assert {"name": "CUDA_DISABLE_CONTROL", "value": "true"} in container["env"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert service["kind"] == "Service" and service["spec"]["ports"][0]["port"] == 8000
    assert result["cards"] == {UUID0: 45}
    assert item["after"] == [] and item["wait_ready"] is False


@pytest.mark.parametrize("version", ["v1.31.12+k3s1", "v1.33.5+k3s1", "v1.36.2+k3s1"])
def test_every_manifest_validates_against_the_kubernetes_schema(version):
    engines = [
        VLLM,
        {
            "name": "most",
            "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
            "node": "vm-gpu",
            "gpus": [UUID1],
            "gpu_memory_percent": 80,
        },
        {
            "name": "two",
            "image": "x",
            "node": "vm-gpu",
            "gpus": [0, 1],
            "gpu_memory_percent": 10,
            "gpu_cores": 30,
            "env": {"A": 1},
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            "namespace": "ml",
            "port": 80,
        },
    ]
    for item in workloads.plan(engines, GPUS, k3s_version=version)["engines"]:
        for doc in docs_of(item):
            validate_manifest(doc, version)


def test_a_broken_manifest_is_caught_by_the_schema():
    (item,) = workloads.plan([VLLM], GPUS)["engines"]
    deployment = docs_of(item)[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["resourses"] = {}
    with pytest.raises(ManifestError, match="resourses"):
        validate_manifest(deployment, K3S)
    deployment = docs_of(item)[0]
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(ManifestError, match="replicas"):
        validate_manifest(deployment, K3S)


def test_engines_sharing_a_card_start_one_after_the_other():
    engines = [
        {**VLLM, "name": "a"},
        {"name": "other", "image": "x", "node": "vm-gpu", "gpus": [1]},
        {**VLLM, "name": "b", "gpu_memory_percent": 50},
    ]
    result = workloads.plan(engines, GPUS)
    by_name = {e["name"]: e for e in result["engines"]}
    assert [e["name"] for e in result["engines"]] == ["a", "other", "b"]
    assert by_name["a"]["wait_ready"] is True and by_name["b"]["after"] == ["a"]
    assert by_name["other"]["wait_ready"] is False and by_name["other"]["after"] == []
    assert result["cards"] == {UUID0: 95, UUID1: 100}


def test_a_card_above_100_percent_is_refused_naming_the_engines():
    engines = [{**VLLM, "name": "a"}, {**VLLM, "name": "b", "gpu_memory_percent": 60}]
    with pytest.raises(workloads.PlanError, match=r"a 45% \+ b 60% = 105%"):
        workloads.plan(engines, GPUS)


def test_replicas_take_the_share_again():
    with pytest.raises(workloads.PlanError, match="120%"):
        workloads.plan([{**VLLM, "gpu_memory_percent": 40, "replicas": 3}], GPUS)


def test_an_engine_without_a_share_takes_the_whole_card():
    whole = {"name": "whole", "image": "x", "node": "vm-gpu"}
    (item,) = workloads.plan([whole], GPUS)["engines"]
    limits = docs_of(item)[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1}
    with pytest.raises(workloads.PlanError, match="100%"):
        workloads.plan([whole, {**VLLM, "gpu_memory_percent": 1}], GPUS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus": [2]}, "card index 2 does not exist"),
        ({"gpus": ["GPU-00000000-0000-0000-0000-000000000000"]}, "is not among"),
        ({"gpus": ["gpu0"]}, "neither a card index nor a GPU UUID"),
        ({"gpus": [0, 0]}, "listed twice"),
        ({"gpus": []}, "non-empty list"),
        ({"node": "vm-1"}, "has no GPU facts"),
        ({"gpu_memory_percent": 0}, "from 1 to 100"),
        ({"gpu_memory_percent": 101}, "from 1 to 100"),
        ({"name": "Bad_Name"}, "DNS label"),
        ({"image": ""}, "image is required"),
        ({"gpu_share": 45}, "unknown key"),
        ({"port": 70000}, "TCP port"),
        ({"env": {"1 bad": "x"}}, "environment variable"),
        ({"resources": {"limits": {"nvidia.com/gpu": 2}}}, "set GPUs with gpus"),
    ],
)
def test_bad_engines_are_refused(change, message):
    with pytest.raises(workloads.PlanError, match=message):
        workloads.plan([{**VLLM, **change}], GPUS)


def test_duplicate_names_are_refused():
    with pytest.raises(workloads.PlanError, match="twice"):
        workloads.plan([VLLM, {**VLLM, "gpu_memory_percent": 10}], GPUS)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(1, 100)), min_size=1, max_size=6))
def test_refused_exactly_when_a_card_goes_above_100(assignments):
    engines = [
        {"name": f"e{i}", "image": "x", "node": "vm-gpu", "gpus": [card], "gpu_memory_percent": pct}
        for i, (card, pct) in enumerate(assignments)
    ]
    totals = {}
    for card, pct in assignments:
        totals[card] = totals.get(card, 0) + pct
    if max(totals.values()) > 100:
        with pytest.raises(workloads.PlanError):
            workloads.plan(engines, GPUS)
    else:
        result = workloads.plan(engines, GPUS)
        assert sorted(result["cards"].values()) == sorted(totals.values())
        # Every engine that shares a card with an earlier one waits for it.
        for i, item in enumerate(result["engines"]):
            earlier = [f"e{j}" for j in range(i) if assignments[j][0] == assignments[i][0]]
            assert item["after"] == earlier


def test_kubernetes_version():
    assert kubernetes_version("v1.33.5+k3s1") == "1.33"
    assert kubernetes_version("1.36") == "1.36"
    with pytest.raises(ValueError):
        kubernetes_version("latest")


def test_module_plans_and_refuses():
    ok = run_ansible_module(
        "gpulab_hami_workloads", {"engines": [VLLM], "gpus_by_node": GPUS, "k3s_version": K3S}
    )
    assert not ok.get("failed"), ok
    assert ok["changed"] is False and ok["engines"][0]["cards"] == [UUID0]
    bad = run_ansible_module(
        "gpulab_hami_workloads",
        {"engines": [VLLM, {**VLLM, "name": "b", "gpu_memory_percent": 60}], "gpus_by_node": GPUS},
    )
    assert bad["failed"] and "105%" in bad["msg"]
