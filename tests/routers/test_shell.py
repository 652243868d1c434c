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
