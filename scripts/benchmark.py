#!/usr/bin/env python3
"""Benchmark site.yml on a fresh simulated lab: the first converge against the no-op re-run.

Runs `ansible-playbook site.yml` twice on inventory/demo, as a user would, and prints a table per
stage: wall time, PVE API requests (reads / writes), PVE tasks started, and Ansible task results (runs
per host, skipped ones not counted) of each run; then the whole runs' wall times and the re-run's
requests on each VM. Stages are told apart by scripts/callbacks/gpulab_timeline.py, which logs when
each play starts and ends; the simulator's request log is split at those times.
Targets: the re-run takes at most 30 % of the first converge (and at most 20 s); per VM at most 2 reads,
0 writes. Each figure is printed beside the baseline in scripts/benchmark-baseline.json (the figures of
one earlier run, with its date; --save-baseline replaces them), and the re-run's most expensive tasks
are listed (--top).

    .venv/bin/python scripts/benchmark.py [--tags preflight,host,vms,...] [--keep] [--top N] [--reruns N]
        [--save-baseline]

With --reruns N the no-op re-run is repeated N times (the machine's speed varies between runs): each
one's wall time and changed count is printed, and the tables show the median one.

Run as root for the whole lab (SSH hosts, DHCP); without root only the API stages can run.
This is a measurement, not a test: it never fails on a number.
"""

from __future__ import annotations

import argparse
import datetime
import json
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


def lab(*args: str, env: dict) -> None:
    out = subprocess.run([BIN / "gpulab", "lab", *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.stdout.write(out.stdout[-2000:] + out.stderr[-4000:])
        raise SystemExit(f"gpulab lab {args[0]} failed (rc={out.returncode})")


def requests_since(log: Path, offset: int) -> tuple[list[dict], int]:
    if not log.exists():
        return [], offset
    with log.open() as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f if line.strip()]
        return lines, f.tell()


def run_site(tags: str | None, env: dict, timeline: Path) -> tuple[float, list[dict]]:
    """One whole `ansible-playbook site.yml`; its wall time and its plays (see gpulab_timeline)."""
    cmd = [BIN / "ansible-playbook", "-i", "inventory/demo", "site.yml"] + (["--tags", tags] if tags else [])
    env = {**env, "GPULAB_TIMELINE": str(timeline)}
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if out.returncode != 0:
        sys.stdout.write(out.stdout[-4000:] + out.stderr[-2000:])
        raise SystemExit(f"site.yml failed (rc={out.returncode})")
    plays = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    return took, plays


def summarize(reqs: list[dict]) -> tuple[int, int, int]:
    reads = sum(1 for r in reqs if r["method"] == "GET" and not TASK_PATH.search(r["path"]))
    writes = sum(1 for r in reqs if r["method"] != "GET")
    tasks = len({m.group(1) for r in reqs if (m := TASK_PATH.search(r["path"]))})
    return reads, writes, tasks


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tags", help=f"site.yml tags to run (default: all as root, else {API_ONLY})")
    ap.add_argument("--keep", action="store_true", help="leave the lab running afterwards")
    ap.add_argument(
        "--top", type=int, default=15, help="list the re-run's N most expensive tasks (default 15)"
    )
    ap.add_argument(
        "--reruns", type=int, default=1, help="no-op re-runs to make (default 1); the median is shown"
    )
    ap.add_argument(
        "--save-baseline", action="store_true", help=f"store this run's figures in {BASELINE.name}"
    )
    args = ap.parse_args()
    tags = args.tags or (None if os.geteuid() == 0 else API_ONLY)

    state = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    env = {
        **os.environ,
        "GPULAB_LAB_STATE": str(state),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "scripts" / "callbacks"),
        "ANSIBLE_CALLBACKS_ENABLED": "gpulab_timeline",
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    up_start = time.monotonic()
    lab("up", "--state", str(state), env=env)
    up_took = time.monotonic() - up_start
    log = state / "pve-requests.jsonl"
    offset = requests_since(log, 0)[1]
    runs: dict[str, dict] = {}
    reruns: list[dict] = []
    try:
        for n in range(1 + max(args.reruns, 1)):
            label = "first" if n == 0 else f"rerun{n}"
            took, plays = run_site(tags, env, state / f"timeline-{label}.jsonl")
            reqs, offset = requests_since(log, offset)
            run = {"s": took, "stages": by_stage(plays, reqs), "reqs": reqs, "plays": plays}
            if n == 0:
                runs["first"] = run
            else:
                reruns.append(run)
    finally:
        if not args.keep:
            lab("down", "--state", str(state), env=env)
    runs["rerun"] = sorted(reruns, key=lambda r: r["s"])[(len(reruns) - 1) // 2]

    print(f"lab up: {up_took:.1f} s (state {state})\n")
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
    ratio = total_r / total_f if total_f else 0
    print(
        f"\nno-op re-run: {total_r:.1f} s (target <= 20 s), {ratio:.0%} of the first converge (target <= 30%);"
        " wall times include start-up"
    )
    if len(reruns) > 1:
        each = ", ".join(
            f"{r['s']:.1f} s (changed {sum(st['changed'] for st in r['stages'].values())})" for r in reruns
        )
        print(f"no-op re-runs: {each}; the tables show the median, {total_r:.1f} s")

    per_vm: dict[str, list[int]] = {}
    for req in runs["rerun"]["reqs"]:
        m = VM_PATH.search(req["path"])
        if m and not TASK_PATH.search(req["path"]):
            counts = per_vm.setdefault(m.group(1), [0, 0])
            counts[0 if req["method"] == "GET" else 1] += 1
    if per_vm:
        print("no-op re-run, requests on each VM's own paths (target: <= 2 reads, 0 writes):")
        for vmid, (reads, writes) in sorted(per_vm.items()):
            print(f"  VM {vmid}: {reads} reads, {writes} writes")

    now = figures(runs, tags)
    if BASELINE.exists():
        print_against(now, json.loads(BASELINE.read_text()))
    print_top(runs["rerun"]["plays"], args.top)
    if args.save_baseline:
        BASELINE.write_text(dump_figures(now))
        print(f"\nbaseline stored in {BASELINE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
