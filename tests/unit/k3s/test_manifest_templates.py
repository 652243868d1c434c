"""The roles' manifest templates (roles/*/templates/*.yaml.j2) as Ansible renders them, on this machine (no lab).

The HelmCharts of stages hami and monitoring must keep the bytes gpulab wrote when it dumped them in Python
(gpulab.hami.dump_manifest): k3s's helm controller runs helm again whenever the file changes, so a byte of
difference would reinstall the charts of every lab once. The sharing proof's pods must be the objects the
proof reads back (names, label, card, share), and stage workloads' webhook probe the pod its dry run sends.
The engines' objects (workloads/templates/engine.yaml.j2) must keep the bytes gpulab wrote when it dumped them
in Python (tests/unit/k3s/data/engines-python-dump.txt, written by that code): a changed file would restart
every engine. The plan renders that template itself (gpulab.k8s.template) and validates what it placed;
Ansible's lookup must give the same text from the same data, so the file is the role's template as much as the
plan's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible_runs import ROOT, ansible_playbook

from gpulab import hami, monitoring
from gpulab.k8s import workloads

from .engine_cases import ADDRESSES, ENGINES, GOLDEN, GPUS, WAIT_IMAGE

HAMI_DEFAULTS = yaml.safe_load((ROOT / "roles/hami/defaults/main.yml").read_text())
MONITORING_DEFAULTS = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
UUID = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"


def hami_values(**over):
    """The values and manifest of stage hami from the role's defaults, the variables passed as tasks/chart.yml
    passes them (hami.ROLE_VALUE_ARGS, checked against the role in test_hami_chart_fixture)."""
    d = {**HAMI_DEFAULTS, **over}
    return hami.render(d["hami_chart_version"], **{arg: d[var] for arg, var in hami.ROLE_VALUE_ARGS.items()})


MONITORING_ARGS = {
    "prometheus_version": MONITORING_DEFAULTS["monitoring_prometheus_chart_version"],
    "grafana_version": MONITORING_DEFAULTS["monitoring_grafana_chart_version"],
    "hami_version": MONITORING_DEFAULTS["monitoring_hami_version"],
    "webui_version": MONITORING_DEFAULTS["monitoring_webui_chart_version"],
    "server": "192.168.1.50",
    "gpu_nodes": ["192.168.1.52"],
    "namespace": "monitoring",
    "webui": True,
    "image_registry": "mirror.lan:5000",
}


def render(tmp_path: Path, cases: dict[str, tuple[str, dict]]) -> dict[str, str]:
    """Each case (template under roles/, its variables) rendered by ansible.builtin.template's lookup, as the
    roles render them, in one ansible-playbook run on localhost."""
    tasks = [
        {
            "name": name,
            "ansible.builtin.set_fact": {
                name: f"{{{{ lookup('ansible.builtin.template', '{ROOT / 'roles' / tpl}') }}}}"
            },
            "vars": variables,
        }
        for name, (tpl, variables) in cases.items()
    ]
    out = tmp_path / "rendered.json"
    names = ", ".join(f"{n!r}: {n}" for n in cases)
    tasks.append({"ansible.builtin.copy": {"content": f"{{{{ {{{names}}} | to_json }}}}", "dest": str(out)}})
    play = tmp_path / "render.yml"
    play.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    proc = ansible_playbook(
        "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", play
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


#: (namespace, token) of the Hugging Face token Secret: plain, and strings YAML would read as something else
TOKEN_CASES = [
    ("default", "hf_AbCdEfGh0123456789"),
    ("on", "yes"),
    ("ai", "12:34"),
    ("x", "a'b\"c #d"),
    ("1", ""),
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("templates")
    defaults, _ = hami_values()
    odd = {"a": {"b": "two\nlines", "empty": "", "on": "on"}, "n": 1.5, "yes": True}
    chart = lambda **v: {**HAMI_DEFAULTS, **v}  # noqa: E731
    mon = monitoring.render(**MONITORING_ARGS)
    mon_vars = {
        "monitoring_namespace": "monitoring",
        "monitoring_charts": {"values": mon["values"]},
        **{k: v for k, v in MONITORING_DEFAULTS.items() if k.endswith(("_chart_version", "_chart_repo"))},
        "monitoring_chart_pins": yaml.safe_load((ROOT / "roles/monitoring/vars/main.yml").read_text())[
            "monitoring_chart_pins"
        ],
    }
    proof_vars = {
        "hami_proof_namespace": "on",
        "hami_proof_image": "registry.lan:5000/ubuntu:24.04",
        "hami_proof_card": {"uuid": UUID},
        "hami_proof_batch": [
            {"name": "gpulab-hami-proof-a", "percent": "40"},
            {"name": "gpulab-hami-proof-b", "percent": 40},
            {"name": "gpulab-hami-proof-c", "percent": "30"},
        ],
    }
    cases = {
        "hami": ("hami/templates/helmchart.yaml.j2", chart(hami_chart={"values": defaults})),
        "hami_odd": (
            "hami/templates/helmchart.yaml.j2",
            chart(
                hami_chart={"values": odd},
                hami_chart_version="2.10",
                hami_release_name="on",
                hami_namespace="gpu",
                hami_chart_repo="oci://registry.lan/charts",
            ),
        ),
        **{
            f"monitoring_{name.replace('-', '_')}": (
                "monitoring/templates/helmchart.yaml.j2",
                {**mon_vars, "monitoring_chart": name},
            )
            for name in ("prometheus", "grafana", "hami-webui")
        },
        "proof": ("hami/templates/proof-pods.yaml.j2", proof_vars),
        "probe": (
            "workloads/templates/webhook-probe.yaml.j2",
            {"workloads_namespace": "ai", "workloads_wait_image": "busybox:1.36"},
        ),
        **{
            f"token_{i}": (
                "workloads/templates/hf-token-secret.yaml.j2",
                {"workloads_hf_namespace": namespace, "workloads_hf_token": token},
            )
            for i, (namespace, token) in enumerate(TOKEN_CASES)
        },
    }
    return {"got": render(tmp, cases), "hami": hami_values()[1], "odd": odd, "monitoring": mon}


def test_the_hami_helmchart_keeps_the_bytes_of_the_python_rendering(rendered):
    assert rendered["got"]["hami"] == rendered["hami"]


def test_the_hami_helmchart_quotes_what_yaml_would_read_otherwise(rendered):
    """A version like 2.10 must stay the string 2.10 (not the float 2.1), a release named on the string on."""
    got = rendered["got"]["hami_odd"]
    want = hami.dump_manifest(
        hami.helmchart(rendered["odd"], chart_version="2.10", name="on", namespace="gpu",
                       repo="oci://registry.lan/charts")
    )  # fmt: skip
    assert got == want
    doc = next(iter(yaml.safe_load_all(got)))
    assert doc["spec"]["version"] == "2.10" and doc["metadata"]["name"] == "on"
    assert yaml.safe_load(doc["spec"]["valuesContent"]) == rendered["odd"]


@pytest.mark.parametrize("name", ["prometheus", "grafana", "hami-webui"])
def test_the_monitoring_helmcharts_keep_the_bytes_of_the_python_rendering(rendered, name):
    assert (
        rendered["got"][f"monitoring_{name.replace('-', '_')}"] == rendered["monitoring"]["manifests"][name]
    )


def test_the_proof_pods_ask_their_share_of_the_card(rendered):
    docs = [d for d in yaml.safe_load_all(rendered["got"]["proof"]) if d]
    assert [d["metadata"]["name"] for d in docs] == [f"gpulab-hami-proof-{x}" for x in "abc"]
    for doc, share in zip(docs, (40, 40, 30), strict=True):
        assert doc["apiVersion"] == "v1" and doc["kind"] == "Pod"
        assert doc["metadata"]["namespace"] == "on"
        assert doc["metadata"]["labels"] == {
            "gpulab.io/hami-proof": "run",
            "app.kubernetes.io/managed-by": "gpulab",
        }
        assert doc["metadata"]["annotations"] == {"nvidia.com/use-gpuuuid": UUID}
        assert doc["spec"]["restartPolicy"] == "Never" and doc["spec"]["terminationGracePeriodSeconds"] == 0
        (container,) = doc["spec"]["containers"]
        assert container["image"] == "registry.lan:5000/ubuntu:24.04"
        assert container["command"] == [
            "sh", "-c", "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits; sleep 3600"
        ]  # fmt: skip
        assert container["env"] == [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}]
        assert container["resources"] == {
            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": share}
        }


def test_the_webhook_probe_asks_one_vgpu_share(rendered):
    """Stage workloads' server dry run: a pod HAMi's webhook must send to its scheduler."""
    assert yaml.safe_load(rendered["got"]["probe"]) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpulab-webhook-probe", "namespace": "ai"},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": "busybox:1.36",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 1}},
                }
            ]
        },
    }


def golden_engines() -> dict[str, str]:
    """Each engine's manifest as gpulab wrote it before the template (data/engines-python-dump.txt)."""
    head = "# Managed by gpulab (role workloads): engine "
    parts = GOLDEN.read_text().split(head)[1:]
    return {part.split("\n", 1)[0]: head + part for part in parts}


@pytest.fixture(scope="module")
def engine_plan():
    return workloads.plan(ENGINES, GPUS, k3s_version=K3S, wait_image=WAIT_IMAGE, addresses=ADDRESSES)


K3S = yaml.safe_load((ROOT / "inventory/demo/group_vars/all/main.yml").read_text())["k3s_version"]


def test_the_token_secret_keeps_the_bytes_of_to_nice_yaml(rendered):
    """The Secret stage workloads placed with to_nice_yaml before it was a template: a changed file would make
    k3s apply it again on every lab once."""
    for i, (namespace, token) in enumerate(TOKEN_CASES):
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": "gpulab-hf-token", "namespace": namespace}, "stringData": {"token": token}}  # fmt: skip
        was = yaml.safe_dump(secret, indent=4, allow_unicode=True, default_flow_style=False)
        assert rendered["got"][f"token_{i}"] == was, (namespace, token)
        assert yaml.safe_load(rendered["got"][f"token_{i}"]) == secret


def test_the_engine_manifests_keep_the_bytes_of_the_python_dump(engine_plan):
    """vLLM with a share, cache claim, hf_token and a kube-vip address; a second engine on the card that waits
    (hostPath cache, ClusterIP); a third waiting for both; ServiceLB; no port, odd strings, two cards."""
    got = {e["name"]: e["manifest"] for e in engine_plan["engines"]}
    assert got == golden_engines()


def test_ansible_renders_the_engine_template_as_the_plan_does(engine_plan, tmp_path):
    """The role's template through ansible.builtin.template's lookup, from the plan's data: the same bytes."""
    cases = {
        f"engine_{e['name'].replace('-', '_')}": (
            "workloads/templates/engine.yaml.j2",
            {"workloads_engine": e},
        )
        for e in engine_plan["engines"]
    }
    got = render(tmp_path, cases)
    want = golden_engines()
    assert {e["name"]: got[f"engine_{e['name'].replace('-', '_')}"] for e in engine_plan["engines"]} == want
