"""The SSH path for real: paramiko to a real sshd, driving the real dnsmasq of the router namespace."""

from pathlib import Path

import pytest

from gpulab.routers import make_backend
from gpulab.routers.model import AuthError, ConnectError
from gpulab.routers.shell import SSHShell

pytestmark = pytest.mark.root

MAC = "bc:24:11:00:04:31"


def test_dnsmasq_over_ssh_reserves_and_client_gets_it(lan, dnsmasq_router, sshd):
    lan.add_client(MAC)
    held = lan.dhcp(MAC)
    cfg = {
        "kind": "dnsmasq", "address": "192.168.100.1", "subnet": lan.subnet, "pool": lan.pool,
        "ssh": {"host": sshd["host"], "port": sshd["port"], "user": "root", "key_file": sshd["key_file"],
                "host_key_checking": False},
        "options": dnsmasq_router,
    }  # fmt: skip
    with make_backend(cfg) as b:
        b.ensure(MAC, None, "vm-1")
        assert b.apply().changed
    assert f"{MAC},{held},vm-1" in Path(dnsmasq_router["hostsfile"]).read_text()
    assert lan.dhcp(MAC) == held
    with make_backend(cfg) as b:
        b.ensure(MAC, None, "vm-1")
        assert b.apply().changed is False


def test_unknown_host_key_and_wrong_key_are_refused(sshd, tmp_path):
    with pytest.raises(ConnectError, match="known_hosts"):
        SSHShell(sshd["host"], port=sshd["port"], key_filename=sshd["key_file"], host_key_checking=True,
                 known_hosts=str(tmp_path / "empty"))  # fmt: skip
    other = sshd["dir"] / "host_key"  # a valid key that is not authorised
    with pytest.raises(AuthError, match="SSH login"):
        SSHShell(sshd["host"], port=sshd["port"], key_filename=str(other), host_key_checking=False)


def test_accept_new_records_the_key_then_strict_trusts_it(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    args = f"-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=accept-new"
    cfg = {"kind": "dnsmasq", "address": "192.168.100.1", "options": {"leasefile": str(tmp_path / "none")},
           "ssh": {"host": sshd["host"], "port": sshd["port"], "key_file": sshd["key_file"], "ssh_args": args}}  # fmt: skip
    with make_backend(cfg) as b:
        assert b.list_leases() == []
    assert kh.read_text().startswith(f"[127.0.0.1]:{sshd['port']} ssh-ed25519 ")
    strict = {**cfg, "ssh": {**cfg["ssh"], "ssh_args": f"-o UserKnownHostsFile={kh}"}}
    with make_backend(strict) as b:
        assert b.list_leases() == []
    # a different key recorded for that address: refused even with accept-new
    other = (sshd["dir"] / "client_key.pub").read_text().split()[:2]
    kh.write_text(f"[127.0.0.1]:{sshd['port']} {other[0]} {other[1]}\n")
    with pytest.raises(ConnectError, match="changed"):
        make_backend(cfg)
