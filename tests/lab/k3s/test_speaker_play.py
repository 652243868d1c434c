"""playbooks/k3s_speaker.yml run for real by ansible-playbook on this machine: servers whose SSH port does not
answer go to group gpulab_vms_down, the first server that is up and Ready (through a fake `k3s kubectl get
nodes`) to gpulab_k3s_speaker, and a server the run's --limit leaves out is never picked."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml
from unit.k3s.conftest import LOCAL_HOST, tool_folder

# the test runs ansible-playbook once (a few seconds)
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = pathlib.Path(sys.executable).parent / "ansible-playbook"

FAKE_K3S = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import pathlib, sys
    if sys.argv[1:4] != ["kubectl", "get", "nodes"]:
        sys.exit(2)
    print((pathlib.Path(__file__).resolve().parent / "nodes.json").read_text())
    """
)


def node(name, ready):
    conditions = [{"type": "Ready", "status": "True" if ready else "Unknown"}]
    return {"metadata": {"name": name}, "status": {"conditions": conditions}}


@pytest.fixture
def lab(tmp_path, ports):
    """server-1 down (nothing listens on its port), server-2 up and Ready, server-3 up but NotReady."""
    open_port, closed_port = ports
    bin_dir = tool_folder(tmp_path / "bin", k3s=FAKE_K3S)
    nodes = [node("server-1", False), node("server-2", True), node("server-3", False)]
    (bin_dir / "nodes.json").write_text(json.dumps({"items": nodes}))
    port = {
        "server-1": closed_port,
        "server-2": open_port,
        "server-3": open_port,
    }
    common = {**LOCAL_HOST, "k3s_server_bin_dir": str(bin_dir)}
    inventory = {
        "all": {
            "children": {"k3s_server": {"hosts": {h: {**common, "ansible_port": p} for h, p in port.items()}}}
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    out = tmp_path / "picked.json"
    play = [
        {"ansible.builtin.import_playbook": str(ROOT / "playbooks" / "k3s_speaker.yml")},
        {"name": "Write the groups", "hosts": "k3s_server", "gather_facts": False, "tasks": [{
            "ansible.builtin.copy": {"dest": str(out), "mode": "0644", "content": (
                "{{ {'speaker': groups['gpulab_k3s_speaker'] | default([]),"
                " 'down': groups['gpulab_vms_down'] | default([])} | to_json }}")},
            "delegate_to": "localhost", "run_once": True}]},
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))

    def run(*args):
        env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1"}
        done = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", tmp_path / "hosts.yml", tmp_path / "play.yml", *args],
            capture_output=True, text=True, env=env, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        return json.loads(out.read_text()), " ".join(done.stdout.split())  # the callback wraps long lines

    return run


def test_a_down_server_is_skipped_and_the_limit_is_kept(lab):
    # server-2 is the only Ready server, but --limit leaves it out: server-3 (up, NotReady) speaks, never
    # server-1, whose port does not answer (the Ready-first choice itself: tests/unit/k3s/test_speaker.py)
    picked, stdout = lab("--limit", "!server-2")
    assert picked == {"speaker": ["server-3"], "down": ["server-1"]}
    assert (
        "k3s server server-3 speaks for the cluster: no k3s server is Ready: the first that is up (server-1 down)"
        in stdout
    )
