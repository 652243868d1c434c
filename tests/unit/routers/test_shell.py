"""Shell helpers: OpenSSH argument parsing, reading and atomically writing files."""

import pytest

from gpulab.routers.model import RouterError
from gpulab.routers.shell import LocalShell, parse_ssh_args


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ("-o UserKnownHostsFile=/lab/kh -o StrictHostKeyChecking=accept-new", ("/lab/kh", "accept-new")),
        ("-oStrictHostKeyChecking=no -o ControlMaster=auto", (None, "no")),
        ("-o 'StrictHostKeyChecking yes'", (None, "strict")),
        ("-o stricthostkeychecking=ask -o UserKnownHostsFile='/a b/kh /other'", ("/a", "strict")),
        ("", (None, None)),
        (None, (None, None)),
    ],
)
def test_parse_ssh_args(args, want):
    got = parse_ssh_args(args)
    assert (got["known_hosts"], got["policy"]) == want


def test_read_and_atomic_write(tmp_path):
    sh = LocalShell()
    target = tmp_path / "sub dir" / "file"
    assert sh.read(str(target)) is None
    sh.write_atomic(str(target), "a\nb'c\n")
    assert sh.read(str(target)) == "a\nb'c\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file"]  # no temp file left
    with pytest.raises(RouterError, match="exit 3"):
        sh.check("exit 3", doing="testing")


class DroppingShell(LocalShell):
    """A router host whose connection drops while a command's input is sent: the command sees only the first
    `keep` bytes and then end of input, as the router's shell does when SSH goes away."""

    def __init__(self, keep: int):
        super().__init__()
        self.keep = keep

    def run(self, cmd, *, stdin=None):
        return super().run(cmd, stdin=None if stdin is None else stdin.encode()[: self.keep].decode())


@pytest.mark.parametrize("keep", [0, 1, 20, 39])
def test_a_write_cut_short_leaves_the_previous_file_serving(tmp_path, keep):
    target = tmp_path / "dnsmasq.gpulab-hosts"
    before = "bc:24:11:00:00:01,192.168.100.53,vm-1\n"
    target.write_text(before)
    after = before + "bc:24:11:00:00:02,192.168.100.54,vm-2\n"
    assert keep < len(after.encode())
    with pytest.raises(RouterError, match=rf"only {keep} of {len(after.encode())} bytes arrived"):
        DroppingShell(keep).write_atomic(str(target), after)
    assert target.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # the short temp file is gone
    LocalShell().write_atomic(str(target), after)  # the next run writes it whole
    assert target.read_text() == after
