"""The network lab on fixture two-gpus: a VM host started with both cards sees both (the GPU file the lab's
nvidia-smi stand-in reads), each with its own UUID; a VM with one card sees only that one.

Needs root (network namespaces, veth links, mounts); run under the lab lock like the other network-lab tests.
"""

import json

import pytest
from unit.labsim.conftest import NETWORK_LAB

from lab.labsim.test_netlab_hosts import ens18, ssh, vm_config
from labsim import network_lab
from labsim.fixture import load_fixture

pytestmark = NETWORK_LAB


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    state = tmp_path_factory.mktemp("network_lab_two_gpus")
    fixture = load_fixture("two-gpus")
    fixture["network"] = {**fixture.get("network", {}), "vm_init": "simple"}
    facts = network_lab.up(state, fixture)
    yield state, fixture, facts
    network_lab.down(state)


def guest_gpus(lab, vmid, name, mac, hostpci):
    state, fixture, facts = lab
    hooks = network_lab.make_hooks(state, fixture)
    cfg = {**vm_config(facts, name, mac), **hostpci}
    hooks.vm_started("pve", vmid, cfg)
    try:
        (addr,) = ens18(hooks, vmid, cfg)
        return json.loads(ssh(facts, "ubuntu", addr, "cat /etc/gpulab-sim/gpus.json").stdout)
    finally:
        hooks.vm_destroyed("pve", vmid)


def test_a_vm_with_both_cards_sees_both_and_one_with_a_card_sees_that_one(lab):
    # as PVE's start hands them to the hooks: each mapping with the address it maps on the node
    both = guest_gpus(
        lab,
        197,
        "two-cards",
        "bc:24:11:00:10:17",
        {
            "hostpci0": "host=0000:02:00,mapping=rtx3090,pcie=1",
            "hostpci1": "host=0000:05:00,mapping=rtx3060,pcie=1",
        },
    )
    assert [(g["name"], g["memory_mib"], g["pci_bus_id"]) for g in both] == [
        ("NVIDIA GeForce RTX 3090", 24576, "00000000:01:00.0"),
        ("NVIDIA GeForce RTX 3060 Lite Hash Rate", 12288, "00000000:02:00.0"),
    ]
    assert len({g["uuid"] for g in both}) == 2
    (one,) = guest_gpus(lab, 198, "one-card", "bc:24:11:00:10:18", {"hostpci0": "0000:05:00,pcie=1"})
    assert one["uuid"] == both[1]["uuid"] and one["host_address"] == "0000:05:00.0"


def test_a_start_through_the_api_and_the_resume_after_down_and_up_pass_both_mapped_cards(
    tmp_path, capsys, monkeypatch
):
    from unit.labsim.pve_sim_client import create_booting_vm, token_api

    from lab.labsim.test_netlab_resume import wait_address
    from labsim import cli
    from labsim.fixture import fixtures_dir

    monkeypatch.delenv(cli.API_ONLY_ENV, raising=False)
    state = tmp_path / "state"
    fixture = tmp_path / "fixture.yml"
    fixture.write_text(
        json.dumps({"extends": str(fixtures_dir() / "two-gpus.yml"), "network": {"vm_init": "simple"}})
    )

    def guest_file():
        path = (
            network_lab.NetworkLab(state).hosts_dir / "vm100" / "upper" / "etc" / "gpulab-sim" / "gpus.json"
        )
        return json.loads(path.read_text())

    try:
        assert cli.main(["up", "--state", str(state), "--fixture", str(fixture)]) == 0
        api = token_api(json.loads(capsys.readouterr().out))
        for mid, path, vd, group, sub in (
            ("rtx3090", "0000:02:00", "10de:2204", 13, "1462:3881"),
            ("rtx3060", "0000:05:00", "10de:2504", 16, "1462:397d"),
        ):
            api.data(
                "POST",
                "/cluster/mapping/pci",
                id=mid,
                map=f"node=pve,path={path},id={vd},iommugroup={group},subsystem-id={sub}",
            )
        st = create_booting_vm(
            api,
            100,
            "vm-gpu",
            machine="q35",
            memory="4096",
            hostpci0="mapping=rtx3090,pcie=1",
            hostpci1="mapping=rtx3060,pcie=1",
        )
        assert st["exitstatus"] == "OK", st
        assert api.run("POST", "/nodes/pve/qemu/100/status/start")["exitstatus"] == "OK"
        assert wait_address(api, 100), "the VM's host never reported an address"
        first = guest_file()
        assert [g["host_address"] for g in first] == ["0000:02:00.0", "0000:05:00.0"]

        assert cli.main(["down", "--state", str(state)]) == 0
        assert cli.main(["up", "--state", str(state), "--fixture", str(fixture)]) == 0
        api = token_api(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert wait_address(api, 100), "after down and up the running VM's host did not boot again"
        assert guest_file() == first  # the same two cards, the same UUIDs
    finally:
        cli.down(state)
