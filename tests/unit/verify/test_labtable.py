"""The lab table joins PVE's VM configs, nvidia-smi's cards and k3s's nodes into one row per VM."""

import json
from pathlib import Path

from gpulab import labtable

# The conditions of a real node (kubectl get node -o json, .status.conditions).
SAMPLES = Path(__file__).parent / "data"

VMS = [
    {"name": "vm-1", "node": "pve", "vmid": 100, "address": "192.168.100.53", "gpu": None},
    {"name": "vm-gpu", "node": "pve2", "vmid": 102, "address": "192.168.100.55", "gpu": "rtx3090"},
]
PVE = {
    "vm-1": {
        "status": "running",
        "node": "pve",
        "config": {
            "cores": 4,
            "memory": "4096",
            "scsi0": "local-zfs:vm-100-disk-0,iothread=1,size=60G",
            "onboot": 1,
            "ide2": "local-zfs:vm-100-cloudinit,media=cdrom,size=4M",
        },
    },
    "vm-gpu": {
        "status": "running",
        "node": "pve2",
        "config": {
            "cores": 8,
            "memory": "16384",
            "balloon": 0,
            "machine": "q35",
            "bios": "ovmf",
            "onboot": 0,
            "scsi0": "local-zfs:vm-102-disk-1,size=200G",
            "hostpci0": "mapping=rtx3090,pcie=1",
        },
    },
}
GPUS = {
    "vm-gpu": [{"name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576, "driver_version": "580.95.05"}]
}


def node(name, ready="True", gpus=None, server=False):
    labels = {"node-role.kubernetes.io/control-plane": "true"} if server else {}
    status = {
        "conditions": [{"type": "Ready", "status": ready}],
        "nodeInfo": {"kubeletVersion": "v1.33.5+k3s1"},
    }
    if gpus is not None:
        status["allocatable"] = {"nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def test_rows_join_every_source():
    table = labtable.rows(VMS, PVE, GPUS, [node("vm-1", server=True), node("vm-gpu", gpus=10)])
    assert table[0] == {
        "vm": "vm-1",
        "vmid": "100",
        "node": "pve",
        "address": "192.168.100.53",
        "shape": "4 / 4096 MiB / 60G",
        "platform": "i440fx / seabios",
        "gpu": "-",
        "onboot": "yes",
        "driver": "-",
        "k3s": "Ready control-plane v1.33.5+k3s1",
        "hami": "-",
        "shares": "-",
    }
    assert table[1]["shape"] == "8 / 16384 MiB fixed / 200G"
    assert table[1]["platform"] == "q35 / ovmf"
    assert table[1]["gpu"] == "rtx3090 (mapping=rtx3090,pcie=1)"
    assert table[1]["onboot"] == "no"
    assert table[1]["driver"] == "NVIDIA GeForce RTX 3090, 24576 MiB, 580.95.05"
    assert table[1]["k3s"] == "Ready agent v1.33.5+k3s1"
    assert table[1]["hami"] == "10"


def test_real_node_conditions_sample_reads_ready():
    conditions = json.loads((SAMPLES / "kubectl-node-conditions.json").read_text())
    n = {"metadata": {"name": "vm-2"}, "status": {"conditions": conditions}}
    [row] = labtable.rows([{"name": "vm-2", "vmid": 101}], {}, {}, [n])
    assert row["k3s"].startswith("Ready")
    assert row["shape"] == "absent"


def test_not_ready_and_missing_node():
    table = labtable.rows(VMS, PVE, {}, [node("vm-1", ready="False")])
    assert table[0]["k3s"].startswith("NotReady")
    assert table[1]["k3s"] == "-"


def test_markdown_and_text_render_every_row():
    table = labtable.rows(VMS, PVE, GPUS, [])
    md = labtable.markdown(table).splitlines()
    assert md[0].startswith("| VM | id | PVE node | address |")
    assert md[3].startswith(
        "| vm-gpu | 102 | pve2 | 192.168.100.55 | 8 / 16384 MiB fixed / 200G | q35 / ovmf |"
    )
    lines = labtable.text(table)
    assert len(lines) == 3 and lines[2].startswith("vm-gpu  102  pve2      192.168.100.55")


def test_write_reports_change_only_when_content_differs(tmp_path):
    table = labtable.rows(VMS, PVE, GPUS, [])
    changed, paths = labtable.write(tmp_path, table, dry_run=True)
    assert changed and not any(p.exists() for p in paths)
    assert labtable.write(tmp_path, table)[0] is True
    assert json.loads((tmp_path / "lab-table.json").read_text()) == table
    assert labtable.write(tmp_path, table)[0] is False
    table[0]["address"] = "192.168.100.60"
    assert labtable.write(tmp_path, table)[0] is True


class RecordingClient:
    """Answers cluster/resources and per-VM config reads from PVE above, recording each path."""

    def __init__(self):
        self.paths = []

    def get(self, path, **params):
        self.paths.append(path)
        if path == "cluster/resources":
            return [
                {"vmid": 100, "node": "pve", "status": "running"},
                {"vmid": 102, "node": "pve2", "status": "stopped"},
            ]
        vmid = int(path.split("/")[3])
        return PVE["vm-1" if vmid == 100 else "vm-gpu"]["config"]


def test_a_config_already_read_in_this_run_is_not_read_again():
    client = RecordingClient()
    known = [dict(VMS[0], config=PVE["vm-1"]["config"]), VMS[1]]
    found = labtable.read_vm_configs(client, known)
    assert client.paths == ["cluster/resources", "nodes/pve2/qemu/102/config"]
    assert found == {
        "vm-1": {"status": "running", "node": "pve", "config": PVE["vm-1"]["config"]},
        "vm-gpu": {"status": "stopped", "node": "pve2", "config": PVE["vm-gpu"]["config"]},
    }
    assert labtable.rows(known, found, GPUS, []) == labtable.rows(
        VMS, PVE | {"vm-gpu": found["vm-gpu"]}, GPUS, []
    )


def test_the_node_column_is_where_pve_lists_the_vm():
    # moved by hand to another node than the inventory's vm_node: the table says where it is
    client = RecordingClient()
    moved = [dict(VMS[1], node="pve")]
    [row] = labtable.rows(moved, labtable.read_vm_configs(client, moved), GPUS, [])
    assert row["node"] == "pve2" and client.paths[-1] == "nodes/pve2/qemu/102/config"
    [gone] = labtable.rows(
        [dict(VMS[0], vmid=150)], labtable.read_vm_configs(client, [VMS[0] | {"vmid": 150}]), {}, []
    )
    assert (gone["node"], gone["shape"]) == ("-", "absent")


def test_an_absent_vm_is_absent_even_with_a_config_from_earlier():
    client = RecordingClient()
    gone = [dict(VMS[0], vmid=150, config=PVE["vm-1"]["config"])]
    assert labtable.read_vm_configs(client, gone) == {"vm-1": {}}
    assert client.paths == ["cluster/resources"]


def test_the_card_shares_name_each_pod_its_share_and_the_free_percent():
    uuid = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
    register = json.dumps(
        [{"id": uuid, "count": 10, "devmem": 24576, "devcore": 100, "type": "NVIDIA GeForce RTX 3090"}]
    )
    gpu = node("vm-gpu", gpus=10)
    gpu["metadata"]["annotations"] = {"hami.io/node-nvidia-register": register}

    def pod(name, mib, phase="Running"):
        allocated = f"{uuid},NVIDIA,{mib},0:;"
        meta = {
            "name": name,
            "namespace": "default",
            "annotations": {"hami.io/vgpu-devices-allocated": allocated},
        }
        return {"metadata": meta, "status": {"phase": phase}}

    pods = [pod("vllm-1", 11059), pod("ollama-2", 11059), pod("done-3", 4096, phase="Succeeded")]
    pods.append({"metadata": {"name": "plain", "namespace": "default"}, "status": {"phase": "Running"}})
    table = labtable.rows(VMS, PVE, GPUS, [node("vm-1", server=True), gpu], pods)
    assert table[0]["shares"] == "-"
    assert table[1]["shares"] == "GPU-e1924eea: default/vllm-1 45 %, default/ollama-2 45 %, 10 % free"
    assert labtable.rows(VMS, PVE, GPUS, [gpu])[1]["shares"] == "GPU-e1924eea: 100 % free"


def test_a_vm_that_is_down_says_so_in_its_k3s_column():
    # server stopped through PVE: down, then the status its node last had in the cluster
    stopped = PVE | {"vm-1": PVE["vm-1"] | {"status": "stopped"}}
    nodes = [node("vm-1", ready="Unknown", server=True), node("vm-gpu", gpus=10)]
    table = labtable.rows(VMS, stopped, GPUS, nodes)
    assert table[0]["k3s"] == "down (VM stopped), NotReady control-plane v1.33.5+k3s1"
    assert table[1]["k3s"] == "Ready agent v1.33.5+k3s1"
    # running in PVE but not answering the controller (the k3s stages' probe), and not a k3s node
    [row] = labtable.rows([VMS[0] | {"down": True}], PVE, {}, [])
    assert row["k3s"] == "down (not answering)"
    # a VM PVE does not list is absent, not down
    [gone] = labtable.rows([VMS[0]], {}, {}, [])
    assert gone["k3s"] == "-"


def test_the_kubeconfig_context_is_named_for_each_node_in_the_json_the_markdown_and_the_page():
    table = labtable.rows(VMS, PVE, GPUS, [node("vm-gpu", gpus=10)], kube_context="demo")
    assert "context" not in table[0] and table[1]["context"] == "demo"  # vm-1 is no node here
    out = labtable.files(table)
    assert json.loads(out["lab-table.json"])[1]["context"] == "demo"
    assert "- kubectl: context demo (kubectl --context demo get nodes)" in out["lab-table.md"]
    assert 'data-context="demo"' in out["lab-table.html"]
    assert "context" not in labtable.files(labtable.rows(VMS, PVE, GPUS, [node("vm-gpu")]))["lab-table.md"]


def test_each_lan_engine_is_listed_with_its_url_model_node_and_share_in_the_json_the_markdown_and_the_page():
    """The endpoints stage workloads called from the controller (role workloads, lan_proof.yml) are listed in
    their node's row of the JSON, under the Markdown table and on the page."""
    engine = {"name": "vllm", "url": "http://192.168.100.55:8000/v1", "model": "Qwen/Qwen3-0.6B", "node": "vm-gpu",
              "cards": ["GPU-6f2a1c3e-0d4b-4c6a-9e1f-2b3c4d5e6f70"], "gpu_memory_percent": 45}  # fmt: skip
    table = labtable.rows(VMS, PVE, GPUS, [node("vm-gpu", gpus=10)], kube_context="demo", endpoints=[engine])
    assert "endpoints" not in table[0]
    listed = {
        "name": "vllm",
        "url": engine["url"],
        "model": "Qwen/Qwen3-0.6B",
        "share": "45 % of GPU-6f2a1c3e",
    }
    out = labtable.files(table)
    assert json.loads(out["lab-table.json"])[1]["endpoints"] == [listed]
    line = "- engine vllm (Qwen/Qwen3-0.6B, on vm-gpu, 45 % of GPU-6f2a1c3e): http://192.168.100.55:8000/v1"
    assert line in out["lab-table.md"]
    assert (
        'href="http://192.168.100.55:8000/v1"' in out["lab-table.html"]
        and "Qwen/Qwen3-0.6B" in out["lab-table.html"]
    )


def test_open_webui_is_listed_as_a_front_end_in_the_json_the_markdown_and_the_page():
    """Role workloads' Open WebUI (workloads_open_webui, tasks/open_webui.yml) is an endpoint of the server's row:
    its kind and its own share text, not a card share."""
    webui = {"name": "open-webui", "kind": "front end", "url": "http://192.168.100.53:8080",
             "model": "Open WebUI for vllm", "node": "vm-1", "share": "no GPU"}  # fmt: skip
    table = labtable.rows(VMS, PVE, GPUS, [node("vm-gpu", gpus=10)], endpoints=[webui])
    listed = {"name": "open-webui", "kind": "front end", "url": webui["url"], "model": "Open WebUI for vllm",
              "share": "no GPU"}  # fmt: skip
    out = labtable.files(table)
    assert json.loads(out["lab-table.json"])[0]["endpoints"] == [listed]
    line = "- front end open-webui (Open WebUI for vllm, on vm-1, no GPU): http://192.168.100.53:8080"
    assert line in out["lab-table.md"]
    assert 'href="http://192.168.100.53:8080"' in out["lab-table.html"]


MONITORING = {
    "prometheus": "http://192.168.100.53:30090",
    "grafana": "http://192.168.100.53:30300",
    "dashboard": "http://192.168.100.53:30300/d/hami-vgpu-metrics",
    "webui": "http://192.168.100.53:31555",
}


def test_the_monitoring_uis_are_endpoints_of_the_servers_row_in_the_json_the_markdown_and_the_page():
    """Stage monitoring's UIs (monitoring_urls, the links verify passes) are endpoints of kind monitoring of the
    VM whose address they are served at, like the engines; the dashboard's link stays a link, and a UI's link is
    shown once, as its endpoint."""
    nodes = [node("vm-1", server=True), node("vm-gpu", gpus=10)]
    table = labtable.rows(VMS, PVE, GPUS, nodes, links=MONITORING)
    assert "endpoints" not in table[1]
    listed = [
        {"name": "prometheus", "kind": "monitoring", "url": MONITORING["prometheus"], "model": "Prometheus",
         "share": "no GPU"},
        {"name": "grafana", "kind": "monitoring", "url": MONITORING["grafana"], "model": "Grafana",
         "share": "no GPU"},
        {"name": "hami-webui", "kind": "monitoring", "url": MONITORING["webui"], "model": "HAMi-WebUI",
         "share": "no GPU"},
    ]  # fmt: skip
    out = labtable.files(table, MONITORING)
    assert json.loads(out["lab-table.json"])[0]["endpoints"] == listed
    md = out["lab-table.md"]
    assert "- monitoring prometheus (Prometheus, on vm-1, no GPU): http://192.168.100.53:30090\n" in md
    assert "- monitoring hami-webui (HAMi-WebUI, on vm-1, no GPU): http://192.168.100.53:31555\n" in md
    assert "- dashboard: http://192.168.100.53:30300/d/hami-vgpu-metrics\n" in md  # the links as before
    assert md.count("http://192.168.100.53:30090") == 1 and "- prometheus:" not in md
    page = out["lab-table.html"]
    for url in MONITORING.values():
        assert f'href="{url}"' in page
    assert "monitoring grafana (Grafana, on vm-1, no GPU)" in page


def test_monitoring_without_hami_webui_lists_prometheus_and_grafana_beside_the_engines():
    links = {k: v for k, v in MONITORING.items() if k != "webui"}
    engine = {"name": "vllm", "url": "http://192.168.100.55:8000/v1", "model": "Qwen/Qwen3-0.6B", "node": "vm-gpu",
              "cards": ["GPU-6f2a1c3e"], "gpu_memory_percent": 45}  # fmt: skip
    table = labtable.rows(
        VMS, PVE, GPUS, [node("vm-1", server=True), node("vm-gpu")], endpoints=[engine], links=links
    )
    assert [e["name"] for e in table[0]["endpoints"]] == ["prometheus", "grafana"]
    assert [e["name"] for e in table[1]["endpoints"]] == ["vllm"]


def test_monitoring_at_an_address_no_vm_holds_is_listed_on_the_first_server():
    """With HA the UIs may be reached at kube-vip's address: they go to the first control-plane VM's row. Without
    a cluster (links from elsewhere, or none of the monitoring keys) nothing is listed."""
    links = {"prometheus": "http://192.168.100.60:30090", "Grafana": "http://x:1"}
    nodes = [node("vm-1", server=True), node("vm-gpu")]
    (prom,) = labtable.monitoring_endpoints(links, VMS, nodes)
    assert prom["node"] == "vm-1" and prom["url"] == "http://192.168.100.60:30090"
    assert labtable.monitoring_endpoints(links, VMS, []) == []
    assert labtable.monitoring_endpoints({"Grafana": "http://192.168.100.53:1"}, VMS, nodes) == []
    out = labtable.files(labtable.rows(VMS, PVE, GPUS, nodes), {"Grafana": "http://x:1"})
    assert "- Grafana: http://x:1\n" in out["lab-table.md"]  # any other link stays a link
