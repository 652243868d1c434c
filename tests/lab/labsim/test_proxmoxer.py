"""proxmoxer (the client community.proxmox uses) works against the simulator with token and password auth."""

from __future__ import annotations

import time

import pytest

proxmoxer = pytest.importorskip("proxmoxer")


@pytest.fixture(autouse=True)
def no_ca_bundle_env(monkeypatch):
    # requests lets these variables override verify=False; the lab's certificate is self-signed.
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)


def wait(prox, upid):
    for _ in range(500):
        st = prox.nodes("pve").tasks(upid).status.get()
        if st["status"] == "stopped":
            return st
        time.sleep(0.02)
    raise AssertionError("task did not finish")


def connect(lab, how):
    host, port = lab.desc["pve_host"], lab.desc["pve_port"]
    if how == "token":
        user, name = lab.desc["token_id"].split("!")
        return proxmoxer.ProxmoxAPI(
            host,
            port=port,
            user=user,
            token_name=name,
            token_value=lab.desc["token_secret"],
            verify_ssl=False,
        )
    return proxmoxer.ProxmoxAPI(
        host, port=port, user="root@pam", password=lab.desc["password"], verify_ssl=False
    )


@pytest.mark.parametrize(("how", "vmid"), [("token", 500), ("password", 501)])
def test_proxmoxer_create_configure_start(lab, how, vmid):
    prox = connect(lab, how)
    assert prox.version.get()["release"] == "9.2"
    upid = prox.nodes("pve").qemu.post(
        vmid=vmid,
        name=f"px{vmid}",
        memory="1024",
        scsi0="local-zfs:2",
        net0="virtio,bridge=vmbr0",
        agent="enabled=1",
        onboot=0,
    )
    assert wait(prox, upid)["exitstatus"] == "OK"
    cfg = prox.nodes("pve").qemu(vmid).config.get()
    prox.nodes("pve").qemu(vmid).config.put(cores=2, digest=cfg["digest"], delete="onboot")
    cfg = prox.nodes("pve").qemu(vmid).config.get()
    assert cfg["cores"] == 2 and "onboot" not in cfg
    assert wait(prox, prox.nodes("pve").qemu(vmid).status.start.post())["exitstatus"] == "OK"
    assert prox.nodes("pve").qemu(vmid).status.current.get()["status"] == "running"
    wait(prox, prox.nodes("pve").qemu(vmid).status.stop.post())


def test_proxmoxer_raises_with_pve_message(lab):
    prox = connect(lab, "token")
    with pytest.raises(proxmoxer.core.ResourceException) as exc:
        prox.nodes("pve").qemu.post(vmid=502, onboot="true")
    assert exc.value.status_code == 400
    assert exc.value.errors == {"onboot": "type check ('boolean') failed - got 'true'"}


def test_proxmoxer_root_password_may_pass_a_raw_gpu(lab):
    prox = connect(lab, "password")
    upid = prox.nodes("pve").qemu.post(vmid=503, machine="q35", hostpci0="0000:02:00,pcie=1")
    assert wait(prox, upid)["exitstatus"] == "OK"
    with pytest.raises(proxmoxer.core.ResourceException) as exc:
        connect(lab, "token").nodes("pve").qemu.post(vmid=504, hostpci0="0000:02:00")
    assert "only root can set 'hostpci0'" in str(exc.value)
