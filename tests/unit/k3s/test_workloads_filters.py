"""The filters stage workloads words its outcome with (plugins/filter/hami.py, plugins/filter/k3s.py): no
cluster needed."""

from __future__ import annotations

import json

import plugin_files

HAMI = plugin_files.filters("hami")
K3S = plugin_files.filters("k3s")


def test_a_webhook_that_answers_everywhere_is_not_refused():
    results = [{"workloads_namespace": ns, "rc": 0, "stdout": "hami-scheduler"} for ns in ("default", "ai")]
    assert HAMI["hami_webhook_refusal"](results, "hami-scheduler", 120) == ""


def test_the_first_namespace_whose_dry_run_missed_hami_is_named():
    results = [
        {"workloads_namespace": "default", "rc": 0, "stdout": "hami-scheduler"},
        {"workloads_namespace": "ai", "rc": 0, "stdout": "default-scheduler"},
        {"workloads_namespace": "x", "rc": 1, "stdout": "", "stderr": "boom\n"},
    ]
    why = HAMI["hami_webhook_refusal"](results, "hami-scheduler", 120)
    assert why.startswith(
        "HAMi's webhook did not send a GPU pod to hami-scheduler within 120 s: a server dry run of a one-vGPU pod "
        "in namespace ai got schedulerName default-scheduler, so no engine was placed"
    )
    failed = HAMI["hami_webhook_refusal"](results[2:], "hami-scheduler", 120)
    assert "in namespace x got an error: boom, so no engine" in failed


def test_card_shares_in_one_line():
    assert HAMI["hami_card_shares_text"]({"GPU-a": 40, "GPU-b": 100}) == "GPU-a: 40 %; GPU-b: 100 %"
    assert HAMI["hami_card_shares_text"]({}) == ""


def test_an_unready_rollout_names_kubectls_last_line():
    rollout = {"stdout": '{"pulls": {"items": []}}', "stderr": "Waiting...\nerror: timed out waiting\n"}
    assert K3S["k3s_not_ready_text"](rollout, "Engine default/vllm", 600) == (
        "Engine default/vllm is not Ready after 600 s (kubectl: error: timed out waiting)."
    )
    assert K3S["k3s_not_ready_text"]({}, "Engine default/vllm", 600) == (
        "Engine default/vllm is not Ready after 600 s (kubectl: )."
    )


def test_an_image_that_cannot_be_pulled_is_said_instead():
    pod = {
        "metadata": {"namespace": "default", "name": "vllm-1"},
        "spec": {"nodeName": "vm-gpu", "containers": [{"name": "vllm", "image": "vllm/vllm-openai:nope"}]},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "vllm", "image": "vllm/vllm-openai:nope",
                 "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
            ],
        },
    }  # fmt: skip
    rollout = {"stdout": json.dumps({"pulls": {"items": [pod]}}), "stderr": "error: timed out"}
    text = K3S["k3s_not_ready_text"](rollout, "Engine default/vllm", 600)
    assert text.startswith("Engine default/vllm cannot start: ") and "vllm/vllm-openai:nope" in text


def test_the_token_secrets_no_planned_engine_reads_are_named_by_namespace():
    found = [
        {"path": f"/var/lib/rancher/k3s/server/manifests/gpulab-hf-token-{ns}.yaml"}
        for ns in ("ai", "default", "x.y")
    ]
    found.append(
        {"path": "/var/lib/rancher/k3s/server/manifests/gpulab-hf-token-.yaml"}
    )  # no namespace: not ours
    engines = [
        {"name": "vllm", "namespace": "ai", "hf_token": True},
        {"name": "o", "namespace": "x.y", "hf_token": False},
    ]
    assert HAMI["hami_unread_token_namespaces"](found, engines) == ["default", "x.y"]
    assert HAMI["hami_unread_token_namespaces"]([], engines) == []
    assert HAMI["hami_unread_token_namespaces"](found[:1], []) == ["ai"]
