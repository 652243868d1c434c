"""Every rule stage workloads applies to the engines is applied by preflight and `gpulab plan` first, through the
same function (gpulab.k8s.workloads.plan): nothing is changed for a plan HAMi would leave Pending."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulab.k8s import workloads
from unit.k3s.engines import VLLM  # the reference vLLM engine, as the k3s tests run it

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SECRETS = {"GPULAB_PVE_API_TOKEN_SECRET": "0b1f8a3e-5a43-4c2e-9d8e", "GPULAB_ROUTER_PASSWORD": "pw-for-test"}
UUID = "GPU-6f2a1c3e-0d4b-4c6a-9e1f-2b3c4d5e6f70"


def engines(*more):
    return [dict(VLLM), *more]


def test_plan_refuses_an_engine_asking_all_cores_of_a_card_another_engine_shares(tmp_path):
    """`gpulab plan` on the reference inventory plus an engine asking 100 % of the cores of vllm's card: HAMi
    would leave one of them Pending (ExclusiveDeviceAllocateConflict), so the plan refuses it before any stage."""
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventory/homelab", inv)
    main = inv / "group_vars/all/main.yml"
    values = yaml.safe_load(main.read_text())
    ollama = {"name": "ollama", "image": "ollama/ollama:0.12.3", "node": "vm-gpu", "gpus": [0]}
    ollama.update(gpu_memory_percent=40, gpu_cores=100)
    values["workloads_engines"].append(ollama)
    main.write_text(
        main.read_text() + "\n" + yaml.safe_dump({"workloads_engines": values["workloads_engines"]})
    )
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), **SECRETS}
    r = subprocess.run(
        [BIN / "gpulab", "plan", str(inv)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "vm-gpu card 0: ollama ask(s) all 100 cores" in r.stdout
    assert "ExclusiveDeviceAllocateConflict" in r.stdout
    assert "an engine asking all 100 cores needs a card of its own" in r.stdout


@pytest.mark.parametrize(
    "other, reason",
    [
        ({"gpu_cores": 100}, "ExclusiveDeviceAllocateConflict"),
        ({"gpu_cores": 60}, None),
        ({"gpu_cores": 60, "gpu_memory_percent": 40}, None),
    ],
)
def test_preflight_applies_the_core_rule_of_stage_workloads(inv, other, reason):
    second = {"name": "ollama", "image": "ollama/ollama:0.12.3", "node": "vm-gpu", "gpu_memory_percent": 40}
    inv.globals["workloads_engines"] = engines({**second, **other})
    messages = inv.messages()
    if reason is None:
        assert messages == []
    else:
        (message,) = messages
        assert message.startswith("all: workloads_engines=['vm-gpu card 0']: cards whose compute HAMi's")
        assert reason in message and f"Fix: {workloads.CORES_FIX}." in message


def test_the_memory_rule_lives_in_one_place_and_both_paths_say_the_same(inv):
    """Preflight (on the definition's card `vm-gpu card 0`) and the stage (on the card's UUID from the guest's
    facts) refuse 45 % + 60 % of one card with the same words, both from workloads.memory_problem."""
    second = {"name": "ollama", "image": "ollama/ollama:0.12.3", "node": "vm-gpu", "gpu_memory_percent": 60}
    inv.globals["workloads_engines"] = engines(second)
    (problem,) = inv.check()[1]
    with pytest.raises(workloads.PlanError) as stage:
        workloads.plan(inv.globals["workloads_engines"], {"vm-gpu": [{"uuid": UUID}]})
    rule = workloads.memory_problem("vm-gpu card 0", [("vllm", 45), ("ollama", 60)])
    assert rule == "vm-gpu card 0: vllm 45% + ollama 60% = 105% of its memory, more than the card has"
    assert rule in problem.why
    assert problem.why.replace("vm-gpu card 0", UUID) == stage.value.why
    assert problem.fix == stage.value.fix == workloads.MEMORY_FIX
    # replicas take the share again, in both
    inv.globals["workloads_engines"] = engines({**second, "gpu_memory_percent": 30, "replicas": 2})
    assert "ollama 60%" in inv.check()[1][0].why


def test_preflight_applies_the_stages_other_engine_rules(inv):
    """What only the stage checked before (an image, unknown keys, a vLLM fraction above the share, an earlier
    engine with no readiness path) is refused before any change."""
    cases = [
        ({"image": None}, "image is required"),
        ({"gpu_memory": 10}, "unknown key(s) gpu_memory"),
        (
            {"args": ["--gpu-memory-utilization", "0.9"]},
            "--gpu-memory-utilization 0.9 is above the engine's share",
        ),
    ]
    for change, message in cases:
        inv.globals["workloads_engines"] = [{k: v for k, v in {**VLLM, **change}.items() if v is not None}]
        (problem,) = inv.check()[1]
        assert message in problem.why, (change, problem)
    later = {"name": "ollama", "image": "ollama/ollama:0.12.3", "node": "vm-gpu", "gpu_memory_percent": 40}
    inv.globals["workloads_engines"] = [{**VLLM, "readiness_path": None}, later]
    (problem,) = inv.check()[1]
    assert "give it port and readiness_path" in problem.why


def test_an_engine_may_name_its_card_by_uuid_before_the_guests_are_known(inv):
    inv.globals["workloads_engines"] = [{**VLLM, "gpus": [UUID]}]
    assert inv.messages() == []
