"""A VM run interrupted at any request, then run again, ends as an uninterrupted run does (a property).

The first run of pve_vm (vm-gpu as stage vms sends it: created from the cloud image with the owner tag,
disk grown, started) dies at the N-th API request it makes: before the request leaves (the controller was
killed) or after PVE took it and before the answer came back (the connection dropped). PVE's tasks go on without
it, so the next run can meet a create, resize or start still running, with the VM locked. The next run must
wait for them, never create or start a second time, and end with exactly one VM, its two volumes (EFI vars and
boot disk), no `unusedN` key, the tag, running; the run after it changes nothing.
"""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unit.pve.conftest import gpu_vm_args, prepare_gpu_lab, run_module, wipe_vms

from gpulab.pve import client as pve_client
from gpulab.vmspec import OWNER_TAG

# Tasks long enough that a run killed during one leaves it running for the next run to meet.
TIMINGS = {"qmcreate": 0.3, "resize": 0.15, "qmstart": 0.2}
VOLATILE = ("digest", "vmgenid", "smbios1", "meta")


class Killed(BaseException):
    """The controller died (a BaseException: nothing in the module catches it, as nothing catches SIGKILL)."""


class KillAt:
    """Patches the PVE client's HTTP session: request number `at` (1-based) is the last; `after` lets it reach
    PVE first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.at, self.after, self.n = 0, False, 0
        self.lock = threading.Lock()
        real = pve_client._Session.request

        def request(session, method, url, *args, **kwargs):
            with self.lock:
                self.n += 1
                last = self.n == self.at
            if last and not self.after:
                raise Killed()
            resp = real(session, method, url, *args, **kwargs)
            if last:
                raise Killed()
            return resp

        monkeypatch.setattr(pve_client._Session, "request", request)

    def arm(self, at: int, after: bool) -> None:
        self.at, self.after, self.n = at, after, 0


def end_state(lab) -> dict:
    client = lab.client()
    vms = client.get("cluster/resources", type="vm")
    config = client.get("nodes/pve/qemu/102/config") if vms else {}
    volumes = sorted(
        re.sub(r"-disk-\d+", "-disk-N", v["volid"])
        for v in client.get("nodes/pve/storage/local-zfs/content")
        if v.get("vmid") == 102
    )
    shape = {
        k: re.sub(r"vm-102-disk-\d+", "vm-102-disk-N", str(v)) for k, v in config.items() if k not in VOLATILE
    }
    shape["net0"] = re.sub(r"=[0-9A-F:]{17}", "=MAC", shape.get("net0", ""))
    return {
        "vms": sorted((int(v["vmid"]), v.get("status"), v.get("lock")) for v in vms),
        "volumes": volumes,
        "config": shape,
    }


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    from unit.pve.conftest import start_lab, stop_lab

    lab = start_lab(tmp_path_factory.mktemp("killed"), TIMINGS)
    prepare_gpu_lab(lab)
    args = gpu_vm_args(lab, state="started", tags=[OWNER_TAG], create_only=["tags"])
    mark = lab.mark()
    assert not run_module("pve_vm", args).get("failed")
    calls = len(lab.requests(mark))
    reference = end_state(lab)
    wipe_vms(lab)
    yield lab, args, calls, reference
    stop_lab(lab)


def test_the_reference_run_ends_with_one_tagged_vm_and_its_two_volumes(interrupted):
    _lab, _args, calls, reference = interrupted
    assert reference["vms"] == [(102, "running", None)]
    assert reference["volumes"] == ["local-zfs:vm-102-disk-N", "local-zfs:vm-102-disk-N"]
    assert reference["config"]["tags"] == OWNER_TAG and not any(
        k.startswith("unused") for k in reference["config"]
    )
    assert calls > 8  # lookup, create, its polls, resize, its polls, config, start, its polls


# (an autouse fixture of the suite takes monkeypatch for the environment; each example patches with its own context)
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), after=st.booleans())
def test_a_run_killed_at_any_request_then_run_again_ends_as_an_uninterrupted_run(
    interrupted, monkeypatch, data, after
):
    lab, args, calls, reference = interrupted
    wipe_vms(lab)
    at = data.draw(st.integers(1, calls), label="killed at request")
    with pytest.MonkeyPatch.context() as mp:
        kill = KillAt(mp)
        kill.arm(at, after)
        with pytest.raises(Killed):
            run_module("pve_vm", args)
    again = run_module("pve_vm", args)
    assert not again.get("failed"), again
    assert end_state(lab) == reference
    last = run_module("pve_vm", args)
    assert last["changed"] is False, last
    assert lab.rejected() == []
