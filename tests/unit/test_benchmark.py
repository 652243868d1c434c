"""scripts/benchmark.py's pure parts: request counting, inventories and their fixtures, the scale table.

Nothing here starts a lab or times anything; the benchmark itself is a measurement, run by hand.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpulab_benchmark", ROOT / "scripts" / "benchmark.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def req(method: str, path: str, time: float = 0.0) -> dict:
    return {"method": method, "path": path, "time": time}


REQS = [
    req("GET", "/api2/json/cluster/resources"),
    req("GET", "/api2/json/nodes/pve/qemu/101/config"),
    req("GET", "/api2/json/nodes/pve/qemu/101/status/current"),
    req("POST", "/api2/json/nodes/pve/qemu/102/config"),
    req("GET", "/api2/json/nodes/pve2/qemu/102"),
    req("GET", "/api2/json/nodes/pve/tasks/UPID:pve:1/status"),
    req("GET", "/api2/json/nodes/pve/qemu/1010x/config"),
]


def test_per_vm_requests_counts_each_vms_own_paths_not_task_polls():
    assert bench.per_vm_requests(REQS) == {"101": [2, 0], "102": [1, 1]}
    assert bench.per_vm_requests([]) == {}


def test_summarize_leaves_task_polls_out_of_the_reads():
    assert bench.summarize(REQS) == (5, 1, 1)


def test_ratio_has_no_figure_for_a_zero_base():
    assert bench.ratio(6, 3) == 2.0
    assert bench.ratio(1, 0) is None


def run(s: float, reqs: list[dict], changed: int = 0, ran: int = 10) -> dict:
    return {"s": s, "reqs": reqs, "stages": {"vms": {"s": s, "ran": ran, "changed": changed, "reqs": reqs}}}


def test_run_figures_per_run_and_per_vm():
    figs = bench.run_figures(run(12.34, REQS, changed=3), vms=2)
    assert figs == {
        "s": 12.3,
        "changed": 3,
        "results": 10,
        "reads": 5,
        "writes": 1,
        "pve_tasks": 1,
        "reads_per_vm": 2.5,
        "writes_per_vm": 0.5,
        "vm_reads_max": 2,
        "vm_writes_max": 1,
    }
    empty = bench.run_figures(run(1.0, []), vms=0)
    assert empty["reads_per_vm"] == 0.0 and empty["vm_reads_max"] == 0
    assert "one VM's paths at most 2/1" in bench.run_line("first", figs)


def test_group_hosts_takes_in_the_children():
    listing = {
        "_meta": {"hostvars": {}},
        "all": {"children": ["ungrouped", "vms", "proxmox"]},
        "vms": {"hosts": ["a"], "children": ["gpu"]},
        "gpu": {"hosts": ["b", "a"]},
        "proxmox": {"hosts": ["pve", "pve2"]},
    }
    assert bench.group_hosts(listing, "vms") == {"a", "b"}
    assert bench.group_hosts(listing, "proxmox") == {"pve", "pve2"}
    assert bench.group_hosts(listing, "router") == set()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository-like folder: inventory/demo, inventory/demo-cluster, one with a fixture hint, one without."""
    for name in ("demo", "demo-cluster", "mylab", "plain"):
        (tmp_path / "inventory" / name / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "inventory" / "mylab" / "group_vars" / "all" / "lab.yml").write_text(
        "# start it with `gpulab lab up --fixture homelab-blacklisted --state .lab`\nx: 1\n"
    )
    return tmp_path.resolve()


def test_default_fixture_by_name_then_by_hint(tree: Path):
    assert bench.default_fixture("inventory/demo", tree) is None
    assert bench.default_fixture("inventory/demo-cluster", tree) == "cluster"
    assert bench.default_fixture("inventory/mylab", tree) == "homelab-blacklisted"
    assert bench.default_fixture("inventory/plain", tree) is None
    assert bench.default_fixture(str(tree / "inventory" / "plain"), tree) is None


def test_parse_inventory_arg(tree: Path, tmp_path_factory):
    assert bench.parse_inventory_arg("demo", tree) == ("inventory/demo", None)
    assert bench.parse_inventory_arg("demo-cluster", tree) == ("inventory/demo-cluster", "cluster")
    assert bench.parse_inventory_arg("inventory/demo-cluster", tree) == ("inventory/demo-cluster", "cluster")
    assert bench.parse_inventory_arg("demo=homelab", tree) == ("inventory/demo", "homelab")
    assert bench.parse_inventory_arg("demo-cluster=", tree) == ("inventory/demo-cluster", None)
    outside = tmp_path_factory.mktemp("elsewhere").resolve()
    assert bench.parse_inventory_arg(f"{outside}=cluster", tree) == (str(outside), "cluster")
    with pytest.raises(SystemExit, match="no such inventory"):
        bench.parse_inventory_arg("nope", tree)


def test_the_default_inventory_is_the_demo_lab_on_the_reference_fixture():
    assert bench.parse_inventory_arg(bench.DEFAULT_INVENTORY) == ("inventory/demo", None)


def row(name: str, vms: int, nodes: int, first_s: float, noop_s: float, vm_reads: int = 2, writes: int = 0):
    first = {"s": first_s, "reads": 50 * vms, "writes": 10 * vms, "changed": 100, "reads_per_vm": 50.0}
    noop = {
        "s": noop_s,
        "reads": 4 + 2 * vms,
        "writes": 0,
        "changed": 0,
        "reads_per_vm": (4 + 2 * vms) / vms,
        "vm_reads_max": vm_reads,
        "vm_writes_max": writes,
    }
    return bench.scale_row(name, "cluster" if nodes > 1 else None, vms, nodes, first, noop)


def test_scale_row():
    r = row("demo", 3, 1, 84.0, 43.0)
    assert r["fixture"] == "reference" and r["first_requests"] == 180 and r["noop_requests"] == 10
    assert r["noop_vm_reads_max"] == 2 and r["noop_changed"] == 0


def test_growth_against_the_first_column():
    rows = [row("demo", 3, 1, 80.0, 40.0), row("demo-cluster", 6, 2, 120.0, 50.0)]
    (g,) = bench.growth(rows)
    assert g["vms"] == 2.0 and g["first_s"] == 1.5 and g["noop_s"] == 1.25
    assert g["noop_requests"] == pytest.approx(16 / 10)
    assert g["noop_s_exponent"] == pytest.approx(math.log(1.25) / math.log(2))
    assert bench.growth(rows[:1]) == []
    same = bench.growth([rows[0], row("again", 3, 1, 80.0, 44.0)])[0]
    assert same["vms"] == 1.0 and same["noop_s_exponent"] is None


def test_scale_table_has_a_column_per_inventory_and_the_growth_rows():
    rows = [row("demo", 3, 1, 80.0, 40.0), row("demo-cluster", 6, 2, 120.0, 50.0)]
    lines = bench.scale_table(rows)
    assert lines[0].split() == ["demo", "demo-cluster"]
    cells = {line.rsplit(maxsplit=2)[0].strip(): line.split()[-2:] for line in lines[2:]}
    assert cells["VMs"] == ["3", "6"]
    assert cells["PVE nodes"] == ["1", "2"]
    assert cells["fixture"] == ["reference", "cluster"]
    assert cells["first converge s"] == ["80.0", "120.0"]
    assert cells["no-op s"] == ["40.0", "50.0"]
    assert cells["PVE requests no-op"] == ["10", "16"]
    assert cells["no-op PVE reads / VM"] == ["3.33", "2.67"]
    assert cells["no-op reads, one VM max"] == ["2", "2"]
    assert cells["growth: VMs x"] == ["-", "2.00"]
    assert cells["growth: no-op s x"] == ["-", "1.25"]
    assert cells["growth: no-op s ~ VMs^k, k"] == ["-", f"{math.log(1.25) / math.log(2):.2f}"]
    assert len({len(line) for line in lines}) == 1  # every row as wide as the head


def test_reads_verdict():
    ok = [row("demo", 3, 1, 80.0, 40.0), row("demo-cluster", 6, 2, 120.0, 50.0, vm_reads=1)]
    assert bench.reads_verdict(ok).startswith("per-VM reads stay <= 2 (no writes) in every no-op run")
    bad = [*ok, row("big", 12, 4, 200.0, 70.0, vm_reads=3)]
    text = bench.reads_verdict(bad)
    assert "do NOT stay <= 2" in text and "big has 3 reads / 0 writes" in text
    written = bench.reads_verdict([row("demo", 3, 1, 80.0, 40.0, vm_reads=1, writes=1)])
    assert "do NOT stay" in written and "1 writes" in written


def test_growth_verdicts():
    base = row("demo", 3, 1, 80.0, 40.0)
    far = bench.growth_verdicts([base, row("demo-cluster", 6, 2, 120.0, 50.0)])
    assert far == [
        "demo-cluster against demo: x2.00 VMs, no-op time x1.25: far less than linear (at most half the linear growth)"
    ]
    assert "less than linear" in bench.growth_verdicts([base, row("b", 6, 2, 120.0, 70.0)])[0]
    assert "linear or worse" in bench.growth_verdicts([base, row("c", 6, 2, 120.0, 80.0)])[0]
    assert "same number of VMs" in bench.growth_verdicts([base, row("d", 3, 1, 80.0, 41.0)])[0]
    assert bench.growth_verdicts([base]) == []


def test_another_tree_is_measured_with_its_own_venv_and_refused_without_one(tmp_path):
    other = tmp_path / "before"
    (other / ".venv" / "bin").mkdir(parents=True)
    tree = bench.Tree(other)
    assert (tree.root, tree.bin, tree.label) == (other, other / ".venv" / "bin", "before")
    assert bench.HERE.label == "this tree" and bench.HERE.root == ROOT
    with pytest.raises(SystemExit) as err:
        tree.check()
    assert f"--tree {other}" in str(err.value) and "make venv there" in str(err.value)
    (other / "site.yml").write_text("[]\n")
    (other / ".venv" / "bin" / "ansible-playbook").write_text("")
    tree.check()


def test_mitogen_measures_this_tree_again_with_mitogens_strategy(tmp_path):
    with pytest.raises(SystemExit) as err:
        bench.mitogen_tree(str(tmp_path))
    assert "not Mitogen's strategy folder" in str(err.value)
    (tmp_path / "ansible_mitogen" / "plugins" / "strategy").mkdir(parents=True)
    tree = bench.mitogen_tree(str(tmp_path))
    assert (tree.root, tree.label) == (bench.ROOT, "this tree + mitogen")
    assert tree.env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert tree.env["ANSIBLE_STRATEGY_PLUGINS"] == str(tmp_path / "ansible_mitogen" / "plugins" / "strategy")
    assert tree.env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert bench.HERE.env == {}
