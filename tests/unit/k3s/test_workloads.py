"""Workload plans: UUID pinning, card shares, start order (at apply and on every start), vLLM's memory
fraction from its share, refusal above 100 %, schema validation."""

import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.k8s import workloads
from gpulab.k8s.validate import ManifestError, kubernetes_version, validate_manifest

from . import engines
from .conftest import run_ansible_module

pytest.importorskip("kubernetes_validate", reason="manifest validation needs the kubernetes-validate package")

ROOT = Path(__file__).resolve().parents[3]
UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
UUID1 = "GPU-899c71bf-27be-b6a0-ae8f-d8afe5ba0f85"
GPUS = {
    "vm-gpu": [
        {"index": 0, "uuid": UUID0, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576},
        {"index": 1, "uuid": UUID1, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576},
    ]
}
K3S = "v1.33.5+k3s1"

VLLM = {**engines.VLLM, "args": ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--gpu-memory-utilization", "0.40"]}


def docs_of(item):
    return [d for d in yaml.safe_load_all(item["manifest"]) if d]


def pod_spec(item):
    return docs_of(item)[0]["spec"]["template"]["spec"]


def init_containers(item):
    return pod_spec(item).get("initContainers", [])


def engine_args(item):
    return pod_spec(item)["containers"][0].get("args", [])


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
            "port": 8080,
            "readiness_path": "healthz",
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
        {**VLLM, "name": "b", "gpu_memory_percent": 50, "args": []},
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
        workloads.plan(
            [{**VLLM, "gpu_memory_percent": 40, "replicas": 3, "cuda_disable_control": False}], GPUS
        )


def test_an_engine_without_a_share_takes_the_whole_card():
    whole = {"name": "whole", "image": "x", "node": "vm-gpu"}
    (item,) = workloads.plan([whole], GPUS)["engines"]
    limits = docs_of(item)[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1}
    with pytest.raises(workloads.PlanError, match="100%"):
        workloads.plan([whole, {**VLLM, "gpu_memory_percent": 1, "args": []}], GPUS)


def sharing(*cores, percent=30):
    """Engines on card 0, each with its share of the memory and the given gpu_cores (None: not set)."""
    return [
        {"name": f"e{i}", "image": "x", "node": "vm-gpu", "gpu_memory_percent": percent, "port": 80,
         "readiness_path": "/", **({"gpu_cores": c} if c is not None else {})}
        for i, c in enumerate(cores)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("cores", "reason"),
    [
        ((100, None), "e0 ask\\(s\\) all 100 cores.*ExclusiveDeviceAllocateConflict"),
        ((None, 100), "e1 ask\\(s\\) all 100 cores.*ExclusiveDeviceAllocateConflict"),
        ((100, 10), "ExclusiveDeviceAllocateConflict"),
        ((60, 50), "e0 60 \\+ e1 50 = 110 cores, more than the card's 100: CardInsufficientCore"),
        (
            (60, 40, None),
            "all 100 cores, and e2 \\(no gpu_cores\\) cannot be placed.*CardComputeUnitsExhausted",
        ),
    ],
)
def test_core_shares_hami_would_leave_pending_are_refused_naming_card_and_engines(cores, reason):
    with pytest.raises(workloads.PlanError, match=f"{UUID0}: .*{reason}.*Fix: give the engines"):
        workloads.plan(sharing(*cores), GPUS)


@pytest.mark.parametrize("cores", [(60, 40), (50, None), (None, None), (99, None), (100,)])
def test_core_shares_hami_places_in_any_order_are_planned(cores):
    planned = workloads.plan(sharing(*cores), GPUS)["engines"]
    limits = [pod_spec(e)["containers"][0]["resources"]["limits"] for e in planned]
    assert [lim.get("nvidia.com/gpucores") for lim in limits] == list(cores)


def test_an_engine_on_a_whole_card_counts_all_its_cores():
    # no share of the memory: HAMi's webhook asks gpucores 100 for it, so a core-less engine beside it is refused
    # by the memory check first, and one with a whole card to itself plans
    assert workloads.hami_cores(100, None) == 100 and workloads.hami_cores(45, None) == 0
    assert workloads.hami_cores(45, 30) == 30
    assert workloads.plan(sharing(None, percent=100), GPUS)["cards"] == {UUID0: 100}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 100)), min_size=1, max_size=4))
def test_core_shares_are_refused_exactly_when_some_start_order_leaves_one_pending(cores):
    # HAMi's Fit on one card of 100 cores (pkg/device/nvidia/device.go@v2.10.0), every start order tried
    import itertools

    def fits_in(order):
        used = held = 0
        for c in order:
            c = c or 0
            if 100 - used < c or (c == 100 and held) or (used == 100 and c == 0):
                return False
            used, held = used + c, held + 1
        return True

    all_fit = all(fits_in(order) for order in itertools.permutations(cores))
    if all_fit:
        workloads.plan(sharing(*cores, percent=20), GPUS)
    else:
        with pytest.raises(workloads.PlanError, match="HAMi's scheduler cannot share"):
            workloads.plan(sharing(*cores, percent=20), GPUS)


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
        ({"kind": "sglang"}, "kind must be one of vllm, other"),
        ({"cuda_disable_control": "yes"}, "true or false"),
        ({"readiness_path": 5}, "HTTP path"),
        ({"replicas": 2}, "copies would start at once"),
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
        {
            "name": f"e{i}",
            "image": "x",
            "node": "vm-gpu",
            "gpus": [card],
            "gpu_memory_percent": pct,
            "port": 80,
            "readiness_path": "/",
        }
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
            # ... and its pod's init container polls each of them, on every start
            assert item["waits_for"] == [f"http://{n}.default.svc:80/" for n in earlier]
            assert len(init_containers(item)) == (1 if earlier else 0)


def test_kubernetes_version():
    assert kubernetes_version("v1.33.5+k3s1") == "1.33"
    assert kubernetes_version("1.36") == "1.36"
    with pytest.raises(ValueError):
        kubernetes_version("latest")


def test_a_later_engine_on_a_card_waits_in_an_init_container_on_every_start():
    engines = [
        {**VLLM, "name": "a", "gpu_memory_percent": 30, "args": []},
        {"name": "other", "image": "x", "node": "vm-gpu", "gpus": [1]},
        {
            **VLLM,
            "name": "b",
            "gpu_memory_percent": 30,
            "args": [],
            "namespace": "ml",
            "port": 9000,
            "readiness_path": "ready",
        },
        {
            "name": "c",
            "image": "ollama/ollama:0.12.6",
            "node": "vm-gpu",
            "gpus": [0],
            "gpu_memory_percent": 30,
        },
    ]
    by_name = {e["name"]: e for e in workloads.plan(engines, GPUS, k3s_version=K3S)["engines"]}
    assert init_containers(by_name["a"]) == [] and init_containers(by_name["other"]) == []
    assert by_name["b"]["waits_for"] == ["http://a.default.svc:8000/health"]
    assert by_name["c"]["waits_for"] == ["http://a.default.svc:8000/health", "http://b.ml.svc:9000/ready"]
    for name in ("b", "c"):
        (init,) = init_containers(by_name[name])
        assert init["name"] == "wait-for-earlier-engines" and init["image"] == workloads.WAIT_IMAGE
        assert init["command"] == ["sh", "-c", workloads.WAIT_SCRIPT]
        assert init["env"] == [{"name": "GPULAB_WAIT_FOR", "value": " ".join(by_name[name]["waits_for"])}]
        # no card for the waiting: the share is the engine's alone, and it runs as nobody
        assert not any(k.startswith("nvidia.com/") for part in init["resources"].values() for k in part)
        assert init["securityContext"]["runAsNonRoot"] is True
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert [c["name"] for c in pod_spec(by_name[name])["containers"]] == ["engine"]
    # the URLs are the earlier engines' Services at their readiness probes' paths
    deployment_b, service_b = docs_of(by_name["b"])
    assert (
        deployment_b["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"]
        == "ready"
    )
    assert (service_b["metadata"]["name"], service_b["metadata"]["namespace"]) == ("b", "ml")
    assert service_b["spec"]["ports"][0]["port"] == 9000


def test_the_wait_script_polls_each_earlier_engine_until_it_answers(tmp_path):
    """WAIT_SCRIPT run by a real sh, with wget and sleep stand-ins: an engine 'becomes Ready' after 2 sleeps."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "wget").write_text(
        "#!/bin/sh\n"
        f'echo "wget $*" >> {log}\n'
        f'n=$(grep -c "^sleep" {log} 2>/dev/null)\n'
        'case "$*" in *a.default*) [ "$n" -ge 2 ];; *b.ml*) [ "$n" -ge 3 ];; *) exit 1;; esac\n'
    )
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "sleep $*" >> {log}\n')
    for tool in ("wget", "sleep"):
        (bin_dir / tool).chmod(0o755)
    urls = "http://a.default.svc:8000/health http://b.ml.svc:9000/ready"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GPULAB_WAIT_FOR": urls}
    proc = subprocess.run(
        ["sh", "-c", workloads.WAIT_SCRIPT], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    a, b = urls.split()
    assert calls == [
        f"wget -q -T 5 -O /dev/null {a}", "sleep 5",
        f"wget -q -T 5 -O /dev/null {a}", "sleep 5",
        f"wget -q -T 5 -O /dev/null {a}",
        f"wget -q -T 5 -O /dev/null {b}", "sleep 5",
        f"wget -q -T 5 -O /dev/null {b}",
    ]  # fmt: skip
    assert f"waiting until {a} answers" in proc.stdout and f"{b} answers" in proc.stdout


def test_an_engine_waited_for_needs_a_readiness_path():
    first = {**VLLM, "name": "a", "gpu_memory_percent": 30, "args": [], "readiness_path": None}
    later = {**VLLM, "name": "b", "gpu_memory_percent": 30, "args": []}
    with pytest.raises(
        workloads.PlanError, match=r"'a': shares a card with the later engine 'b'.*readiness_path"
    ):
        workloads.plan([first, later], GPUS)
    # the last one on a card is waited for by nobody; an engine with no copies is never Ready, so not waited for
    (item,) = workloads.plan([first], GPUS)["engines"]
    assert item["waits_for"] == []
    result = workloads.plan([{**first, "replicas": 0}, later], GPUS)
    assert result["engines"][1]["after"] == ["a"] and result["engines"][1]["waits_for"] == []


def test_the_wait_image_can_be_another_one():
    engines = [
        {**VLLM, "name": "a", "gpu_memory_percent": 30, "args": []},
        {**VLLM, "name": "b", "gpu_memory_percent": 30, "args": []},
    ]
    item = workloads.plan(engines, GPUS, wait_image="registry.lan/busybox:1.37.0")["engines"][1]
    assert init_containers(item)[0]["image"] == "registry.lan/busybox:1.37.0"
    with pytest.raises(workloads.PlanError, match="image name"):
        workloads.plan(engines, GPUS, wait_image=" ")


def test_the_reference_vllm_engine_is_told_its_share():
    """inventory/homelab's engine: HAMi-core off, 45 % of the card -> --gpu-memory-utilization 0.45."""
    inventory = yaml.safe_load((ROOT / "inventory/homelab/group_vars/all/main.yml").read_text())
    (item,) = workloads.plan(inventory["workloads_engines"], GPUS, k3s_version=K3S)["engines"]
    assert engine_args(item) == ["--gpu-memory-utilization", "0.45"]
    assert item["gpu_memory_utilization"] == "0.45"


@pytest.mark.parametrize(
    ("change", "args"),
    [
        ({"args": ["--model", "m"]}, ["--model", "m", "--gpu-memory-utilization", "0.45"]),
        ({"gpu_memory_percent": 5, "args": None}, ["--gpu-memory-utilization", "0.05"]),
        # an explicit value within the share is kept as given, once
        ({}, VLLM["args"]),
        ({"args": ["--gpu-memory-utilization=0.3"]}, ["--gpu-memory-utilization=0.3"]),
        ({"args": None, "command": ["vllm", "serve", "m", "--gpu-memory-utilization", "0.45"]}, []),
        # HAMi-core on: vLLM sees its share as the whole card, its own default applies
        ({"cuda_disable_control": False, "args": None}, []),
        # a whole card: vLLM's own default
        ({"gpu_memory_percent": 100, "args": None}, []),
        # not vLLM, unless said so
        ({"image": "ollama/ollama:0.12.6", "args": None}, []),
        ({"image": "registry.lan/llm:1", "kind": "vllm", "args": None}, ["--gpu-memory-utilization", "0.45"]),
        ({"kind": "other", "args": None}, []),
        # HAMi-core is off by default for vLLM (the design's CUDA_DISABLE_CONTROL=true)
        ({"cuda_disable_control": None, "args": None}, ["--gpu-memory-utilization", "0.45"]),
    ],
)
def test_a_vllm_engine_gets_its_memory_fraction_from_its_share(change, args):
    engine = {k: v for k, v in {**VLLM, **change}.items() if v is not None}
    (item,) = workloads.plan([engine], GPUS, k3s_version=K3S)["engines"]
    assert engine_args(item) == args
    assert engine_args(item).count("--gpu-memory-utilization") <= 1


def test_hami_core_is_off_by_default_for_vllm_only():
    def env(item):
        return {e["name"]: e["value"] for e in pod_spec(item)["containers"][0].get("env", [])}

    vllm = {k: v for k, v in VLLM.items() if k != "cuda_disable_control"}
    other = {**vllm, "name": "o", "image": "ollama/ollama:0.12.6", "gpus": [1]}
    a, o = workloads.plan([vllm, other], GPUS)["engines"]
    assert env(a) == {"CUDA_DISABLE_CONTROL": "true"} and env(o) == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpu-memory-utilization", "0.5"],
            r"0.5 is above the engine's share \(45 % of the card, at most 0.45\)",
        ),
        (["--gpu-memory-utilization=0.9"], "above the engine's share"),
        (["--gpu-memory-utilization", "most"], "fraction above 0 and at most 1, not 'most'"),
        (["--gpu-memory-utilization", "0"], "fraction above 0"),
        (["--gpu-memory-utilization", "1.5"], "fraction above 0"),
        (["--gpu-memory-utilization"], "has no value"),
    ],
)
def test_a_vllm_memory_fraction_beyond_its_share_is_refused(args, message):
    with pytest.raises(workloads.PlanError, match=message):
        workloads.plan([{**VLLM, "args": args}], GPUS)
    # with HAMi-core on, the share is enforced and any fraction of it is vLLM's own business
    if "share" in message:
        workloads.plan([{**VLLM, "args": args, "cuda_disable_control": False}], GPUS)


def test_module_plans_and_refuses():
    ok = run_ansible_module("hami_workloads", {"engines": [VLLM], "gpus_by_node": GPUS, "k3s_version": K3S})
    assert not ok.get("failed"), ok
    assert ok["changed"] is False and ok["engines"][0]["cards"] == [UUID0]
    bad = run_ansible_module(
        "hami_workloads",
        {"engines": [VLLM, {**VLLM, "name": "b", "gpu_memory_percent": 60}], "gpus_by_node": GPUS},
    )
    assert bad["failed"] and "105%" in bad["msg"]


def test_the_module_gives_a_lan_engine_its_nodes_address():
    """The module passes `addresses` (each GPU node's vm_address) on to the plan: a LAN engine without lan_address
    gets its node's address in its URL, which the stage's last step calls (it had none: the run failed there)."""
    lan = {**VLLM, "lan": True}
    ok = run_ansible_module(
        "hami_workloads", {"engines": [lan], "gpus_by_node": GPUS, "addresses": {"vm-gpu": "192.168.100.55"}}
    )
    assert not ok.get("failed"), ok
    assert ok["engines"][0]["lan"]["url"] == "http://192.168.100.55:8000/v1"
