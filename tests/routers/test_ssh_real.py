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
