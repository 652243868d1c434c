"""The first-boot hook of `gpulab install-media`, run as root in a mount namespace of its own (/etc and /root
overlaid, so nothing of this machine changes) with stand-ins for the node's tools: on a GRUB node (ext4 or
xfs root) it puts the seed's kernel parameters into GRUB_CMDLINE_LINUX_DEFAULT of /etc/default/grub, where
stage host's kernel_cmdline module keeps them (so stage host then has nothing to add, and no grub.d snippet
to warn about), and a second run changes nothing. The systemd-boot node and the API access are proven on
the lab's node (tests/e2e/test_first_boot.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from unit.install import install_media

pytestmark = [pytest.mark.root]
ROOT = Path(__file__).resolve().parents[3]
PARAMS = ["nomodeset", "modprobe.blacklist=nova_core,nova_drm,nova,nouveau"]
TOOLS = {
    # not a systemd-boot node: proxmox-boot-tool knows no ESP
    "proxmox-boot-tool": 'echo "proxmox-boot-tool $*" >> "$CALLS"; [ "$1" = status ] && exit 2; exit 0',
    "update-grub": 'echo update-grub >> "$CALLS"',
    "update-initramfs": 'echo "update-initramfs $*" >> "$CALLS"',
    # the API access is there already (the lab test makes it)
    "pvesh": "exit 0",
    "pveum": 'echo "pveum $*" >> "$CALLS"',
}


def load_kernel_cmdline():
    path = ROOT / "plugins" / "modules" / "kernel_cmdline.py"
    spec = importlib.util.spec_from_file_location("hook_kernel_cmdline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("media") / "out"
    proc = install_media(
        ROOT / "inventory" / "homelab", out, HOME=str(out.parent), GPULAB_PVE_ROOT_PASSWORD="a root password"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "first-boot.sh"


def run_hook(hook: Path, work: Path, grub: str, times: int = 1) -> tuple[list[str], Path, str]:
    """The hook run `times` times as root with /etc and /root overlaid (the changes land in work/etc,
    work/root); its output, the folder of /etc's changes, and the stand-ins' calls."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a mount namespace)")
    bin_ = work / "bin"
    bin_.mkdir()
    for name, body in TOOLS.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    (work / "grub").write_text(grub)
    calls = work / "calls"
    script = f"""
set -e
mount -t tmpfs tmpfs {work}/ov
for d in etc root; do
    mkdir -p {work}/ov/$d {work}/ov/$d.work
    mount -t overlay overlay -o lowerdir=/$d,upperdir={work}/ov/$d,workdir={work}/ov/$d.work /$d
done
mkdir -p /etc/default /etc/modprobe.d /etc/apt/sources.list.d
rm -f /etc/kernel/cmdline /etc/default/grub.d/gpulab.cfg
cp {work}/grub /etc/default/grub
for i in $(seq {times}); do echo "--- run $i"; bash {hook}; echo "--- calls $i"; cat "$CALLS" 2>/dev/null; : > "$CALLS"; done
mkdir -p {work}/etc
cp /etc/default/grub {work}/etc/grub
ls /etc/default/grub.d > {work}/etc/grub.d.list 2>/dev/null || true
"""
    (work / "ov").mkdir()
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CALLS": str(calls)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = proc.stdout.split("--- run ")[1:]
    return runs, work / "etc", proc.stdout


DEBIAN_GRUB = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'


def test_on_a_grub_node_the_parameters_go_where_stage_host_keeps_them(hook: Path, tmp_path: Path) -> None:
    runs, etc, _ = run_hook(hook, tmp_path, DEBIAN_GRUB, times=2)
    grub = (etc / "grub").read_text()
    assert f'GRUB_CMDLINE_LINUX_DEFAULT="quiet {" ".join(PARAMS)}"\n' in grub
    assert grub.replace(f" {' '.join(PARAMS)}", "") == DEBIAN_GRUB  # nothing else changed
    assert "gpulab.cfg" not in (etc / "grub.d.list").read_text()
    first, second = runs
    assert "update-grub" in first and "update-initramfs -u -k all" in first
    # a second run changes nothing: no edit, no update-grub
    assert "kernel command line" not in second and "update-grub" not in second
    # stage host's module finds every parameter there: it has nothing to add
    k = load_kernel_cmdline()
    text, _before, _after, changes = k.edit_grub(
        grub, present=["nomodeset"], blacklist=["nova_core", "nova_drm", "nova", "nouveau"]
    )
    assert changes == [] and text == grub


@pytest.mark.parametrize(
    "grub",
    [
        "GRUB_DEFAULT=0\n",  # no assignment at all
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet $EXTRA"\n',  # one the shell expands
    ],
)
def test_a_grub_file_of_another_form_gets_the_parameters_added_once(
    hook: Path, tmp_path: Path, grub: str
) -> None:
    runs, etc, _ = run_hook(hook, tmp_path, grub, times=2)
    text = (etc / "grub").read_text()
    assert text.startswith(grub)
    added = text[len(grub) :]
    assert added == f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {" ".join(PARAMS)}"\n'
    # what GRUB's shell reads
    value = subprocess.run(
        ["bash", "-c", f'EXTRA=x; . {etc / "grub"}; printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert value.split()[-2:] == PARAMS
    assert "kernel command line" not in runs[1]
