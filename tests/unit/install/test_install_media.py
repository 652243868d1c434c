"""`gpulab install-media INVENTORY OUTDIR` on the reference inventory: an answer file the check accepts, the
root password only as its SHA-512 crypt hash, the node's network from the inventory, a first-boot hook that
`bash -n` and shellcheck accept; bad inventory values refused naming the field, with nothing written."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpulab.install import answer
from gpulab.install.sha512crypt import sha512_crypt

from . import install_media as run_install_media

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "correct horse battery"


def install_media(inventory: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # no ~/.ssh keys of this machine's user
    return run_install_media(inventory, out, *args, HOME=str(out.parent / "home"), **env)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("media") / "out"
    proc = install_media(ROOT / "inventory" / "homelab", out, GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    return out, proc


def test_the_reference_inventory_gives_an_answer_the_check_accepts(written) -> None:
    out, proc = written
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "answer.toml is accepted by the answer format of proxmox/pve-installer 9.2.7" in proc.stdout
    text = (out / "answer.toml").read_text()
    assert answer.check_text(text) == []
    check = subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "install-media", "--check", str(out / "answer.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout
    assert (out / "answer.toml").stat().st_mode & 0o777 == 0o600  # it holds the password hash


def test_the_answer_holds_the_node_as_the_inventory_describes_it(written) -> None:
    out, _ = written
    data = tomllib.loads((out / "answer.toml").read_text())
    assert data["global"]["fqdn"] == "pve.home.arpa"
    assert (data["global"]["country"], data["global"]["timezone"]) == ("my", "Asia/Kuala_Lumpur")
    assert data["network"] == {
        "source": "from-answer",
        "cidr": "192.168.100.5/24",
        "gateway": "192.168.100.1",
        "dns": "192.168.100.1",
        "filter": {"ID_NET_NAME_MAC": "*"},
    }
    assert data["disk-setup"] == {"filesystem": "zfs", "disk-list": ["nvme0n1"], "zfs": {"raid": "raid0"}}
    assert data["first-boot"] == {"source": "from-iso", "ordering": "fully-up"}


def test_the_root_password_is_only_written_hashed(written) -> None:
    out, proc = written
    hashed = tomllib.loads((out / "answer.toml").read_text())["global"]["root-password-hashed"]
    salt = hashed.split("$")[2]
    assert sha512_crypt(PASSWORD, salt) == hashed
    for path in out.iterdir():
        assert PASSWORD not in path.read_text(), path
    assert PASSWORD not in proc.stdout + proc.stderr


def test_the_first_boot_hook_passes_bash_and_shellcheck(written) -> None:
    hook = written[0] / "first-boot.sh"
    assert hook.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(hook)], capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is missing: make deps installs it (system-packages.txt)")
    sc = subprocess.run(["shellcheck", str(hook)], capture_output=True, text=True, check=False)
    assert sc.returncode == 0, sc.stdout
    text = hook.read_text()
    # the seed's kernel parameters, the token as access.yml makes it
    assert 'params=("nomodeset" "modprobe.blacklist=nova_core,nova_drm,nova,nouveau")' in text
    assert 'pveum user token add "$user" "$token" --privsep 1' in text


def test_the_instructions_name_the_commands(written) -> None:
    text = (written[0] / "README-install.md").read_text()
    assert "proxmox-auto-install-assistant prepare-iso" in text and "--on-first-boot first-boot.sh" in text
    assert "nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau" in text
    assert "Proxmox/Install/Config.pm" in text


def copy(tmp_path: Path, edit: str) -> Path:
    inv = tmp_path / "mylab"
    shutil.copytree(ROOT / "inventory" / "homelab", inv)
    node = inv / "host_vars" / "pve.yml"
    node.write_text(node.read_text() + edit)
    return inv


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            "pve_install_repository: nightly\n",
            "pve: pve_install_repository='nightly': not a Proxmox VE repository",
        ),
        ("pve_install_filesystem: ntfs\n", "pve: pve_install_filesystem='ntfs': not ext4, xfs, zfs or btrfs"),
        ("pve_host_cmdline_extra: ['a\"b']\n", "pve: pve_host_cmdline_extra='a\"b': not a kernel parameter"),
    ],
)
def test_a_bad_inventory_value_is_refused_naming_the_field(tmp_path: Path, edit: str, field: str) -> None:
    out = tmp_path / "out"
    proc = install_media(copy(tmp_path, edit), out, GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert proc.returncode == 1
    assert field in proc.stdout, proc.stdout
    assert not out.exists()


def test_a_short_password_is_refused_and_a_missing_one_left_to_fill_in(tmp_path: Path) -> None:
    short = install_media(ROOT / "inventory" / "homelab", tmp_path / "a", GPULAB_PVE_ROOT_PASSWORD="short")
    assert short.returncode == 1 and "pve_install_root_password='(hidden)': shorter than 8" in short.stdout
    none = install_media(ROOT / "inventory" / "homelab", tmp_path / "b")
    assert none.returncode == 1
    assert '# root-password-hashed = "CHANGE-ME"' in (tmp_path / "b" / "answer.toml").read_text()
    assert (
        "global.root-password-hashed=(not set): one of root-password and root-password-hashed" in none.stdout
    )


def test_the_root_password_comes_from_the_vault(tmp_path: Path) -> None:
    inv = copy(tmp_path, "")
    vault = inv / "group_vars" / "all" / "vault.yml"
    vault.write_text(f"vault_pve_root_password: {PASSWORD}\n")
    (tmp_path / "pass").write_text("vault-pass\n")
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "ansible-vault"),
            "encrypt",
            "--vault-password-file",
            "pass",
            str(vault),
        ],
        cwd=tmp_path,
        capture_output=True,
        check=True,
    )
    assert PASSWORD not in vault.read_text()
    locked = install_media(inv, tmp_path / "locked")
    assert locked.returncode == 1
    assert (
        "gpulab install-media: cannot read inventory" in locked.stderr
        and "--vault-password-file" in locked.stderr
    )
    proc = install_media(inv, tmp_path / "out", "--vault-password-file", str(tmp_path / "pass"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hashed = tomllib.loads((tmp_path / "out" / "answer.toml").read_text())["global"]["root-password-hashed"]
    assert sha512_crypt(PASSWORD, hashed.split("$")[2]) == hashed


def test_root_s_ssh_keys_from_the_inventory_else_the_user_s(tmp_path: Path) -> None:
    home = tmp_path / "home" / ".ssh"
    home.mkdir(parents=True)
    (home / "id_ed25519.pub").write_text("ssh-ed25519 AAAAmine me@controller\n")
    (home / "id_ed25519").write_text("private, never read\n")
    mine = install_media(ROOT / "inventory" / "homelab", tmp_path / "a", GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert mine.returncode == 0, mine.stdout
    data = tomllib.loads((tmp_path / "a" / "answer.toml").read_text())
    assert data["global"]["root-ssh-keys"] == ["ssh-ed25519 AAAAmine me@controller"]
    inv = copy(tmp_path, "pve_install_root_ssh_keys: ['ssh-ed25519 AAAAtheirs admin@lab']\n")
    theirs = install_media(inv, tmp_path / "b", GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert theirs.returncode == 0, theirs.stdout
    data = tomllib.loads((tmp_path / "b" / "answer.toml").read_text())
    assert data["global"]["root-ssh-keys"] == ["ssh-ed25519 AAAAtheirs admin@lab"]


def test_the_management_nic_is_matched_by_its_mac(tmp_path: Path) -> None:
    inv = copy(tmp_path, "pve_install_nic_mac: 'AA:BB:CC:00:11:22'\n")
    proc = install_media(inv, tmp_path / "out", GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert proc.returncode == 0, proc.stdout
    text = (tmp_path / "out" / "answer.toml").read_text()
    # udev's ID_NET_NAME_MAC is enx<mac in lower case without colons>
    assert tomllib.loads(text)["network"]["filter"] == {"ID_NET_NAME_MAC": "*aabbcc001122"}
    assert "CHANGE-ME on a PC with more than one NIC" not in text


def test_what_gpulab_does_not_know_is_a_change_me_comment_saying_what_goes_there(tmp_path: Path) -> None:
    pve = ROOT / "inventory" / "homelab" / "host_vars" / "pve.yml"
    inv = copy(tmp_path, "")
    edited = (
        pve.read_text().replace("pve_install_country: my\n", "").replace("pve_install_disks: [nvme0n1]\n", "")
    )
    (inv / "host_vars" / "pve.yml").write_text(edited)
    proc = install_media(inv, tmp_path / "out", GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert proc.returncode == 1
    text = (tmp_path / "out" / "answer.toml").read_text()
    assert '# country = "CHANGE-ME"  # two-letter country code for the mirrors (pve_install_country)' in text
    assert '# disk-list = ["CHANGE-ME"]  # the disk(s) to install on' in text
    assert '# zfs.raid = "CHANGE-ME"  # raid0 for one disk, raid1 for two (pve_install_raid)' in text
    assert "global.country=(not set): required and missing" in proc.stdout


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ("pve_install_keyboard: german\n", "pve: pve_install_keyboard='german': not one of de, de-ch"),
        ("pve_install_country: MY\n", "pve: pve_install_country='MY': not a two-letter country code"),
        ("pve_install_timezone: Mars/Olympus\n", "pve: pve_install_timezone='Mars/Olympus': not a time zone"),
        ("pve_install_mailto: nobody\n", "pve: pve_install_mailto='nobody': does not look like a mail"),
        ("pve_install_domain: bad_domain\n", "pve: pve_install_fqdn (or pve_node and pve_install_domain)="),
        ("pve_install_raid: raid1\n", "pve: pve_install_disks=['nvme0n1']: zfs RAID1 needs at least 2 disks"),
        ("pve_install_nic_mac: 'aa:bb'\n", "pve: pve_install_nic_mac='aa:bb': not a MAC address"),
    ],
)
def test_a_value_the_installer_refuses_is_named_by_its_inventory_variable(
    tmp_path: Path, edit: str, field: str
) -> None:
    out = tmp_path / "out"
    proc = install_media(copy(tmp_path, edit), out, GPULAB_PVE_ROOT_PASSWORD=PASSWORD)
    assert proc.returncode == 1
    assert field in proc.stdout, proc.stdout + proc.stderr
    assert not out.exists()


def test_a_node_that_is_not_in_group_proxmox_is_refused_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = install_media(
        ROOT / "inventory" / "homelab", out, "--node", "nosuch", GPULAB_PVE_ROOT_PASSWORD=PASSWORD
    )
    assert proc.returncode == 1
    assert "proxmox: --node='nosuch': install-media writes the install of one node" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    assert "name one of pve with --node HOST" in proc.stdout
    assert not out.exists()
