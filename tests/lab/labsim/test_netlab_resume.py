"""A lab taken down and brought up again boots the hosts of the VMs PVE still has running."""

from __future__ import annotations

import json
import time

from unit.labsim.conftest import NETWORK_LAB
from unit.labsim.pve_sim_client import Api, create_booting_vm, token_api, write_fast_fixture

from labsim import cli

pytestmark = NETWORK_LAB


def agent_addresses(api: Api, vmid: int) -> list[str]:
    r = api.request("GET", f"/nodes/pve/qemu/{vmid}/agent/network-get-interfaces")
    if r.status_code != 200:
        return []
    return [
        a["ip-address"]
        for i in r.json()["data"]["result"]
        if i["name"] != "lo"
        for a in i.get("ip-addresses", [])
        if a["ip-address-type"] == "ipv4"
    ]


def wait_address(api: Api, vmid: int, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = agent_addresses(api, vmid)
        if found:
            return found
        time.sleep(0.3)
    return []


def test_running_vm_boots_again_after_down_and_up(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(cli.API_ONLY_ENV, raising=False)
    state = tmp_path / "state"
    fixture = write_fast_fixture(tmp_path / "fixture.yml")
    try:
        assert cli.main(["up", "--state", str(state), "--fixture", str(fixture)]) == 0
        api = token_api(json.loads(capsys.readouterr().out))
        st = create_booting_vm(api, 100, "vm-1")
        assert st["exitstatus"] == "OK", st
        assert api.run("POST", "/nodes/pve/qemu/100/status/start")["exitstatus"] == "OK"
        first = wait_address(api, 100)
        assert first, "the VM's host never reported an address"

        assert cli.main(["down", "--state", str(state)]) == 0
        assert cli.main(["up", "--state", str(state)]) == 0
        api = token_api(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert api.data("GET", "/nodes/pve/qemu/100/status/current")["status"] == "running"
        assert wait_address(api, 100), "after down and up the running VM's host did not boot again"
    finally:
        cli.down(state)
