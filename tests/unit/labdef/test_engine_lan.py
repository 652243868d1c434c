"""Engines on the LAN and their model caches: the objects stage workloads makes (gpulab.k8s.workloads.plan) and
what preflight refuses before any change (gpulab.labdef.checks.check_lan)."""

import pytest
import yaml

from gpulab.k8s import workloads
from unit.k3s.engines import VLLM

UUID = "GPU-6f2a1c3e-0d4b-4c6a-9e1f-2b3c4d5e6f70"
GPUS = {"vm-gpu": [{"uuid": UUID}]}
ADDRESSES = {"vm-gpu": "192.168.100.55"}


def objects(engine, **kw):
    (planned,) = workloads.plan([engine], GPUS, addresses=ADDRESSES, **kw)["engines"]
    docs = list(yaml.safe_load_all(planned["manifest"]))
    return planned, {d["kind"]: d for d in docs}


def test_an_engine_stays_in_the_cluster_unless_it_is_on_the_lan():
    planned, docs = objects(VLLM)
    assert docs["Service"]["spec"]["type"] == "ClusterIP" and planned["lan"] is None


def test_a_lan_engine_gets_a_loadbalancer_on_its_node_address():
    planned, docs = objects({**VLLM, "lan": True, "lan_port": 8001})
    svc = docs["Service"]
    assert svc["spec"]["type"] == "LoadBalancer" and "loadBalancerClass" not in svc["spec"]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8001, "targetPort": "http", "protocol": "TCP"}]
    assert planned["lan"] == {
        "address": "192.168.100.55",
        "port": 8001,
        "url": "http://192.168.100.55:8001/v1",
        "kube_vip": False,
    }


def test_a_lan_address_is_kube_vips():
    planned, docs = objects(
        {**VLLM, "lan": True, "lan_address": "192.168.100.60"}, k3s_version="v1.33.5+k3s1"
    )
    svc = docs["Service"]
    assert svc["metadata"]["annotations"] == {"kube-vip.io/loadbalancerIPs": "192.168.100.60"}
    assert svc["spec"]["loadBalancerClass"] == "kube-vip.io/kube-vip-class"
    assert planned["lan"]["url"] == "http://192.168.100.60:8000/v1" and planned["lan"]["kube_vip"]


def test_a_later_engine_waits_on_the_lan_port_of_the_service():
    later = {"name": "ollama", "image": "ollama/ollama:0.12.6", "node": "vm-gpu", "gpu_memory_percent": 40}
    result = workloads.plan([{**VLLM, "lan": True, "lan_port": 8001}, later], GPUS)
    assert result["engines"][1]["waits_for"] == ["http://vllm.default.svc:8001/health"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"lan": "yes"}, "lan must be true or false"),
        ({"lan_port": 8001}, "lan_port without lan: true"),
        ({"lan": True, "port": None, "readiness_path": None}, "lan: true needs port"),
        ({"lan": True, "lan_port": 70000}, "lan_port must be a TCP port number"),
        ({"lan": True, "lan_address": "lan.example"}, "lan_address must be an IPv4 address"),
        ({"model_cache_size": "lots"}, "model_cache_size must be a size such as 50Gi"),
        ({"model_cache_size": "0Gi"}, "model_cache_size must be a size such as 50Gi"),
        ({"model_cache_path": "models"}, "model_cache_path must be an absolute folder"),
        ({"model_cache_size": "5Gi", "model_cache_path": "/srv/m"}, "both set"),
        ({"hf_token": "hf_abc"}, "hf_token must be true or false"),
    ],
)
def test_the_plan_refuses_bad_lan_and_cache_settings(change, message):
    engine = {k: v for k, v in {**VLLM, **change}.items() if v is not None}
    with pytest.raises(workloads.PlanError) as err:
        workloads.plan([engine], GPUS)
    assert message in str(err.value)


def test_a_model_cache_volume_is_mounted_at_the_hugging_face_cache():
    _, docs = objects({**VLLM, "model_cache_size": "50Gi"}, k3s_version="v1.33.5+k3s1")
    claim = docs["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "vllm-model-cache"
    assert claim["spec"]["storageClassName"] == "local-path"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "model-cache", "persistentVolumeClaim": {"claimName": "vllm-model-cache"}}
    ]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "model-cache", "mountPath": "/root/.cache/huggingface"}
    ]
    _, docs = objects({**VLLM, "model_cache_path": "/srv/models"})
    assert "PersistentVolumeClaim" not in docs
    (volume,) = docs["Deployment"]["spec"]["template"]["spec"]["volumes"]
    assert volume["hostPath"] == {"path": "/srv/models", "type": "DirectoryOrCreate"}


def test_the_token_comes_from_a_secret_never_the_manifest():
    planned, docs = objects({**VLLM, "hf_token": True})
    env = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "gpulab-hf-token", "key": "token"}},
    } in env
    assert planned["hf_token"] is True


LAN = {**VLLM, "lan": True}
OLLAMA = {"name": "ollama", "image": "ollama/ollama:0.12.6", "node": "vm-gpu", "gpu_memory_percent": 40}


def with_kube_vip(inv):
    """The reference lab with a kube-vip VIP (k3s_registration_address) and a DHCP pool of .100-.200."""
    inv.hosts["isp-router"]["router_dhcp_pool"] = {"start": "192.168.100.100", "end": "192.168.100.200"}
    inv.globals["k3s_registration_address"] = "192.168.100.50"
    return inv


#: Addresses a LAN address gpulab announces must not be in the lab of with_kube_vip, and why (engines and Open
#: WebUI alike: tests/unit/labdef/test_open_webui_preflight.py)
BAD_LAN_ADDRESSES = [
    ("10.0.0.9", "outside the router's subnet 192.168.100.0/24"),
    ("192.168.100.1", "already in use: that is the address of the router"),
    ("192.168.100.53", "already in use: that is the address of VM vm-1"),
    ("192.168.100.50", "already in use: that is the address of k3s_registration_address"),
    ("192.168.100.255", "the network or broadcast address"),
    ("192.168.100.150", "inside the router's DHCP pool 192.168.100.100-192.168.100.200"),
]


@pytest.mark.parametrize("address, why", BAD_LAN_ADDRESSES)
def test_preflight_refuses_a_bad_lan_address(inv, address, why):
    with_kube_vip(inv)
    inv.globals["workloads_engines"] = [{**LAN, "lan_address": address}]
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_engines[0].lan_address" and problem.value == address
    assert why in problem.why


def test_preflight_takes_a_free_lan_address_and_the_node_address(inv):
    inv.globals["workloads_engines"] = [LAN]
    assert inv.messages() == []
    with_kube_vip(inv).globals["workloads_engines"] = [{**LAN, "lan_address": "192.168.100.60"}]
    assert inv.messages() == []


def test_preflight_refuses_a_lan_address_without_kube_vip(inv):
    inv.hosts["isp-router"]["router_dhcp_pool"] = {"start": "192.168.100.100", "end": "192.168.100.200"}
    inv.globals["workloads_engines"] = [{**LAN, "lan_address": "192.168.100.60"}]
    (problem,) = inv.check()[1]
    assert (
        problem.field == "workloads_engines[0].lan_address" and "no kube-vip runs in this lab" in problem.why
    )


def test_preflight_refuses_one_lan_address_for_two_engines_naming_both(inv):
    with_kube_vip(inv)
    second = {**OLLAMA, "port": 11434, "lan": True, "lan_address": "192.168.100.60"}
    inv.globals["workloads_engines"] = [{**LAN, "lan_address": "192.168.100.60"}, second]
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_engines[1].lan_address"
    assert "given to two engines, vllm and ollama" in problem.why


def test_preflight_refuses_two_engines_on_one_node_port(inv):
    inv.globals["workloads_engines"] = [LAN, {**OLLAMA, "port": 8000, "lan": True}]
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_engines[1].lan_port"
    assert "engines vllm and ollama both take port 8000 on vm-gpu's address 192.168.100.55" in problem.why
