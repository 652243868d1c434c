"""`make deps` (scripts/system-deps.sh): what it does without root, with everything present, and when apt fails."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts/system-deps.sh"


def deps(tmp_path, packages, *prefix, env=None, script=SCRIPT):
    listing = tmp_path / "packages.txt"
    listing.write_text("# a list like system-packages.txt\n" + "".join(f"{p}   # why\n" for p in packages))
    listing.chmod(0o644)
    tmp_path.chmod(0o755)
    return subprocess.run(
        [*prefix, "bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "GPULAB_SYSTEM_PACKAGES": str(listing), **(env or {})},
    )


def test_the_project_list_names_each_package_once():
    names = [
        line.split("#")[0].strip()
        for line in (ROOT / "system-packages.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert len(names) == len(set(names)) and all(" " not in n for n in names)
    # what the lab and the Makefile run on the machine is on it
    assert {
        "make",
        "python3",
        "python3-venv",
        "debootstrap",
        "openssh-server",
        "dnsmasq-base",
        "gnupg",
    } <= set(names)


def test_an_unreadable_list_is_an_error(tmp_path):
    res = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "GPULAB_SYSTEM_PACKAGES": str(tmp_path / "absent.txt")},
    )  # fmt: skip
    assert res.returncode == 1 and "cannot read the package list" in res.stderr


def test_nothing_missing_is_silent_and_changes_nothing(tmp_path):
    res = deps(tmp_path, ["dpkg", "bash"])
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_without_root_it_prints_the_one_apt_line_and_what_it_skips(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs the script as another user (needs root and setpriv)")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    tmp_path = Path(tempfile.mkdtemp(prefix="gpulab-deps-"))  # a folder the other user can read
    try:
        # (a copy of the script: the project may sit in /root, which the other user cannot read)
        script = tmp_path / "system-deps.sh"
        shutil.copyfile(SCRIPT, script)
        script.chmod(0o755)
        packages = ["bash", "gpulab-no-such-package-a", "gpulab-no-such-package-b"]
        res = deps(tmp_path, packages, *nobody, script=script)
    finally:
        shutil.rmtree(tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert (
        "apt-get install -y --no-install-recommends gpulab-no-such-package-a gpulab-no-such-package-b"
        in lines[1]
    )
    assert "skipped" in lines[0] and "root" in lines[0] and "skipped" in lines[2]


def test_as_root_a_failing_apt_names_the_packages_and_stops(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the install path needs root")
    # apt pointed at a registry that refuses every connection, with lists of its own (the machine's stay)
    state = tmp_path / "apt"
    (state / "lists" / "partial").mkdir(parents=True)
    (tmp_path / "sources.list").write_text("deb [trusted=yes] http://127.0.0.1:9/debian trixie main\n")
    (tmp_path / "apt.conf").write_text(
        f'Dir::Etc::sourcelist "{tmp_path}/sources.list";\nDir::Etc::sourceparts "{tmp_path}/none";\n'
        f'Dir::State::Lists "{state}/lists";\nDir::Cache "{tmp_path}/cache";\nAcquire::Retries "0";\n'
    )
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    res = deps(tmp_path, ["gpulab-no-such-package"], env={"APT_CONFIG": str(tmp_path / "apt.conf")})
    assert res.returncode == 1
    assert "apt could not install gpulab-no-such-package" in res.stderr
    assert "apt-get install -y --no-install-recommends gpulab-no-such-package" in res.stderr
    assert policy.exists() == had_policy  # its start policy lasted only while it installed
