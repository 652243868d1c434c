"""The lab's guest image (labsim.net.guest_image): its key, its mirror, its checks, its published look."""

import os
import time

import pytest

from labsim.net import guest_image


def test_mirror_is_the_machine_apt_debian_mirror(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: trixie-security\n\n"
        "Types: deb\nURIs: https://mirror.example/debian/\nSuites: trixie\n"
    )
    assert guest_image.machine_mirror([tmp_path / "none.list", deb822]) == "https://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text(
        "# deb http://old.example/debian bookworm main\ndeb [arch=amd64] http://m.example/debian trixie main\n"
    )
    assert guest_image.machine_mirror([one_line]) == "http://m.example/debian"


def test_mirror_falls_back_to_debians_own_without_a_debian_source(tmp_path):
    ubuntu = tmp_path / "ubuntu.sources"
    ubuntu.write_text("Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: noble\n")
    assert guest_image.machine_mirror([ubuntu]) == guest_image.DEFAULT_MIRROR


def test_a_changed_package_list_is_another_image(monkeypatch, tmp_path):
    monkeypatch.setenv(guest_image.CACHE_ENV, str(tmp_path))
    before = guest_image.image_root()
    assert before.parent == tmp_path and before.name.startswith(f"{guest_image.SUITE}-")
    monkeypatch.setattr(guest_image, "PACKAGES", (*guest_image.PACKAGES, "less"))
    assert guest_image.image_root() != before
    assert not guest_image.ready()


def test_an_image_missing_a_command_is_named_with_its_package(tmp_path):
    for path in guest_image.COMMANDS:
        if path != "/usr/bin/sudo":
            target = tmp_path / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
    assert guest_image.missing_in(tmp_path) == ["/usr/bin/sudo (package sudo)"]


def test_finish_makes_the_tree_look_like_a_published_image(tmp_path):
    root = tmp_path
    for d in ("etc/apt/sources.list.d", "var/lib/apt/lists/partial", "var/cache/apt/archives", "etc/ssh"):
        (root / d).mkdir(parents=True)
    (root / "etc/apt/sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
    (root / "etc/apt/sources.list.d/extra.sources").write_text("Types: deb\n")
    (root / "var/lib/apt/lists/deb.debian.org_debian_dists_trixie_InRelease").write_text("x")
    (root / "var/cache/apt/pkgcache.bin").write_text("x")
    (root / "var/cache/apt/archives/sudo_1.9_amd64.deb").write_text("x")
    (root / "etc/ssh/ssh_host_ed25519_key").write_text("secret")
    (root / "etc/ssh/sshd_config").write_text("# stock\n")
    (root / "etc/machine-id").write_text("0123\n")
    (root / "etc/hostname").write_text("builder\n")
    guest_image._finish(root)
    assert not (root / "etc/apt/sources.list").exists()
    assert list((root / "etc/apt/sources.list.d").iterdir()) == []
    assert [p.name for p in (root / "var/lib/apt/lists").iterdir()] == ["partial"]
    assert list((root / "var/cache/apt").glob("*.bin")) == []
    assert list((root / "var/cache/apt/archives").iterdir()) == []
    assert [p.name for p in (root / "etc/ssh").iterdir()] == ["sshd_config"]
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "etc/hostname").exists()
    # apt's cache_valid_time reads the lists' age: the image's is its release date, never today's
    age_days = (time.time() - os.stat(root / "var/lib/apt/lists").st_mtime) / 86400
    assert age_days > 100


def test_build_without_debootstrap_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv(guest_image.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(guest_image.shutil, "which", lambda _name: None)
    with pytest.raises(guest_image.ImageError, match=r"debootstrap.*apt package debootstrap"):
        guest_image.ensure()
    assert list(tmp_path.glob(f"{guest_image.image_key()}*")) == [
        tmp_path / f"{guest_image.image_key()}.lock"
    ]


def test_a_new_image_removes_the_earlier_ones_no_lab_host_uses(monkeypatch, tmp_path):
    monkeypatch.setenv(guest_image.CACHE_ENV, str(tmp_path))
    keep, unused, in_use = (tmp_path / f"{guest_image.SUITE}-{n}" for n in ("aaaa", "bbbb", "cccc"))
    for root in (keep, unused, in_use):
        (root / "etc").mkdir(parents=True)
        (root / guest_image.MANIFEST).write_text("{}\n")
        (tmp_path / f"{root.name}.lock").write_text("")
    monkeypatch.setattr(guest_image, "_in_use", lambda path: path == in_use)
    guest_image._prune(keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [keep.name, f"{keep.name}.lock", in_use.name, f"{in_use.name}.lock"]
    )
