#!/usr/bin/env python3
"""Benchmark site.yml on a fresh simulated lab: first converge against the no-op re-run.

Prints a table: per stage, the wall time of the first run and of the re-run, the PVE API requests
(reads / writes) and the PVE tasks each started; then the reads and writes per VM on the re-run.
Targets: the re-run takes at most 30 % of the first converge; per VM at most 2 reads, 0 writes.

    .venv/bin/python scripts/benchmark.py [--stages preflight,host,vms,...] [--keep]

Run as root for the whole lab (SSH hosts, DHCP); without root only the API stages can run.
This is a measurement, not a test: it never fails on a number.
"""

from __future__ import annotations

import argparse
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
ALL_STAGES = ["preflight", "host", "vms", "network", "guests", "k3s", "hami", "verify"]
API_ONLY = ["preflight", "vms"]
VM_PATH = re.compile(r"/nodes/[^/]+/qemu/(\d+)(/|$)")
TASK_PATH = re.compile(r"/tasks/([^/]+)/status")


def lab(*args: str, env: dict) -> dict:
    out = subprocess.run([BIN / "gpulab", "lab", *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}


def requests_since(log: Path, offset: int) -> tuple[list[dict], int]:
    if not log.exists():
        return [], offset
    with log.open() as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f if line.strip()]
        return lines, f.tell()


def run_stage(stage: str, env: dict) -> tuple[float, str]:
    start = time.monotonic()
    out = subprocess.run(
        [BIN / "ansible-playbook", "-i", "inventory/demo", "site.yml", "--tags", stage],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - start
    if out.returncode != 0:
        sys.stdout.write(out.stdout[-4000:] + out.stderr[-2000:])
        raise SystemExit(f"stage {stage} failed (rc={out.returncode})")
    changed = sum(int(m) for m in re.findall(r"changed=(\d+)", out.stdout))
    return took, f"changed={changed}"


def summarize(reqs: list[dict]) -> tuple[int, int, int]:
    reads = sum(1 for r in reqs if r["method"] == "GET" and not TASK_PATH.search(r["path"]))
    writes = sum(1 for r in reqs if r["method"] != "GET")
    tasks = len({m.group(1) for r in reqs if (m := TASK_PATH.search(r["path"]))})
    return reads, writes, tasks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", help="comma-separated stages (default: all that can run here)")
    ap.add_argument("--keep", action="store_true", help="leave the lab running afterwards")
    args = ap.parse_args()
    stages = args.stages.split(",") if args.stages else (ALL_STAGES if os.geteuid() == 0 else API_ONLY)

    state = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    env = {
        **os.environ,
        "GPULAB_LAB_STATE": str(state),
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    up_start = time.monotonic()
    lab("up", "--state", str(state), env=env)
    up_took = time.monotonic() - up_start
    log = state / "pve-requests.jsonl"
    offset = requests_since(log, 0)[1]
    results: dict[str, dict] = {}
    try:
        for label in ("first", "rerun"):
            for stage in stages:
                took, changed = run_stage(stage, env)
                reqs, offset = requests_since(log, offset)
                reads, writes, tasks = summarize(reqs)
                results.setdefault(stage, {})[label] = {
                    "s": took,
                    "changed": changed,
                    "reads": reads,
                    "writes": writes,
                    "tasks": tasks,
                    "reqs": reqs,
                }
    finally:
        if not args.keep:
            lab("down", "--state", str(state), env=env)

    print(f"lab up: {up_took:.1f} s (state {state})\n")
    head = (
        f"{'stage':<10} {'first s':>8} {'rerun s':>8} {'first r/w':>10} {'rerun r/w':>10} {'tasks':>6}  rerun"
    )
    print(head)
    print("-" * len(head))
    total = {"first": 0.0, "rerun": 0.0}
    for stage in stages:
        f, r = results[stage]["first"], results[stage]["rerun"]
        total["first"] += f["s"]
        total["rerun"] += r["s"]
        print(
            f"{stage:<10} {f['s']:>8.1f} {r['s']:>8.1f} {f['reads']:>5}/{f['writes']:<4} "
            f"{r['reads']:>5}/{r['writes']:<4} {f['tasks']:>6}  {r['changed']}"
        )
    ratio = total["rerun"] / total["first"] if total["first"] else 0
    print(
        f"{'total':<10} {total['first']:>8.1f} {total['rerun']:>8.1f}   re-run = {ratio:.0%} of the first "
        f"converge (target <= 30%)"
    )

    per_vm: dict[str, list[int]] = {}
    for stage in stages:
        for req in results[stage]["rerun"]["reqs"]:
            m = VM_PATH.search(req["path"])
            if m and not TASK_PATH.search(req["path"]):
                counts = per_vm.setdefault(m.group(1), [0, 0])
                counts[0 if req["method"] == "GET" else 1] += 1
    if per_vm:
        print("\nno-op re-run, requests on each VM's own paths (target: <= 2 reads, 0 writes):")
        for vmid, (reads, writes) in sorted(per_vm.items()):
            print(f"  VM {vmid}: {reads} reads, {writes} writes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
