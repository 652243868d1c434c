"""lab-table.html in a real headless browser (the distribution's Chromium): the page that gpulab.labtable writes
beside lab-table.md and lab-table.json, for the demo lab and the cluster lab, shows each Proxmox node with its VMs,
their addresses and k3s roles, the cards passed through, each card's shares and what is free, and the problems;
its DOM (--dump-dom) and a screenshot (--screenshot) are what is checked.

The rows are made by labtable.rows from each inventory's own VMs (host_vars: id, node, shape, address, card) with
the configs PVE, nvidia-smi and k3s report for them, as the verify stage gathers them (no lab is started)."""

from pathlib import Path

import yaml
from browser import Dom, chromium, png

from gpulab import labtable

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "10.77.0"
CARDS = {
    "rtx3090": {
        "uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145",
        "name": "NVIDIA GeForce RTX 3090",
        "mib": 24576,
    },
    "rtx4090": {
        "uuid": "GPU-6b1e3c9a-0d4f-4e55-9a10-3f2d7c8b4a61",
        "name": "NVIDIA GeForce RTX 4090",
        "mib": 24564,
    },
}


def inventory_vms(name):
    """The inventory's VMs as the verify stage lists them, with the config PVE would hold for each."""
    inv = ROOT / "inventory" / name
    defaults = yaml.safe_load((inv / "group_vars" / "vms.yml").read_text()) or {}
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())["all"]["children"]
    servers = set((hosts["k3s_cluster"]["children"]["k3s_server"]["hosts"]) or {})
    vms, pve = [], {}
    for vm in hosts["vms"]["hosts"]:
        v = {**defaults, **(yaml.safe_load((inv / "host_vars" / f"{vm}.yml").read_text()) or {})}
        node = v.get("vm_node") if "{{" not in str(v.get("vm_node", "{{")) else "pve"
        address = str(v["vm_address"]).replace("{{ labsim_prefix }}", PREFIX)
        vms.append({"name": vm, "node": node, "vmid": v["vm_id"], "address": address, "gpu": v.get("vm_gpu")})
        config = {"cores": v.get("vm_cores", 2), "memory": str(v.get("vm_memory_mib", 2048)),
                  "scsi0": f"local-zfs:vm-{v['vm_id']}-disk-0,size={v.get('vm_disk_gb', 32)}G",
                  "machine": v.get("vm_machine", "i440fx"), "onboot": int(bool(v.get("vm_onboot", False)))}  # fmt: skip
        if v.get("vm_gpu"):
            config.update(balloon=0, bios="ovmf", hostpci0=f"mapping={v['vm_gpu']},pcie=1")
        pve[vm] = {"status": "running", "node": node, "config": config}
    return vms, pve, servers


def k8s(vms, servers, shares):
    """The k3s nodes (Ready, roles, HAMi's register annotation on GPU nodes) and the pods holding `shares`
    (card id -> [(pod, percent)])."""
    import json

    nodes, pods = [], []
    for vm in vms:
        labels = {"node-role.kubernetes.io/control-plane": "true"} if vm["name"] in servers else {}
        status = {
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.33.5+k3s1"},
        }
        meta = {"name": vm["name"], "labels": labels, "annotations": {}}
        if vm["gpu"]:
            card = CARDS[vm["gpu"]]
            status["allocatable"] = {"nvidia.com/gpu": "10"}
            meta["annotations"]["hami.io/node-nvidia-register"] = json.dumps(
                [{"id": card["uuid"], "count": 10, "devmem": card["mib"], "devcore": 100, "type": card["name"],
                  "health": True}])  # fmt: skip
            for pod, percent in shares.get(vm["gpu"], []):
                mib = card["mib"] * percent // 100
                pods.append({"metadata": {"namespace": "default", "name": pod, "annotations": {
                    "hami.io/vgpu-devices-allocated": f"{card['uuid']},NVIDIA,{mib},0:;"}},
                    "status": {"phase": "Running"}})  # fmt: skip
        nodes.append({"metadata": meta, "status": status})
    return nodes, pods


def lab_page(name, shares, tmp_path, links=None, down=()):
    vms, pve, servers = inventory_vms(name)
    gpus = {
        vm["name"]: [{"uuid": CARDS[vm["gpu"]]["uuid"], "name": CARDS[vm["gpu"]]["name"],
                      "memory_total_mib": CARDS[vm["gpu"]]["mib"], "driver_version": "580.95.05"}]
        for vm in vms if vm["gpu"]
    }  # fmt: skip
    nodes, pods = k8s(vms, servers, shares)
    nodes = [n for n in nodes if n["metadata"]["name"] not in down]
    table = labtable.rows(vms, pve, gpus, nodes, pods)
    changed, paths = labtable.write(tmp_path, table, links=links)
    assert changed and tmp_path / "lab-table.html" in paths
    return table, tmp_path / "lab-table.html"


def check_page(page, tmp_path, table):
    dom = Dom(chromium("--dump-dom", page.as_uri(), tmp_path=tmp_path))
    shot = tmp_path / "shot.png"
    chromium("--window-size=1280,1000", f"--screenshot={shot}", page.as_uri(), tmp_path=tmp_path)
    width, height, colours = png(shot)
    assert (width, height) == (1280, 1000) and colours > 20, "the screenshot shows a drawn page"
    assert not [e for e in dom.elements if e["tag"] in ("script", "link", "img") or "src" in e["attrs"]]
    for row in table:
        (vm,) = dom.find("vm", **{"data-vm": row["vm"]})
        (node,) = [p for p in vm["parents"] if "pve" in p["attrs"].get("class", "")]
        assert node["attrs"]["data-node"] == row["node"]
        assert row["address"] in vm["text"]
    return dom


def test_the_demo_lab_s_page_shows_its_vms_roles_card_and_shares(tmp_path):
    shares = {"rtx3090": [("vllm-0", 40), ("ollama-0", 45)]}
    links = {"Grafana": f"http://{PREFIX}.53:30300/d/hami-vgpu-metrics"}
    table, page = lab_page("demo", shares, tmp_path, links=links)
    dom = check_page(page, tmp_path, table)
    assert [e["attrs"]["data-node"] for e in dom.find("pve")] == ["pve"]
    roles = {e["attrs"]["data-vm"]: e["attrs"]["data-role"] for e in dom.find("vm")}
    assert roles == {"vm-1": "server", "vm-2": "agent", "vm-gpu": "agent"}
    (card,) = dom.find("card")
    assert card["attrs"]["data-uuid"] == CARDS["rtx3090"]["uuid"][:12]
    assert [p["attrs"]["class"] for p in card["parents"] if "vm" in p["attrs"].get("class", "").split()] == [
        "vm agent"
    ]
    assert "rtx3090 (mapping=rtx3090,pcie=1)" in card["text"] and "580.95.05" in card["text"]
    assert [(s["attrs"]["data-pod"], s["attrs"]["data-percent"]) for s in dom.find("share")] == [
        ("default/vllm-0", "40"), ("default/ollama-0", "45")]  # fmt: skip
    assert [f["attrs"]["data-percent"] for f in dom.find("free")] == ["15"]
    (problems,) = dom.find(id="problems")
    assert "none" in problems["text"]
    (reached,) = dom.find(id="links")
    assert links["Grafana"] in reached["text"]


def test_the_cluster_lab_s_page_shows_both_nodes_both_cards_and_its_problems(tmp_path):
    shares = {"rtx3090": [("vllm-0", 100)], "rtx4090": [("ollama-0", 30)]}
    table, page = lab_page("demo-cluster", shares, tmp_path, down=("server-2",))
    dom = check_page(page, tmp_path, table)
    assert [e["attrs"]["data-node"] for e in dom.find("pve")] == ["pve", "pve2"]
    roles = {e["attrs"]["data-vm"]: e["attrs"]["data-role"] for e in dom.find("vm")}
    assert roles == {"server-1": "server", "server-2": "-", "server-3": "server", "agent-1": "agent",
                     "gpu-3090": "agent", "gpu-4090": "agent"}  # fmt: skip
    cards = {c["attrs"]["data-uuid"]: c for c in dom.find("card")}
    assert set(cards) == {CARDS["rtx3090"]["uuid"][:12], CARDS["rtx4090"]["uuid"][:12]}
    assert [f["attrs"]["data-percent"] for f in dom.find("free")] == ["0", "70"]
    (problems,) = dom.find(id="problems")
    items = [e["text"] for e in dom.elements if e["tag"] == "li" and problems in e["parents"]]
    assert items == [
        "server-2: not a k3s node",
        f"gpu-3090: card {CARDS['rtx3090']['uuid'][:12]} has no memory left to share",
    ]
    assert "bad" in dom.find("vm", **{"data-vm": "server-2"})[0]["attrs"]["class"].split()
    assert not dom.find(id="links")
