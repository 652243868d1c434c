"""files run the way Ansible runs it (JSON arguments, this interpreter) on files in a temporary folder:
directories, whole files, secret files and line sets, each idempotent, in check mode and with diffs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "plugins" / "modules" / "files.py"


def run(files, check=False, diff=True):
    payload = {"ANSIBLE_MODULE_ARGS": {"files": files, "_ansible_check_mode": check, "_ansible_diff": diff}}
    proc = subprocess.run(
        [sys.executable, str(MODULE), json.dumps(payload)], capture_output=True, text=True, timeout=60
    )
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON: rc={proc.returncode} {proc.stdout!r} {proc.stderr!r}")


def mode(path):
    return oct(os.stat(path).st_mode & 0o7777)


def test_a_folder_and_its_files_in_one_call_then_nothing(tmp_path):
    folder = tmp_path / "etc" / "k3s"
    files = [
        {"path": str(folder), "state": "directory", "mode": "0755"},
        {"path": str(folder / "config.yaml"), "content": "node-name: vm-1\n", "mode": "0600"},
    ]
    check = run(files, check=True)
    assert check["changed"] and check["changed_paths"] == [str(folder), str(folder / "config.yaml")]
    assert not folder.exists()  # check mode wrote nothing
    assert check["diff"][1]["after"] == "node-name: vm-1\n"

    first = run(files)
    assert first["changed"] and first["changed_paths"] == [str(folder), str(folder / "config.yaml")]
    assert (folder / "config.yaml").read_text() == "node-name: vm-1\n"
    assert mode(folder) == "0o755" and mode(folder / "config.yaml") == "0o600"

    again = run(files)
    assert again["changed"] is False and again["changed_paths"] == [] and again["diff"] == []


def test_a_changed_file_shows_its_diff_and_a_mode_alone_is_a_change(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old\n")
    path.chmod(0o644)
    entry = {"path": str(path), "content": "new\n", "mode": "0600"}
    check = run([entry], check=True)
    assert check["changed"] and check["diff"][0]["before"] == "old\n" and check["diff"][0]["after"] == "new\n"
    assert path.read_text() == "old\n" and mode(path) == "0o644"
    assert run([entry])["changed"] and path.read_text() == "new\n" and mode(path) == "0o600"

    path.chmod(0o644)
    result = run([entry])
    assert result["changed"] and mode(path) == "0o600" and path.read_text() == "new\n"


def test_a_secret_never_appears_in_the_result(tmp_path):
    path = tmp_path / "token"
    secret = "K10abcdef::server:0123456789"
    entry = {"path": str(path), "secret_content": secret + "\n", "mode": "0600"}
    for check in (True, False):
        result = run([entry], check=check)
        assert result["changed"] and secret not in json.dumps(result)
    assert path.read_text() == secret + "\n" and mode(path) == "0o600"
    assert run([entry])["changed"] is False
    path.write_text("other\n")
    result = run([entry])
    assert result["changed"] and secret not in json.dumps(result) and "other" not in json.dumps(result)


def test_lines_kept_among_the_lines_of_others(tmp_path):
    path = tmp_path / "pve-blacklist.conf"
    path.write_text(
        "# This file contains a list of modules which are not supported by Proxmox VE\n\n"
        "blacklist nvidiafb\nblacklist nova-core\n"
    )
    blacklist = [
        {"line": f"blacklist {m}", "regexp": rf"^\s*blacklist\s+{m.replace('_', '[-_]')}\s*$"}
        for m in ("nouveau", "nova_core", "nvidiafb")
    ]
    entry = {"path": str(path), "lines": blacklist, "mode": "0644"}
    result = run([entry])
    assert result["changed"]
    # nova-core is rewritten in place, nvidiafb kept, nouveau added at the end; the comment stays.
    assert path.read_text() == (
        "# This file contains a list of modules which are not supported by Proxmox VE\n\n"
        "blacklist nvidiafb\nblacklist nova_core\nblacklist nouveau\n"
    )
    assert run([entry])["changed"] is False

    removal = {
        "path": str(path),
        "absent_lines": [r"^\s*blacklist\s+nouveau\s*$", r"^\s*blacklist\s+nova[-_]core\s*$"],
    }
    assert run([removal])["changed"]
    assert path.read_text().endswith("\nblacklist nvidiafb\n")
    assert run([removal])["changed"] is False


def test_lines_without_regexp_match_exactly_and_create_the_file(tmp_path):
    path = tmp_path / "modules"
    entry = {"path": str(path), "lines": [{"line": "vfio"}, {"line": "vfio_pci"}], "mode": "0644"}
    assert run([entry], check=True)["changed"] and not path.exists()
    assert run([entry])["changed"] and path.read_text() == "vfio\nvfio_pci\n"
    path.write_text("loop\nvfio\nvfio_pci")  # no newline at the end: left as it is while nothing changes
    assert run([entry])["changed"] is False and path.read_text() == "loop\nvfio\nvfio_pci"
    # Removing lines from a file that is not there changes nothing.
    gone = {"path": str(tmp_path / "nothing"), "absent_lines": ["^vfio$"]}
    assert run([gone])["changed"] is False and not (tmp_path / "nothing").exists()


def test_absent_removes_a_file_and_refuses_a_folder(tmp_path):
    path = tmp_path / "vfio.conf"
    path.write_text("options vfio-pci ids=10de:2204\n")
    assert run([{"path": str(path), "state": "absent"}], check=True)["changed"] and path.exists()
    assert run([{"path": str(path), "state": "absent"}])["changed"] and not path.exists()
    assert run([{"path": str(path), "state": "absent"}])["changed"] is False
    result = run([{"path": str(tmp_path), "state": "absent"}])
    assert result.get("failed") and "is a directory" in result["msg"] and tmp_path.exists()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "relative/file", "content": "x"}, "must be absolute"),
        ({"path": "/tmp/x", "content": "x", "lines": [{"line": "y"}]}, "not several"),
        ({"path": "/tmp/x"}, "needs content"),
        ({"path": "/tmp/x", "state": "directory", "content": "x"}, "takes none of content"),
        ({"path": "/tmp/x", "content": "x", "mode": "644x"}, "not an octal string"),
    ],
)
def test_contradictions_are_refused_before_anything_is_written(tmp_path, entry, message):
    first = {"path": str(tmp_path / "first"), "content": "written?\n"}
    result = run([first, entry])
    assert result.get("failed") and message in result["msg"]
    assert not (tmp_path / "first").exists()


def test_a_missing_folder_is_named(tmp_path):
    result = run([{"path": str(tmp_path / "no" / "file"), "content": "x\n"}])
    assert result.get("failed") and f"the folder {tmp_path / 'no'} does not exist" in result["msg"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another user")
def test_a_rewrite_keeps_the_owner_and_a_given_owner_is_set(tmp_path):
    path = tmp_path / "config"
    path.write_text("old\n")
    os.chown(path, 65534, 65534)
    assert run([{"path": str(path), "content": "new\n"}])["changed"]
    assert (os.stat(path).st_uid, os.stat(path).st_gid) == (65534, 65534) and path.read_text() == "new\n"
    result = run([{"path": str(path), "content": "new\n", "owner": "root", "group": "root"}])
    assert result["changed"] and (os.stat(path).st_uid, os.stat(path).st_gid) == (0, 0)
    assert (
        run([{"path": str(path), "content": "new\n", "owner": "root", "group": "root"}])["changed"] is False
    )


def test_present_reports_a_missing_file_and_keeps_the_mode_of_one_that_is_there(tmp_path):
    key = tmp_path / "keyring.asc"
    entry = {"path": str(key), "state": "present", "mode": "0644"}
    result = run([entry])
    assert result["changed"] is False and result["missing_paths"] == [str(key)] and not key.exists()

    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    key.chmod(0o600)
    check = run([entry], check=True)
    assert check["changed"] and check["missing_paths"] == [] and mode(key) == "0o600"
    assert run([entry])["changed"] and mode(key) == "0o644"
    assert run([entry]) == {**run([entry]), "changed": False, "missing_paths": []}
    assert key.read_text() == "-----BEGIN PGP PUBLIC KEY BLOCK-----\n"  # the content is not this module's

    refused = run([{"path": str(key), "state": "present", "content": "x"}])
    assert refused.get("failed") and "takes none of content" in refused["msg"]
