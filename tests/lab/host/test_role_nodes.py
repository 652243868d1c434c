"""Stage host on two nodes (two of the lab's node hosts on the loopback, each with the reference card): every
node of group proxmox gets the role, and the reboots go one node at a time (playbooks/host.yml is serial).

Needs root (mount namespaces and overlays), as tests/lab/host/test_role.py.
"""

import json
import re

import pytest
from unit.host.conftest import NODE_HOST, PlaybookNode

pytestmark = NODE_HOST


@pytest.fixture
def nodes(tmp_path):
    started = []
    try:
        for name in ("pve", "pve2"):
            started.append(PlaybookNode(tmp_path / name).start())
        yield started
    finally:
        for node in started:
            node.stop()


def two_node_inventory(nodes, path):
    """Both node hosts in group proxmox (node names pve and pve2), as PlaybookNode describes one."""
    hosts = {}
    for name, node in zip(("pve", "pve2"), nodes, strict=True):
        one = json.loads(node.inventory().read_text())["all"]["children"]["proxmox"]["hosts"]["pve"]
        hosts[name] = {**one, "pve_node": name}
    path.write_text(json.dumps({"all": {"children": {"proxmox": {"hosts": hosts}}}}))
    return path


def played(node):
    """When the stand-in commands ran on a node since it first booted (the times of this test's calls)."""
    booted = node.host.boots()[0]["time"]
    return [c["time"] for c in node.host.calls() if c["time"] > booted]


def test_every_node_is_configured_and_the_reboots_go_one_at_a_time(nodes, tmp_path):
    pve, pve2 = nodes
    inventory = two_node_inventory(nodes, tmp_path / "inventory.json")
    # PlaybookNode.play runs host.yml on its own one-node inventory: point it at both nodes
    pve.inventory = lambda: inventory
    rc, out, _recap = pve.play(extra={"pve_host_reboot_allowed": True})
    assert rc == 0, out
    assert "Rebooting pve for:" in out and "Rebooting pve2 for:" in out
    for node in nodes:
        assert [b["state"] for b in node.host.boots()][-1] == "vfio"
        assert sum(c.startswith("shutdown") for c in node.calls()) == 1
    # pve is rebooted, back and proven before anything runs on pve2: the play goes one node at a time
    pve_events = [b["time"] for b in pve.host.boots()] + played(pve)
    assert played(pve2) and min(played(pve2)) > max(pve_events)
    # a second run changes nothing on either node
    rc, out, _recap = pve.play(extra={"pve_host_reboot_allowed": True})
    assert rc == 0, out
    recap = dict(re.findall(r"\b(pve2?) : ok=\d+ changed=(\d+)", out))
    assert recap == {"pve": "0", "pve2": "0"}, out
