"""Stage host's wait for etcd (role pve_host's entry point etcd_wait, as playbooks/host.yml imports it) run for
real by ansible-playbook on this machine, against a fake `k3s kubectl get nodes` whose answers change from
look to look: after the reboot of pve2 the run asks a server on the other node (pve) until the API answers and every
server is Ready and a voting etcd member; it stops with what is missing when that does not come in time; and
it does not wait (nor ask anything) when the node did not reboot or no server has k3s yet."""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml
from unit.k3s.conftest import LOCAL_HOST, tool_folder

# each test runs ansible-playbook once (a few seconds)
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = pathlib.Path(sys.executable).parent / "ansible-playbook"
SERVERS = ["server-1", "server-2", "server-3"]

# answers.json: one [rc, stdout, stderr] per look, the last one repeated; looks counts the calls
FAKE_K3S = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import json, pathlib, sys
    here = pathlib.Path(__file__).resolve().parent
    if sys.argv[1:5] != ["kubectl", "get", "nodes", "-o"]:
        sys.exit(2)
    looks = here / "looks"
    n = int(looks.read_text()) if looks.exists() else 0
    looks.write_text(str(n + 1))
    answers = json.loads((here / "answers.json").read_text())
    rc, out, err = answers[min(n, len(answers) - 1)]
    print(out)
    print(err, file=sys.stderr)
    sys.exit(rc)
    """
)
# qm list on pve2 after its reboot: qm.txt when the test writes one, else server-3 running
FAKE_QM = textwrap.dedent(
    """\
    #!/bin/sh
    here=$(dirname "$0")
    [ "$1" = list ] || exit 2
    if [ -f "$here/qm.txt" ]; then cat "$here/qm.txt"; else
    echo "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID"
    echo "       103 server-3             running    4096              32.00 4242"; fi
    """
)
NO_LEADER = [1, "", "Error from server: etcdserver: request timed out"]


def nodes(**state):
    """A node list: each server Ready and a voter unless `state` says otherwise (name=(ready, voter))."""

    def item(name):
        ready, voter = state.get(name.replace("-", "_"), ("True", "True"))
        return {"metadata": {"name": name}, "status": {"conditions": [
            {"type": "Ready", "status": ready}, {"type": "EtcdIsVoter", "status": voter}]}}  # fmt: skip

    return [0, json.dumps({"items": [item(s) for s in SERVERS]}), ""]


@pytest.fixture
def lab(tmp_path, ports):
    """pve2 just rebooted; server-1 and server-2 run on pve (server-1's SSH port does not answer), server-3 on
    pve2. Returns run(answers, **host_vars of pve2) -> (rc, stdout, looks)."""
    open_port, closed_port = ports
    bin_dir = tool_folder(tmp_path / "bin", k3s=FAKE_K3S, qm=FAKE_QM)
    local = LOCAL_HOST
    server = {**local, "k3s_server_bin_dir": str(bin_dir)}
    servers = {
        "server-1": {**server, "vm_node": "pve", "ansible_port": closed_port},
        "server-2": {**server, "vm_node": "pve", "ansible_port": open_port},
        "server-3": {**server, "vm_node": "pve2", "ansible_port": open_port},
    }
    play = [{"name": "Stage host's wait", "hosts": "proxmox", "gather_facts": False,
             "tasks": [{"ansible.builtin.import_role": {"name": "gpulab.homelab.pve_host", "tasks_from": "etcd_wait"}}]}]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))

    def run(answers, pve_down=False, **pve2):
        (bin_dir / "answers.json").write_text(json.dumps(answers))
        (bin_dir / "looks").unlink(missing_ok=True)
        pve2 = {**local, "pve_node": "pve2", "pve_host_reboot": {"rebooted": True}, "pve_host_etcd_interval": 1,
                **pve2}  # fmt: skip
        hosts = (
            {**servers, "server-2": {**servers["server-2"], "ansible_port": closed_port}}
            if pve_down
            else servers
        )
        inventory = {"all": {"children": {
            "proxmox": {"hosts": {"pve2": pve2}},
            "k3s_cluster": {"children": {"k3s_server": {"hosts": hosts}}}}}}  # fmt: skip
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
        env = {
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "ANSIBLE_NOCOLOR": "1",
        }
        done = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", tmp_path / "hosts.yml", tmp_path / "play.yml"],
            capture_output=True, text=True, env=env, timeout=180, check=False,
        )  # fmt: skip
        looks = int((bin_dir / "looks").read_text()) if (bin_dir / "looks").exists() else 0
        return done.returncode, " ".join((done.stdout + done.stderr).split()), looks

    return run


def test_waits_until_etcd_has_a_leader_and_every_server_back(lab):
    # the API times out (no leader), then server-3 (on pve2) is back but not yet a voter, then all is well
    rc, out, looks = lab([NO_LEADER, nodes(server_3=("True", "False")), nodes()])
    assert rc == 0, out[-3000:]
    assert looks == 3
    # server-1's SSH port does not answer: the run asks server-2, the other server on pve
    assert (
        "etcd after the reboot of pve2: etcd has a leader and all 3 servers as voting members (read through server-2"
        in out
    )


def test_stops_with_what_is_missing_after_the_timeout(lab):
    rc, out, looks = lab([nodes(server_3=("Unknown", "False"))], pve_host_etcd_timeout=3)
    assert rc != 0
    assert looks >= 2
    assert (
        "etcd did not come back within 3 s of the reboot of pve2: server-3 not Ready and not a voting etcd member"
        in out
    )


def test_the_api_not_answering_is_named_as_no_leader(lab):
    rc, out, _ = lab([NO_LEADER], pve_host_etcd_timeout=2)
    assert rc != 0 and "the API does not answer: etcd has no leader yet" in out


def test_no_wait_when_the_node_did_not_reboot(lab):
    rc, out, looks = lab([NO_LEADER], pve_host_reboot={"skipped": True})
    assert rc == 0, out[-3000:]
    assert looks == 0
    assert "Not waiting for etcd after stage host on pve2: pve2 did not reboot in this run." in out


def test_no_wait_before_the_cluster_exists(lab, tmp_path):
    (tmp_path / "bin" / "k3s").unlink()
    rc, out, _ = lab([NO_LEADER])
    assert rc == 0, out[-3000:]
    assert "Not waiting for etcd after the reboot of pve2: k3s is not installed on server-2 yet." in out


def test_stops_at_once_when_a_server_of_the_node_did_not_start_with_it(lab, tmp_path):
    (tmp_path / "bin" / "qm.txt").write_text(
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID\n"
        "       103 server-3             stopped    4096              32.00 0\n"
    )
    rc, out, looks = lab([nodes()])
    assert rc != 0
    assert looks == 0  # not waited for: it cannot come back by itself
    assert (
        "k3s server(s) server-3 on pve2 did not start with the node (qm list shows the VM not running)" in out
    )


def test_no_wait_when_no_server_on_another_node_answers(lab):
    # server-1 and server-2 (both on pve) do not answer: nothing to ask through, and nothing is delegated
    rc, out, looks = lab([NO_LEADER], pve_down=True)
    assert rc == 0, out[-3000:]
    assert looks == 0
    assert (
        "Not waiting for etcd after the reboot of pve2: no k3s server on another node answers the controller"
        " (server-1, server-2)." in out
    )
