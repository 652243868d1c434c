"""gpulab.downloads, preflight's online check of what the nodes will download, against the lab's internet
(labsim.internet: its proxy, its SHA256SUMS, a folder rebuilt under its URL) and against answers the lab does
not give (a redirect to a web page, a controller without internet); and gpulab.reach's reading of a node's
storages (which storage a run needs, and the message for each refusal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulab import downloads, reach
from gpulab.downloads import Answer, Unreachable
from labsim.internet import Internet, InternetProxy, publish

ROOT = Path(__file__).resolve().parents[2]
FOLDER = "https://cloud-images.ubuntu.com/releases/noble/release-20260926/"
DATED = FOLDER + "ubuntu-24.04-server-cloudimg-amd64.img"
DATED_SHA = "6a81c37564db9b1ee84e141922625e1d7c5b389b99bb3c572e0243607d5bb4d2"
CURRENT = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
OLD = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"
NEW = "0" * 63 + "1"
TABLE = [
    {"url": DATED, "size": 625612288, "format": "qcow2", "sha256": DATED_SHA},
    {
        "url": FOLDER + "ubuntu-24.04-server-cloudimg-arm64.img",
        "size": 1,
        "format": "qcow2",
        "sha256": "a" * 64,
    },
    {"url": CURRENT, "size": 614203392, "format": "qcow2", "sha256": OLD},
]


def image(url: str, checksum: str) -> dict:
    return {"url": url, "checksum": checksum, "checksum_algorithm": "sha256", "filename": "x.qcow2"}


@pytest.fixture
def internet(tmp_path):
    proxy = InternetProxy(Internet(tmp_path, TABLE)).start()
    yield tmp_path, downloads.http_fetch(proxy.url)
    proxy.stop()


def test_the_lab_publishes_each_folders_sha256sums(internet):
    _, fetch = internet
    sums = fetch("GET", FOLDER + "SHA256SUMS")
    assert sums.status == 200
    assert downloads.parse_sums(sums.body) == {
        "ubuntu-24.04-server-cloudimg-amd64.img": DATED_SHA,
        "ubuntu-24.04-server-cloudimg-arm64.img": "a" * 64,
    }
    head = fetch("HEAD", DATED)
    assert (head.status, head.content_type) == (200, "application/octet-stream")
    assert fetch("HEAD", FOLDER + "nothing.img").status == 404
    with pytest.raises(Unreachable, match="Name or service not known"):
        fetch("HEAD", "https://nowhere.example/x.img")


def test_a_pin_that_matches_passes(internet):
    _, fetch = internet
    assert downloads.check_images([("gpulab_os_image", image(DATED, DATED_SHA))], fetch) == []


def test_a_rebuilt_folder_names_the_new_checksum(internet):
    state, fetch = internet
    assert downloads.check_image("gpulab_os_image", image(CURRENT, OLD), fetch) is None
    publish(state, CURRENT, {"size": 614465536, "format": "qcow2", "sha256": NEW})
    problem = downloads.check_image("gpulab_os_image", image(CURRENT, OLD), fetch)
    assert (problem.field, problem.value) == ("gpulab_os_image.checksum", OLD)
    assert "https://cloud-images.ubuntu.com/noble/current/SHA256SUMS lists " + NEW in problem.why
    assert problem.fix.startswith(f"set gpulab_os_image.checksum: {NEW} ")


def test_a_file_taken_away_answers_404_with_the_fix(internet):
    state, fetch = internet
    publish(state, CURRENT, None)
    problem = downloads.check_image("gpulab_os_image", image(CURRENT, OLD), fetch)
    assert (problem.field, problem.value) == ("gpulab_os_image.url", CURRENT)
    assert problem.why.startswith("the URL answers HTTP 404")
    assert "pin a dated folder instead of current/" in problem.fix


def test_an_old_point_release_points_at_old_releases():
    gone = "https://releases.ubuntu.com/24.04.3/ubuntu-24.04.3-live-server-amd64.iso"

    def fetch(method, url):
        return Answer(404, url, "text/html")

    problem = downloads.check_image("gpulab_os_iso", image(gone, OLD), fetch)
    assert problem.fix.startswith(
        "releases.ubuntu.com keeps only the newest point release of a series: set gpulab_os_iso.url: "
        "https://old-releases.ubuntu.com/releases/24.04.3/ubuntu-24.04.3-live-server-amd64.iso "
    )


def test_a_redirect_to_a_web_page_is_not_the_file():
    def fetch(method, url):
        return Answer(200, "https://example.org/error.html", "text/html; charset=utf-8")

    problem = downloads.check_image("gpulab_os_image", image(DATED, DATED_SHA), fetch)
    assert problem.why == (
        "the URL answers with a web page (text/html; charset=utf-8) after redirects to "
        "https://example.org/error.html, not the file"
    )


def test_a_controller_without_internet_is_told_how_to_skip():
    def fetch(method, url):
        raise Unreachable("[Errno -3] Temporary failure in name resolution")

    problem = downloads.check_image("gpulab_os_image", image(DATED, DATED_SHA), fetch)
    assert (problem.field, problem.value) == ("gpulab_download_check", True)
    assert "could not reach cloud-images.ubuntu.com" in problem.why
    assert "set gpulab_download_check: false to skip this check" in problem.fix
    # the switch skips it: no request at all
    assert (
        reach.download_problems({"gpulab_download_check": False}, [("gpulab_os_image", image(DATED, ""))])
        == []
    )


def test_a_folder_without_checksums_leaves_the_pin_to_pve():
    def fetch(method, url):
        return (
            Answer(404, url) if url.endswith("SHA256SUMS") else Answer(200, url, "application/octet-stream")
        )

    assert downloads.check_image("gpulab_os_image", image("https://mirror.example/x.img", OLD), fetch) is None


def test_storage_needs_name_the_variable_of_each_storage():
    plans = {
        "vm-1": {
            "host": "vm-1",
            "node": "pve",
            "spec": {"disks": [{"storage": "local-zfs"}]},
            "image": {"storage": "local", "content": "import"},
            "snippet": {"storage": "local", "name": "gpulab-vendor.yaml"},
        },
        "vm-2": {"host": "vm-2", "node": "pve", "spec": {"disks": [{"storage": "local-zfs"}]}, "image": None},
    }
    assert reach.storage_needs(plans) == {
        "pve": {
            ("local-zfs", "images"): ("vm-1", "vm_storage"),
            ("local", "import"): ("all", "gpulab_os_image.storage"),
            ("local", "snippets"): ("all", "gpulab_snippet_storage"),
        }
    }


def test_a_storage_with_what_is_needed_passes():
    storages = {"local": {"storage": "local", "content": "iso,import", "enabled": 1}}
    assert (
        reach.storage_problem("pve", "local", "import", ("all", "gpulab_os_image.storage"), storages) is None
    )
    problem = reach.storage_problem("pve", "local", "snippets", ("all", "gpulab_snippet_storage"), storages)
    assert problem.fix == (
        "run on the node `pvesm set local --content iso,import,snippets`, or set gpulab_snippet_storage to a "
        "storage of node pve that holds content snippets"
    )


def test_plan_online_runs_the_same_check(internet, tmp_path):
    """`gpulab plan --online`: the inventory's images against the folders as they are now (here, a rebuilt one)."""
    state, _ = internet
    publish(state, DATED, {"size": 1, "format": "qcow2", "sha256": NEW})
    proxy = InternetProxy(Internet(state, TABLE)).start()
    try:
        inv = tmp_path / "inv"
        subprocess.run(["cp", "-r", str(ROOT / "inventory/homelab"), str(inv)], check=True)
        main = inv / "group_vars/all/main.yml"
        data = yaml.safe_load(main.read_text())
        data["gpulab_download_check_proxy"] = proxy.url
        main.write_text(yaml.safe_dump(data))
        vms = inv / "group_vars/vms.yml"
        text = vms.read_text().replace("vm_os_install: iso", "vm_os_install: cloud_image")
        vms.write_text(text + "vm_ssh_public_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly test\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
        env.update(GPULAB_PVE_API_TOKEN_SECRET="0b1f8a3e-5a43", GPULAB_ROUTER_PASSWORD="pw")
        gpulab = [str(Path(sys.executable).parent / "gpulab"), "plan"]
        plain = subprocess.run([*gpulab, str(inv)], capture_output=True, text=True, env=env, timeout=120)
        assert plain.returncode == 0, plain.stdout + plain.stderr
        online = subprocess.run(
            [*gpulab, "--online", str(inv)], capture_output=True, text=True, env=env, timeout=120
        )
    finally:
        proxy.stop()
    assert online.returncode == 1, online.stdout + online.stderr
    assert f"  - all: gpulab_os_image.checksum='{DATED_SHA}': {FOLDER}SHA256SUMS lists {NEW}" in online.stdout


def test_the_direct_fetch_reports_a_host_it_cannot_reach():
    """Without a proxy, urllib: a name that does not resolve (.invalid never does) is Unreachable, with why."""
    with pytest.raises(Unreachable):
        downloads.http_fetch(timeout=5)("HEAD", "https://gpulab-test.invalid/x.img")
