#!/usr/bin/env python3
"""Benchmark site.yml on a fresh simulated lab: the first converge against the no-op re-run.

Runs `ansible-playbook site.yml` twice on inventory/demo, as a user would, and prints a table per
stage: wall time, PVE API requests (reads / writes), PVE tasks started, and Ansible task results (runs
per host, skipped ones not counted) of each run; then each run's figures (wall time, changed results,
PVE reads/writes in all and per VM), the whole runs' wall times and the re-run's requests on each VM.
Stages are told apart by scripts/callbacks/gpulab_timeline.py, which logs when each play starts and
ends; the simulator's request log is split at those times.
Targets: the re-run takes at most 30 % of the first converge (and at most 20 s); per VM at most 2 reads,
0 writes. Each figure of inventory/demo is printed beside the baseline in scripts/benchmark-baseline.json
(the figures of one earlier run, with its date; --save-baseline replaces them), and the re-run's most
expensive tasks are listed (--top).

    .venv/bin/python scripts/benchmark.py [--tags preflight,host,vms,...] [--keep] [--top N] [--reruns N]
        [--save-baseline] [--inventory NAME[=FIXTURE] ...] [--json FILE]

With --reruns N the no-op re-run is repeated N times (the machine's speed varies between runs): each
one's wall time and changed count is printed, and the tables show the median one.

Scale figures: --inventory (repeatable) names an inventory, a folder under inventory/ or a path, with
=FIXTURE for the lab's fixture (default: what that inventory needs, inventory/demo-cluster -> cluster,
inventory/homelab-lab -> homelab, else the reference lab). Each one is measured in turn on a lab of its
own (up, first converge, re-runs, down), then one table puts them side by side: VMs and PVE nodes (from
ansible-inventory, groups vms and proxmox), wall times, PVE requests, the no-op run's reads per VM, and
how time and requests grew against the number of VMs. For example 3 VMs on 1 node against 6 on 2:

    .venv/bin/python scripts/benchmark.py --inventory demo --inventory demo-cluster --json bench.json

--json FILE (- for stdout) writes every inventory's figures and the side-by-side table's numbers.

Two trees in one run: --tree PATH (repeatable) measures each inventory also in another checkout (for
example a worktree of the previous main: git worktree add ../before main~3), with that checkout's own
.venv, site.yml, ansible.cfg and simulated lab, right after this one on the same machine; the side-by-side
table then has a column per inventory and tree. Absolute times vary from machine to machine and from hour
to hour; a comparison is only fair within one run.

    .venv/bin/python scripts/benchmark.py --tree ../before

Mitogen for Ansible: --mitogen also measures this tree with Mitogen's strategy (mitogen_linear, from the
`mitogen` distribution: pip install mitogen into the project's virtualenv, or a folder given as
--mitogen=PATH that holds ansible_mitogen), in the same run. gpulab does not use Mitogen (ansible-core deprecates
strategy plugins outside ansible.builtin: docs/development.md, "Benchmark"); the figure says what it would save.

    .venv/bin/python scripts/benchmark.py --tree ../before --mitogen

Run as root for the whole lab (SSH hosts, DHCP); without root only the API stages can run.
This is a measurement, not a test: it never fails on a number.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
API_ONLY = "preflight,vms"
VM_PATH = re.compile(r"/nodes/[^/]+/qemu/(\d+)(/|$)")
TASK_PATH = re.compile(r"/tasks/([^/]+)/status")
BASELINE = ROOT / "scripts" / "benchmark-baseline.json"
DEFAULT_INVENTORY = "inventory/demo"
# The lab fixture each inventory is written for (None: the simulator's default, the reference lab);
# an inventory not named here gets the fixture its group_vars name in a `gpulab lab up --fixture X` hint.
FIXTURES = {"demo": None, "demo-cluster": "cluster", "homelab-lab": "homelab"}
FIXTURE_HINT = re.compile(r"gpulab lab up --fixture ([\w.-]+)")
# The no-op run's target for the requests on one VM's own paths.
VM_READS_MAX = 2


class BenchError(Exception):
    """A lab or a site.yml run failed: that inventory has no figures."""


class Tree:
    """A checkout to measure: its root (site.yml, ansible.cfg, inventory/) and its virtualenv's bin."""

    def __init__(
        self, root: Path, bin_dir: Path | None = None, label: str | None = None, env: dict | None = None
    ):
        self.root = root.resolve()
        self.bin = bin_dir or self.root / ".venv" / "bin"
        self.label = label or ("this tree" if self.root == ROOT.resolve() else self.root.name)
        self.env = env or {}  # what this tree's runs add to the environment (the Mitogen strategy)

    def check(self) -> None:
        missing = [p for p in (self.root / "site.yml", self.bin / "ansible-playbook") if not p.exists()]
        if missing:
            raise SystemExit(f"--tree {self.root}: {', '.join(map(str, missing))} missing (make venv there)")


HERE = Tree(ROOT, BIN)


def mitogen_tree(where: str) -> Tree:
    """This tree again, its runs with Mitogen's mitogen_linear strategy (ansible_mitogen from `where`, a folder,
    or else from this Python)."""
    if where:
        plugins, extra = Path(where).resolve() / "ansible_mitogen" / "plugins" / "strategy", where
    else:
        try:
            import ansible_mitogen  # type: ignore[import-not-found]
        except ImportError:
            raise SystemExit(
                "--mitogen: no ansible_mitogen here (pip install mitogen, or --mitogen=FOLDER)"
            ) from None
        plugins, extra = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy", ""
    if not plugins.is_dir():
        raise SystemExit(f"--mitogen: {plugins} is not Mitogen's strategy folder")
    env = {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear"}
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, os.environ.get("PYTHONPATH", "")) if p)
    return Tree(ROOT, BIN, label="this tree + mitogen", env=env)


def lab(*args: str, env: dict, tree: Tree = HERE) -> None:
    out = subprocess.run(
        [tree.bin / "gpulab", "lab", *args], env=env, capture_output=True, text=True, cwd=tree.root
    )
    if out.returncode != 0:
        sys.stdout.write(out.stdout[-2000:] + out.stderr[-4000:])
        raise BenchError(f"gpulab lab {args[0]} failed (rc={out.returncode})")


def requests_since(log: Path, offset: int) -> tuple[list[dict], int]:
    if not log.exists():
        return [], offset
    with log.open() as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f if line.strip()]
        return lines, f.tell()


def run_site(
    tags: str | None, env: dict, timeline: Path, inventory: str, tree: Tree = HERE
) -> tuple[float, list[dict]]:
    """One whole `ansible-playbook site.yml`; its wall time and its plays (see gpulab_timeline)."""
    cmd = [tree.bin / "ansible-playbook", "-i", inventory, "site.yml"] + (["--tags", tags] if tags else [])
    env = {**env, "GPULAB_TIMELINE": str(timeline)}
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=tree.root, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if out.returncode != 0:
        sys.stdout.write(out.stdout[-4000:] + out.stderr[-2000:])
        raise BenchError(f"site.yml -i {inventory} failed (rc={out.returncode})")
    plays = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    return took, plays


def summarize(reqs: list[dict]) -> tuple[int, int, int]:
    reads = sum(1 for r in reqs if r["method"] == "GET" and not TASK_PATH.search(r["path"]))
    writes = sum(1 for r in reqs if r["method"] != "GET")
    tasks = len({m.group(1) for r in reqs if (m := TASK_PATH.search(r["path"]))})
    return reads, writes, tasks


def per_vm_requests(reqs: list[dict]) -> dict[str, list[int]]:
    """Per VMID, [reads, writes] on that VM's own paths (/nodes/N/qemu/VMID...; task polls not counted)."""
    per_vm: dict[str, list[int]] = {}
    for req in reqs:
        m = VM_PATH.search(req["path"])
        if m and not TASK_PATH.search(req["path"]):
            counts = per_vm.setdefault(m.group(1), [0, 0])
            counts[0 if req["method"] == "GET" else 1] += 1
    return per_vm


def by_stage(plays: list[dict], reqs: list[dict]) -> dict[str, dict]:
    """Per stage (in play order): seconds, task results, changed results and the requests sent."""
    stages: dict[str, dict] = {}
    for play in plays:
        st = stages.setdefault(play["stage"], {"s": 0.0, "ran": 0, "changed": 0, "reqs": []})
        st["s"] += play["end"] - play["start"]
        st["ran"] += play["ran"]
        st["changed"] += play["changed"]
        st["reqs"] += [r for r in reqs if play["start"] <= r["time"] < play["end"]]
    return stages


def ratio(num: float, den: float) -> float | None:
    """num / den, or None where den is 0 (no figure to grow from)."""
    return num / den if den else None


def run_figures(run: dict, vms: int) -> dict:
    """One run's figures: wall time, changed results, task results, PVE reads/writes in all and per VM."""
    reads, writes, tasks = summarize(run["reqs"])
    per_vm = per_vm_requests(run["reqs"])
    return {
        "s": round(run["s"], 1),
        "changed": sum(st["changed"] for st in run["stages"].values()),
        "results": sum(st["ran"] for st in run["stages"].values()),
        "reads": reads,
        "writes": writes,
        "pve_tasks": tasks,
        "reads_per_vm": round(ratio(reads, vms) or 0.0, 2),
        "writes_per_vm": round(ratio(writes, vms) or 0.0, 2),
        "vm_reads_max": max((r for r, _ in per_vm.values()), default=0),
        "vm_writes_max": max((w for _, w in per_vm.values()), default=0),
    }


def run_line(label: str, figs: dict) -> str:
    return (
        f"  {label:<8} {figs['s']:>7.1f} s  changed {figs['changed']:>4}  results {figs['results']:>4}"
        f"  PVE {figs['reads']:>4}/{figs['writes']:<4} ({figs['reads_per_vm']:.1f}/{figs['writes_per_vm']:.1f}"
        f" per VM; one VM's paths at most {figs['vm_reads_max']}/{figs['vm_writes_max']})"
    )


def figures(runs: dict[str, dict], tags: str | None) -> dict:
    """What the baseline keeps of a benchmark: per run and per stage its seconds and task results."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    out: dict = {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "tags": tags or "all",
        "cpus": os.cpu_count(),
    }
    for label, run in runs.items():
        out[label] = {"s": round(run["s"], 1), "results": sum(st["ran"] for st in run["stages"].values())}
    out["stages"] = {
        stage: {
            label: {"s": round(run["stages"][stage]["s"], 1), "results": run["stages"][stage]["ran"]}
            for label, run in runs.items()
            if stage in run["stages"]
        }
        for stage in runs["first"]["stages"]
    }
    return out


def dump_figures(figs: dict) -> str:
    """The baseline file's text: one line per figure and per stage."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in figs.items() if k != "stages"]
    stages = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in figs["stages"].items()]
    return "{\n" + ",\n".join([*lines, '  "stages": {\n' + ",\n".join(stages) + "\n  }"]) + "\n}\n"


def print_against(now: dict, base: dict) -> None:
    """The figures of this run beside the baseline's (seconds, task results; first converge / re-run)."""
    print(f"\nagainst the baseline of {base['date']} ({base['tags']}, {base['cpus']} CPUs): now (baseline)")
    head = f"{'stage':<10} {'first s':>15} {'rerun s':>15} {'first results':>15} {'rerun results':>15}"
    print(head)
    print("-" * len(head))
    rows = [(st, now["stages"][st], base["stages"].get(st, {})) for st in now["stages"]]
    rows.append(("site.yml", now, base))
    empty = {"s": 0.0, "results": 0}
    for stage, n, b in rows:
        cells = []
        for key in ("s", "results"):
            for label in ("first", "rerun"):
                nv, bv = n.get(label, empty)[key], b.get(label, empty)[key] if b else "-"
                cells.append(f"{nv:>6} ({bv:>5})" if key == "results" else f"{nv:>6.1f} ({bv:>5})")
        print(f"{stage:<10} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} {cells[3]:>15}")


def print_top(plays: list[dict], top: int) -> None:
    """The re-run's most expensive tasks: seconds from each task's start to the next's, results."""
    tasks = [(t["s"], t["ran"], p["stage"], t["name"]) for p in plays for t in p.get("tasks", []) if "s" in t]
    if not tasks or top <= 0:
        return
    print(f"\nno-op re-run, the {top} most expensive tasks (of {len(tasks)}; seconds, results):")
    for secs, ran, stage, name in sorted(tasks, reverse=True)[:top]:
        print(f"  {secs:>6.2f} s {ran:>3}  {stage:<9} {name}")


# --- inventories ---------------------------------------------------------------------------------


def inventory_path(name: str, root: Path = ROOT) -> str:
    """An --inventory value's folder: a name under inventory/, else a path (from root, else from the
    current folder); written relative to root where it lies inside it (ansible-playbook runs there)."""
    root = root.resolve()
    for cand in (root / "inventory" / name, root / name, Path(name)):
        if cand.is_dir():
            full = cand.resolve()
            return str(full.relative_to(root)) if full.is_relative_to(root) else str(full)
    raise SystemExit(f"--inventory {name}: no such inventory (neither inventory/{name} nor a folder)")


def default_fixture(inventory: str, root: Path = ROOT) -> str | None:
    """The lab fixture an inventory is written for: FIXTURES by its folder's name, else the first
    `gpulab lab up --fixture X` its group_vars name, else None (the simulator's default)."""
    path = Path(inventory) if Path(inventory).is_absolute() else root / inventory
    if path.name in FIXTURES:
        return FIXTURES[path.name]
    for f in sorted((path / "group_vars").rglob("*.yml")):
        if m := FIXTURE_HINT.search(f.read_text(errors="replace")):
            return m.group(1)
    return None


def parse_inventory_arg(value: str, root: Path = ROOT) -> tuple[str, str | None]:
    """`NAME[=FIXTURE]` -> (the inventory's path, its fixture); an empty FIXTURE is the default one."""
    name, sep, fixture = value.partition("=")
    path = inventory_path(name, root)
    return path, (fixture or None) if sep else default_fixture(path, root)


def group_hosts(listing: dict, group: str) -> set[str]:
    """The hosts of a group in `ansible-inventory --list` output, its children's included."""
    entry = listing.get(group, {})
    hosts = set(entry.get("hosts", []))
    for child in entry.get("children", []):
        hosts |= group_hosts(listing, child)
    return hosts


def inventory_shape(inventory: str, env: dict, tree: Tree = HERE) -> tuple[int, int]:
    """(VMs, PVE nodes) of an inventory: its groups vms and proxmox."""
    out = subprocess.run(
        [tree.bin / "ansible-inventory", "-i", inventory, "--list"],
        cwd=tree.root,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.stdout.write(out.stderr[-2000:])
        raise BenchError(f"ansible-inventory -i {inventory} --list failed (rc={out.returncode})")
    listing = json.loads(out.stdout)
    return len(group_hosts(listing, "vms")), len(group_hosts(listing, "proxmox"))


# --- the side-by-side table ----------------------------------------------------------------------


def scale_row(name: str, fixture: str | None, vms: int, nodes: int, first: dict, noop: dict) -> dict:
    """One inventory's column of the scale table, from run_figures of its first and no-op runs."""
    return {
        "inventory": name,
        "fixture": fixture or "reference",
        "vms": vms,
        "nodes": nodes,
        "first_s": first["s"],
        "noop_s": noop["s"],
        "first_requests": first["reads"] + first["writes"],
        "noop_requests": noop["reads"] + noop["writes"],
        "noop_changed": noop["changed"],
        "noop_reads_per_vm": noop["reads_per_vm"],
        "noop_vm_reads_max": noop["vm_reads_max"],
        "noop_vm_writes_max": noop["vm_writes_max"],
    }


def growth(rows: list[dict]) -> list[dict]:
    """Per column after the first: how VMs, times and requests grew against the first column."""
    base = rows[0]
    out = []
    for row in rows[1:]:
        g = {
            key: ratio(row[key], base[key])
            for key in ("vms", "first_s", "noop_s", "first_requests", "noop_requests")
        }
        vr, tr = g["vms"], g["noop_s"]
        # t ~ VMs^k: k = 1 is linear growth, 0 none at all
        g["noop_s_exponent"] = math.log(tr) / math.log(vr) if vr and tr and vr != 1 else None
        out.append(g)
    return out


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def scale_table(rows: list[dict]) -> list[str]:
    """The side-by-side table's lines: a column per inventory, growth against the first column."""
    grown = [None, *growth(rows)] if rows else []
    spec = [
        ("fixture", lambda r, g: r["fixture"]),
        ("VMs", lambda r, g: r["vms"]),
        ("PVE nodes", lambda r, g: r["nodes"]),
        ("first converge s", lambda r, g: f"{r['first_s']:.1f}"),
        ("no-op s", lambda r, g: f"{r['noop_s']:.1f}"),
        ("PVE requests first", lambda r, g: r["first_requests"]),
        ("PVE requests no-op", lambda r, g: r["noop_requests"]),
        ("no-op changed", lambda r, g: r["noop_changed"]),
        ("no-op PVE reads / VM", lambda r, g: f"{r['noop_reads_per_vm']:.2f}"),
        ("no-op reads, one VM max", lambda r, g: r["noop_vm_reads_max"]),
        ("no-op writes, one VM max", lambda r, g: r["noop_vm_writes_max"]),
        ("growth: VMs x", lambda r, g: g and g["vms"]),
        ("growth: first converge s x", lambda r, g: g and g["first_s"]),
        ("growth: no-op s x", lambda r, g: g and g["noop_s"]),
        ("growth: PVE requests no-op x", lambda r, g: g and g["noop_requests"]),
        ("growth: no-op s ~ VMs^k, k", lambda r, g: g and g["noop_s_exponent"]),
    ]
    cols = [r["inventory"] for r in rows]
    width = max([12, *(len(c) for c in cols)])
    label_w = max(len(label) for label, _ in spec)
    head = f"{'':<{label_w}}" + "".join(f" {c:>{width}}" for c in cols)
    lines = [head, "-" * len(head)]
    for label, get in spec:
        lines.append(
            f"{label:<{label_w}}"
            + "".join(f" {_cell(get(r, g)):>{width}}" for r, g in zip(rows, grown, strict=True))
        )
    return lines


def reads_verdict(rows: list[dict]) -> str:
    """Whether every inventory's no-op run kept to VM_READS_MAX reads (and no writes) on each VM's paths."""
    worst = max(rows, key=lambda r: (r["noop_vm_reads_max"], r["noop_vm_writes_max"]))
    ok = all(r["noop_vm_reads_max"] <= VM_READS_MAX and r["noop_vm_writes_max"] == 0 for r in rows)
    where = ", ".join(f"{r['inventory']} {r['noop_vm_reads_max']}" for r in rows)
    if ok:
        return f"per-VM reads stay <= {VM_READS_MAX} (no writes) in every no-op run: most on one VM {where}"
    return (
        f"per-VM reads do NOT stay <= {VM_READS_MAX} with no writes: {worst['inventory']} has"
        f" {worst['noop_vm_reads_max']} reads / {worst['noop_vm_writes_max']} writes on one VM (most per VM: {where})"
    )


def growth_verdicts(rows: list[dict]) -> list[str]:
    """Per column after the first: the no-op time's growth against the VM count's."""
    lines = []
    for row, g in zip(rows[1:], growth(rows), strict=True):
        if g["vms"] is None or g["noop_s"] is None:
            lines.append(f"{row['inventory']}: no growth figure (the first column has no VMs or no time)")
            continue
        if g["vms"] <= 1:
            kind = "same number of VMs or fewer"
        elif g["noop_s"] <= 1 + (g["vms"] - 1) / 2:
            kind = "far less than linear (at most half the linear growth)"
        elif g["noop_s"] < g["vms"]:
            kind = "less than linear"
        else:
            kind = "linear or worse"
        lines.append(
            f"{row['inventory']} against {rows[0]['inventory']}: x{g['vms']:.2f} VMs, no-op time"
            f" x{g['noop_s']:.2f}: {kind}"
        )
    return lines


# --- one inventory's benchmark -------------------------------------------------------------------


def bench_one(
    inventory: str, fixture: str | None, tags: str | None, reruns_n: int, keep: bool, tree: Tree = HERE
) -> dict:
    """A fresh lab for one inventory, its first converge and no-op re-runs, the lab down again."""
    state = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    env = {
        **os.environ,
        "GPULAB_LAB_STATE": str(state),
        "ANSIBLE_CONFIG": str(tree.root / "ansible.cfg"),
        # this tree's timeline callback in every tree: the stages are told apart the same way
        "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "scripts" / "callbacks"),
        "ANSIBLE_CALLBACKS_ENABLED": "gpulab_timeline",
        "PATH": f"{tree.bin}:{os.environ['PATH']}",
        **tree.env,
    }
    env.pop("VIRTUAL_ENV", None)
    vms, nodes = inventory_shape(inventory, env, tree)
    up_start = time.monotonic()
    lab("up", "--state", str(state), *(["--fixture", fixture] if fixture else []), env=env, tree=tree)
    up_took = time.monotonic() - up_start
    log = state / "pve-requests.jsonl"
    offset = requests_since(log, 0)[1]
    runs: dict[str, dict] = {}
    reruns: list[dict] = []
    try:
        for n in range(1 + max(reruns_n, 1)):
            label = "first" if n == 0 else f"rerun{n}"
            took, plays = run_site(tags, env, state / f"timeline-{label}.jsonl", inventory, tree)
            reqs, offset = requests_since(log, offset)
            run = {"s": took, "stages": by_stage(plays, reqs), "reqs": reqs, "plays": plays}
            if n == 0:
                runs["first"] = run
            else:
                reruns.append(run)
    finally:
        if not keep:
            lab("down", "--state", str(state), env=env, tree=tree)
    runs["rerun"] = sorted(reruns, key=lambda r: r["s"])[(len(reruns) - 1) // 2]
    return {
        "inventory": inventory,
        "tree": tree.label,
        "fixture": fixture,
        "vms": vms,
        "nodes": nodes,
        "state": state,
        "up_s": up_took,
        "runs": runs,
        "reruns": reruns,
    }


def report_one(res: dict, tags: str | None, top: int) -> dict:
    """Print one inventory's tables; return its figures (figures() and each run's run_figures)."""
    runs, reruns, vms = res["runs"], res["reruns"], res["vms"]
    print(
        f"{res['inventory']} in {res['tree']} (fixture {res['fixture'] or 'reference'}; {vms} VMs on {res['nodes']} PVE node{'s' if res['nodes'] != 1 else ''})"
        f" - lab up: {res['up_s']:.1f} s (state {res['state']})\n"
    )
    head = (
        f"{'stage':<10} {'first s':>8} {'rerun s':>8} {'first r/w':>10} {'rerun r/w':>10} {'PVE tasks':>9}"
        f" {'task results':>13}  rerun changed"
    )
    print(head)
    print("-" * len(head))
    first, rerun = runs["first"]["stages"], runs["rerun"]["stages"]
    for stage, f in first.items():
        r = rerun.get(stage, {"s": 0.0, "ran": 0, "changed": 0, "reqs": []})
        fr, fw, ft = summarize(f["reqs"])
        rr, rw, _ = summarize(r["reqs"])
        print(
            f"{stage:<10} {f['s']:>8.1f} {r['s']:>8.1f} {fr:>5}/{fw:<4} {rr:>5}/{rw:<4} {ft:>9}"
            f" {f['ran']:>6} / {r['ran']:<4}  {r['changed']}"
        )
    total_f, total_r = runs["first"]["s"], runs["rerun"]["s"]
    fr, fw, ft = summarize(runs["first"]["reqs"])
    rr, rw, _ = summarize(runs["rerun"]["reqs"])
    print(
        f"{'site.yml':<10} {total_f:>8.1f} {total_r:>8.1f} {fr:>5}/{fw:<4} {rr:>5}/{rw:<4} {ft:>9}"
        f" {sum(s['ran'] for s in first.values()):>6} / {sum(s['ran'] for s in rerun.values()):<4}"
        f"  {sum(s['changed'] for s in rerun.values())}"
    )
    ratio_ = total_r / total_f if total_f else 0
    print(
        f"\nno-op re-run: {total_r:.1f} s (target <= 20 s), {ratio_:.0%} of the first converge (target <= 30%);"
        " wall times include start-up"
    )
    if len(reruns) > 1:
        each = ", ".join(
            f"{r['s']:.1f} s (changed {sum(st['changed'] for st in r['stages'].values())})" for r in reruns
        )
        print(f"no-op re-runs: {each}; the tables show the median, {total_r:.1f} s")

    each_run = {"first": run_figures(runs["first"], vms)}
    each_run |= {f"rerun{n}": run_figures(r, vms) for n, r in enumerate(reruns, 1)}
    print(f"\neach run (wall time, changed, task results, PVE reads/writes; per VM over {vms} VMs):")
    for label, figs in each_run.items():
        print(run_line(label, figs))

    per_vm = per_vm_requests(runs["rerun"]["reqs"])
    if per_vm:
        print(f"no-op re-run, requests on each VM's own paths (target: <= {VM_READS_MAX} reads, 0 writes):")
        for vmid, (reads, writes) in sorted(per_vm.items()):
            print(f"  VM {vmid}: {reads} reads, {writes} writes")

    now = figures(runs, tags)
    if (
        res["inventory"] == DEFAULT_INVENTORY
        and not res["fixture"]
        and res["tree"] == HERE.label
        and BASELINE.exists()
    ):
        print_against(now, json.loads(BASELINE.read_text()))
    print_top(runs["rerun"]["plays"], top)
    return {
        "figures": now,
        "runs": each_run,
        "noop": run_figures(runs["rerun"], vms),
        "noop_per_vm": {vmid: {"reads": r, "writes": w} for vmid, (r, w) in sorted(per_vm.items())},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tags", help=f"site.yml tags to run (default: all as root, else {API_ONLY})")
    ap.add_argument("--keep", action="store_true", help="leave the lab(s) running afterwards")
    ap.add_argument(
        "--top", type=int, default=15, help="list the re-run's N most expensive tasks (default 15)"
    )
    ap.add_argument(
        "--reruns", type=int, default=1, help="no-op re-runs to make (default 1); the median is shown"
    )
    ap.add_argument(
        "--save-baseline",
        action="store_true",
        help=f"store inventory/demo's figures in {BASELINE.name}",
    )
    ap.add_argument(
        "--inventory",
        action="append",
        metavar="NAME[=FIXTURE]",
        help="an inventory to measure (a folder under inventory/ or a path), repeatable: each on a fresh"
        f" lab, then side by side; =FIXTURE picks the lab fixture (default {DEFAULT_INVENTORY})",
    )
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE (- for stdout)")
    ap.add_argument(
        "--tree",
        action="append",
        metavar="PATH",
        default=[],
        help="another checkout (with its .venv) to measure each inventory in too, in the same run",
    )
    ap.add_argument(
        "--mitogen",
        nargs="?",
        const="",
        metavar="PATH",
        help="also measure this tree with Mitogen's strategy (ansible_mitogen importable, or in PATH)",
    )
    args = ap.parse_args()
    trees = [HERE, *(Tree(Path(p)) for p in args.tree)]
    if args.mitogen is not None:
        trees.insert(1, mitogen_tree(args.mitogen))
    for tree in trees:
        tree.check()
    tags = args.tags or (None if os.geteuid() == 0 else API_ONLY)
    targets = [parse_inventory_arg(v) for v in args.inventory or [DEFAULT_INVENTORY]]
    if args.save_baseline and (DEFAULT_INVENTORY, None) not in targets:
        raise SystemExit(f"--save-baseline keeps the figures of {DEFAULT_INVENTORY}: measure it too")

    done: list[dict] = []
    failed: list[tuple[str, str]] = []
    jobs = [(inventory, fixture, tree) for inventory, fixture in targets for tree in trees]
    for n, (inventory, fixture, tree) in enumerate(jobs):
        if n:
            print("\n" + "=" * 100 + "\n")
        try:
            res = bench_one(inventory, fixture, tags, args.reruns, args.keep, tree)
        except BenchError as e:
            if len(jobs) == 1:
                raise SystemExit(str(e)) from None
            print(f"{inventory} in {tree.label}: {e}; no figures")
            failed.append((f"{inventory} in {tree.label}", str(e)))
            continue
        res |= report_one(res, tags, args.top)
        done.append(res)
        if args.save_baseline and (inventory, fixture, tree) == (DEFAULT_INVENTORY, None, HERE):
            BASELINE.write_text(dump_figures(res["figures"]))
            print(f"\nbaseline stored in {BASELINE}")

    rows = [
        scale_row(
            Path(r["inventory"]).name + ("" if len(trees) == 1 else f" @ {r['tree']}"),
            r["fixture"],
            r["vms"],
            r["nodes"],
            r["runs"]["first"],
            r["noop"],
        )
        for r in done
    ]
    if len(jobs) > 1 and rows:
        print(f"\n{'=' * 100}\n\nside by side (tags {tags or 'all'}; no-op = the median re-run):\n")
        print("\n".join(scale_table(rows)))
        print("\n" + reads_verdict(rows))
        for line in growth_verdicts(rows):
            print(line)
    for inventory, err in failed:
        print(f"{inventory}: no figures ({err})")
    if args.json:
        out = {
            "date": datetime.date.today().isoformat(),
            "commit": done[0]["figures"]["commit"] if done else None,
            "tags": tags or "all",
            "cpus": os.cpu_count(),
            "inventories": [
                {
                    "inventory": r["inventory"],
                    "tree": r["tree"],
                    "fixture": r["fixture"] or "reference",
                    "vms": r["vms"],
                    "nodes": r["nodes"],
                    "lab_up_s": round(r["up_s"], 1),
                    "runs": r["runs"],
                    "noop": r["noop"],
                    "noop_per_vm": r["noop_per_vm"],
                    "stages": r["figures"]["stages"],
                }
                for r in done
            ],
            "failed": [{"inventory": i, "error": e} for i, e in failed],
            "scale": {
                "rows": rows,
                "growth": growth(rows) if rows else [],
                "vm_reads_ok": all(
                    r["noop_vm_reads_max"] <= VM_READS_MAX and r["noop_vm_writes_max"] == 0 for r in rows
                ),
            },
        }
        text = json.dumps(out, indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
            print(f"\nfigures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
