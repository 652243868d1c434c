"""plugins/filter/hami.py: how the sharing proof (roles/hami/tasks/proof.yml) and the device plugin check
(roles/hami/tasks/conflicts.yml) word what they saw, from kubectl's JSON (no cluster needed)."""

from __future__ import annotations

import json

import plugin_files

F = plugin_files.filters("hami")
UUID = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
CARD = {"uuid": UUID, "node": "vm-gpu", "devmem": 24576, "devcore": 100, "used_cores": 0, "free_percent": 100,
        "pods": []}  # fmt: skip
REFUSED = "0/3 nodes are available: 1 1/1 CardInsufficientMemory, 2 node unregistered. preemption: 0/3 nodes."


def pod(name, phase="Running", scheduler="hami-scheduler", node="vm-gpu", why=None):
    status = {"phase": phase}
    if why is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        ]
    spec = {"schedulerName": scheduler, **({"nodeName": node} if node else {})}
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec, "status": status}


def look(*pods):
    return json.dumps({"items": list(pods)})


def seen(a="9830", b="9830"):
    return [{"stdout": f"{a}\n", "item": {"name": "gpulab-hami-proof-a"}},
            {"stdout": f"{b}\n", "item": {"name": "gpulab-hami-proof-b"}}]  # fmt: skip


PROOF = ("gpulab-hami-proof-a", "gpulab-hami-proof-b")


def test_a_card_that_holds_the_proof_is_not_refused():
    assert F["hami_proof_card_refusal"](CARD, 40, ["vm-gpu"]) == ""


def test_each_reason_a_card_cannot_hold_the_proof_is_named():
    assert "found no card HAMi registered for vm-gpu: run stage hami first" in F["hami_proof_card_refusal"](
        {}, 40, ["vm-gpu"]
    )
    assert "for any GPU host" in F["hami_proof_card_refusal"]({}, 40, [])
    held = {**CARD, "free_percent": 60, "pods": [{"pod": "default/vllm"}]}
    assert F["hami_proof_card_refusal"](held, 40, ["vm-gpu"]) == (
        f"Card {UUID} on vm-gpu has 60 % free (held: default/vllm), the proof needs 81 %: lower "
        "hami_proof_share_percent or stop engines first."
    )
    cores = {**CARD, "used_cores": 100, "pods": [{"pod": "default/vllm"}, {"pod": "ai/ollama"}]}
    why = F["hami_proof_card_refusal"](cores, 40, ["vm-gpu"])
    assert (
        "has all its 100 cores held (default/vllm, ai/ollama)" in why and "CardComputeUnitsExhausted" in why
    )


def test_two_running_pods_under_hami_start_the_proof():
    two = {"rc": 0, "stdout": look(pod(PROOF[0]), pod(PROOF[1]))}
    assert F["hami_proof_start_refusal"](two, 300) == ""


def test_pods_that_went_around_hami_stop_the_proof_with_the_webhook_fix():
    two = {"rc": 0, "stdout": look(pod(PROOF[0], "Pending", "default-scheduler", None), pod(PROOF[1]))}
    why = F["hami_proof_start_refusal"](two, 300, namespace="gpu", release="h")
    assert why.startswith("The sharing proof's pods went around HAMi")
    assert "k3s kubectl -n gpu rollout status deployment/h-scheduler" in why
    assert "kubernetes.io/service-name=h-scheduler must show a ready endpoint" in why


def test_an_unreadable_look_or_a_pod_not_running_is_said():
    assert (
        F["hami_proof_start_refusal"]({"rc": 1, "stderr": "boom"}, 300)
        == "The sharing proof could not read its pods: boom."
    )
    two = {
        "rc": 0,
        "stdout": look(pod(PROOF[0]), pod(PROOF[1], "Pending", node=None, why="0/3 nodes are available")),
    }
    assert F["hami_proof_start_refusal"](two, 300) == (
        "The sharing proof's two pods did not both run within 300 s: default/gpulab-hami-proof-a (schedulerName "
        "hami-scheduler) Running on vm-gpu; default/gpulab-hami-proof-b (schedulerName hami-scheduler) Pending: 0/3 "
        "nodes are available."
    )


def test_shares_seen_and_the_third_pod_refused_for_memory_make_the_report():
    three = look(pod(PROOF[0]), pod(PROOF[1]), pod("gpulab-hami-proof-c", "Pending", node=None, why=REFUSED))
    out = F["hami_proof_outcome"](three, seen(), CARD, 40, 30)
    assert out["problems"] == []
    assert out["report"] == (
        f"HAMi shares card {UUID} on vm-gpu (24576 MiB): gpulab-hami-proof-a sees 9830 MiB (40 %); "
        "gpulab-hami-proof-b sees 9830 MiB (40 %); gpulab-hami-proof-c asking 30 % stays Pending, HAMi's scheduler "
        f"refusing CardInsufficientMemory: {REFUSED}"
    )


def test_a_wrong_share_a_placed_third_pod_and_another_refusal_are_problems():
    three = look(pod(PROOF[0]), pod(PROOF[1]), pod("gpulab-hami-proof-c", "Running", node="vm-gpu"))
    out = F["hami_proof_outcome"](three, seen(a="24576", b=""), CARD, 40, 30)
    assert out["problems"] == [
        "nvidia-smi in gpulab-hami-proof-a reports 24576 MiB, not its 40 % share (9830 MiB)",
        "nvidia-smi in gpulab-hami-proof-b reports nothing MiB, not its 40 % share (9830 MiB)",
        "pod gpulab-hami-proof-c asking 30 % is Running on vm-gpu: the card is past 100 % (40 + 40 + 30 %)",
    ]
    other = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes."
    three = look(pod(PROOF[0]), pod(PROOF[1]), pod("gpulab-hami-proof-c", "Pending", node=None, why=other))
    assert F["hami_proof_outcome"](three, seen(a="9900"), CARD, 40, 30)["problems"] == [
        "pod gpulab-hami-proof-c is Pending, but HAMi's scheduler did not refuse it for the card's memory "
        f"(CardInsufficientMemory): {other}"
    ]


def test_proof_pods_around_hami_are_a_problem():
    three = look(
        pod(PROOF[0], "Pending", "default-scheduler", None),
        pod("gpulab-hami-proof-c", "Pending", node=None, why=REFUSED),
    )
    (problem,) = F["hami_proof_outcome"](three, [], CARD, 40, 30)["problems"]
    assert problem.startswith("pods went around HAMi, created while its webhook did not answer: ")


def daemonset(ns, name, image):
    return {"metadata": {"namespace": ns, "name": name},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}  # fmt: skip


def test_nvidia_device_plugins_other_than_hamis_are_conflicts():
    sets = look(
        daemonset("kube-system", "hami-device-plugin", "projecthami/hami:v2.10.0"),
        daemonset("kube-system", "h-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"),
        daemonset("gpu-operator", "nvidia-device-plugin-daemonset", "nvcr.io/nvidia/other:1"),
        daemonset("kube-system", "svclb-traefik", "rancher/klipper-lb:v0.4.9"),
    )
    assert F["hami_conflicts"](sets, "hami") == [
        "kube-system/h-device-plugin",
        "gpu-operator/nvidia-device-plugin-daemonset",
    ]
    assert F["hami_conflicts"](sets, "h") == ["gpu-operator/nvidia-device-plugin-daemonset"]
    assert F["hami_conflicts"]("", "hami") == []
