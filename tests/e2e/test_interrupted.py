"""Nothing lost: the demo's first converge killed (SIGKILL of ansible-playbook and its workers) at a fixed list of
points, one in each stage that writes, on one fresh lab, each run resuming where the one before was killed;
then a run that completes, and a run after it with changed=0. In between, a second run against the same lab is
refused by name (the run lock on the node), and each run after a kill takes the dead run's lock over. Teardown
afterwards keeps a VM without gpulab's tag (an adopted one) until the owner names it, backing it up first.

The kill points (KILLS) are chosen by what the run is doing, never by time: a PVE request seen in the simulator's
request log (the first VM create, its task still running), or a task's header on ansible-playbook's output
(the task has started: the router write, the guests' package install, HAMi's install). The lab is conftest's: a fresh one for this module. The figures (each point, the run's seconds, what the lab
held when it was killed)
are printed at the end (pytest -s shows them) and kept in the module's FIGURES.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import ansible_runs
import pytest

from .helpers import DEMO, REPO, RunningLab, api, playbook_env, wait_task
from .test_faults_pve import DEMO_VMS, _assert_demo_vms_once

pytestmark = [pytest.mark.root, pytest.mark.slow]

CREATE = re.compile(r"^POST /api2/json/nodes/[^/]+/qemu$")
RECAP = re.compile(
    r"^(?P<host>\S+)\s*: ok=\d+\s+changed=(?P<changed>\d+)\s+unreachable=\d+\s+failed=(?P<failed>\d+)", re.M
)
LOCKED = "another gpulab run holds this lab's run lock"
TOOK_OVER = "took over this lab's run lock"
FIGURES: list[dict[str, Any]] = []


class Run:
    """ansible-playbook site.yml on the demo lab in its own session, killed (the whole group, SIGKILL) the
    moment `kill_when(run)` holds; `on_line(run, line)` sees each output line."""

    def __init__(self, lab: RunningLab, kill_when: Callable[[Run], bool] | None = None, on_line=None):
        self.lab, self.kill_when, self.on_line = lab, kill_when, on_line
        self.mark = len(lab.requests())
        self.lines: list[str] = []
        self.killed = False
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [str(ansible_runs.BIN / "ansible-playbook"), "-i", str(DEMO), str(REPO / "site.yml")],
            cwd=REPO,
            env=playbook_env(lab),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def requests(self) -> list[str]:
        return [f"{r['method']} {r['path']}" for r in self.lab.requests()[self.mark :]]

    def at_task(self, task: str) -> bool:
        """A task whose header starts with `task` (role prefix and name, as the output shows it) has started."""
        return any(line.startswith(f"TASK [{task}") for line in list(self.lines))

    def wait(self, timeout: float = 900) -> tuple[int, str]:
        watcher = threading.Thread(target=self._watch, daemon=True)
        watcher.start()
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.on_line:
                self.on_line(self, line)
        rc = self.proc.wait(timeout)
        self.seconds = round(time.monotonic() - self.started, 1)
        return rc, "".join(self.lines)

    def _watch(self) -> None:
        while self.proc.poll() is None and self.kill_when is not None:
            if self.kill_when(self):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.killed = True
                return
            time.sleep(0.05)


# (kill point, the stage it lands in, when) in the order the resumed runs reach them
KILLS: list[tuple[str, str, Callable[[Run], bool]]] = [
    (
        "the first VM create sent, its task running",
        "vms",
        lambda r: any(CREATE.match(x) for x in r.requests()),
    ),
    (
        "the reservations being written",
        "network",
        lambda r: r.at_task("gpulab.homelab.router_dhcp : Reserve the VMs' addresses"),
    ),
    (
        "the base packages being installed",
        "guests",
        lambda r: r.at_task("gpulab.homelab.guest_base : Install the base packages"),
    ),
    (
        "HAMi's chart placed, its install running",
        "hami",
        lambda r: r.at_task("gpulab.homelab.hami : Wait for the chart's install"),
    ),
]


def inventory_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(DEMO.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(DEMO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def reservations(lab: RunningLab) -> list[str]:
    """The dnsmasq hostsfile on the lab's router host: its reservation lines."""
    files = list((lab.state / "net" / "hosts").glob("*/upper/etc/dnsmasq.gpulab-hosts"))
    if not files:
        return []
    return [ln for ln in files[0].read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def snapshot(lab: RunningLab) -> dict[str, Any]:
    vms = {
        int(v["vmid"]): (v.get("status"), v.get("lock"))
        for v in api(lab, "GET", "/cluster/resources", type="vm")
    }
    return {"vms": vms, "reservations": len(reservations(lab))}


def changed(output: str) -> dict[str, int]:
    return {m["host"]: int(m["changed"]) for m in RECAP.finditer(output.split("PLAY RECAP", 1)[-1])}


def test_a_first_converge_killed_in_each_stage_resumes_and_ends_as_an_uninterrupted_one(lab):
    before = inventory_digest()
    concurrent: dict[str, Any] = {}

    def second_run_once_locked(run: Run, line: str) -> None:
        # once this run holds the lock (its lock task said ok), another run against the lab starts
        if line.startswith("TASK [Take the run lock"):
            concurrent["lock task"] = True
        elif concurrent.get("lock task") and "second" not in concurrent and line.startswith("ok: ["):
            concurrent["holder"] = run.proc.pid
            concurrent["second"] = ansible_runs.ansible_playbook(
                "-i", DEMO, REPO / "site.yml", "--tags", "vms", env=playbook_env(lab), timeout=300
            )

    for n, (point, stage, kill_when) in enumerate(KILLS):
        run = Run(lab, kill_when, on_line=second_run_once_locked if n == 1 else None)
        rc, out = run.wait()
        assert run.killed, f"the run ended (rc {rc}) before the kill point {point!r}:\n{out[-4000:]}"
        if n:
            assert TOOK_OVER in out and "its run is gone" in out, out[-4000:]
        FIGURES.append({"kill point": point, "stage": stage, "s": run.seconds, "end state": snapshot(lab)})
        print("kill test:", json.dumps(FIGURES[-1]), flush=True)

    second = concurrent["second"]
    assert second.returncode != 0
    assert f"PID {concurrent['holder']} on controller" in second.stdout, second.stdout[-3000:]
    assert LOCKED in second.stdout and re.search(
        r"PID \d+ on controller \S+ \(user \S+\), started ", second.stdout
    )

    final = Run(lab)
    rc, out = final.wait()
    assert rc == 0, out[-6000:]
    assert TOOK_OVER in out
    FIGURES.append({"kill point": None, "stage": "all", "s": final.seconds, "end state": snapshot(lab)})

    _assert_demo_vms_once(lab)
    for vmid in DEMO_VMS:
        assert api(lab, "GET", f"/nodes/{lab.info['node']}/qemu/{vmid}/config").get("tags") == "gpulab"
    lines = reservations(lab)
    macs = [ln.split(",")[0] for ln in lines]
    assert len(macs) == len(set(macs)) >= len(DEMO_VMS), lines
    assert inventory_digest() == before

    again = Run(lab)
    rc, out = again.wait()
    assert rc == 0 and TOOK_OVER not in out, out[-4000:]
    assert set(changed(out).values()) == {0}, changed(out)
    FIGURES.append(
        {"kill point": None, "stage": "all (again)", "s": again.seconds, "end state": snapshot(lab)}
    )
    print("\nkill test figures:\n" + "\n".join(json.dumps(f) for f in FIGURES))


def test_teardown_keeps_a_vm_without_the_tag_until_its_owner_names_it(lab):
    node = lab.info["node"]
    upid = api(lab, "POST", f"/nodes/{node}/qemu/101/config", delete="tags")  # vm-2 as if adopted
    if upid:
        assert wait_task(lab, upid)["exitstatus"] == "OK"
    teardown = ["playbooks/teardown.yml", "-e", "gpulab_teardown_confirm=destroy-lab-vms"]
    proc = ansible_runs.ansible_playbook("-i", DEMO, *teardown, env=playbook_env(lab), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "VM 101 (vm-2) does not carry the tag 'gpulab'" in proc.stdout
    vms = {int(v["vmid"]) for v in api(lab, "GET", "/cluster/resources", type="vm")}
    assert vms == {101}
    # vm-1 and vm-gpu are gone: the k3s uninstall plays may only reach vm-2 now
    proc = ansible_runs.ansible_playbook(
        "-i", DEMO, *teardown, "--limit", "localhost,vm-2", "-e", "gpulab_teardown_adopted=vm-2",
        "-e", "gpulab_teardown_backup_storage=local", env=playbook_env(lab), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert api(lab, "GET", "/cluster/resources", type="vm") == []
    backups = api(lab, "GET", f"/nodes/{node}/storage/local/content", content="backup")
    assert [v["volid"].split("/")[-1].startswith("vzdump-qemu-101-") for v in backups] == [True]
