"""A router that rejects the login (the Huawei ONT simulator, wrong password): the run stops with a message
naming the router and the fix, shows no password, writes nothing; with the right password it completes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import REPO, run_local_play

pytestmark = [pytest.mark.slow]

RIGHT = "Right-Pass-7f3a91"
WRONG = "Wrong-Pass-c04e22"


@pytest.fixture(scope="module")
def huawei(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("huawei") / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "labsim.routers", "huawei_ont", "--password", RIGHT, "--log", str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _play(tmp_path: Path, url: str, password: str) -> subprocess.CompletedProcess[str]:
    tasks = [
        {
            "name": "Reservation",
            "gpulab.homelab.dhcp_reservation": {
                "kind": "huawei_ont",
                "address": "192.168.100.1",
                "subnet": "192.168.100.0/24",
                "pool": {"start": "192.168.100.2", "end": "192.168.100.254"},
                "url": url,
                "user": "admin",
                "password": password,
                "reservations": [{"mac": "BC:24:11:00:00:01", "address": "192.168.100.53", "name": "vm-1"}],
            },
            "register": "result",
        },
        {"name": "Result", "ansible.builtin.debug": {"var": "result.reservations"}},
    ]
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "PATH": "/usr/bin:/bin",
    }
    return run_local_play(tmp_path / "play.yml", "Reserve vm-1's address on the ONT", tasks, env)


def _requests(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _writes(log: Path, since: int = 0) -> list[dict]:
    return [r for r in _requests(log)[since:] if r.get("method") != "GET" and r.get("path") != "/login.cgi"]


def _table_writes(log: Path, since: int = 0) -> list[str]:
    """Changes to the static DHCP table (add, set, del) after the first `since` requests."""
    return [r["path"] for r in _writes(log, since) if r["path"].startswith("/html/bbsp/dhcpstatic/")]


def _logins(log: Path, since: int = 0) -> int:
    return sum(1 for r in _requests(log)[since:] if r.get("path") == "/login.cgi")


def test_router_rejecting_login_then_right_password(huawei: tuple[str, Path], tmp_path: Path) -> None:
    url, log = huawei
    proc = _play(tmp_path, url, WRONG)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert WRONG not in output and RIGHT not in output
    fatal = next(line for line in output.splitlines() if line.startswith("fatal:"))
    result = json.loads(fatal.split("=> ", 1)[1])
    assert result["error_code"] == "auth_failed", result
    msg = result["msg"]
    # Names the router (kind and address) and the fix (the inventory variables to correct).
    assert "huawei_ont router at 192.168.100.1" in msg, msg
    assert "router_password" in msg, msg
    writes_after_refusal = _writes(log)
    # The refused login is not hammered: the ONT locks logins out after 3 failures in a row.
    assert 1 <= _logins(log) < 3, _requests(log)

    since = len(_requests(log))
    proc = _play(tmp_path, url, RIGHT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert RIGHT not in output
    assert "changed=1" in output
    # The reservation was written once: one add, nothing set or deleted.
    assert _table_writes(log, since) == ["/html/bbsp/dhcpstatic/add.cgi"]
    since = len(_requests(log))
    again = _play(tmp_path, url, RIGHT)
    assert again.returncode == 0, again.stdout
    assert "changed=0" in again.stdout
    assert '"bc:24:11:00:00:01"' in again.stdout and again.stdout.count('"address": "192.168.100.53"') == 1
    assert _table_writes(log, since) == []
    # Nothing but the login was sent before the refusal.
    assert writes_after_refusal == []
