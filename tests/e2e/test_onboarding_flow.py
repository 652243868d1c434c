"""A new host in three commands, on the lab (issue 18, "Done when"): from a bare node (the user's lab before
gpulab, fixture homelab: three VMs made by hand from the ISO, the router holding their leases, but no gpulab
user or token: `access: bootstrap: false`), `gpulab discover root@NODE DIR`, then `ansible-playbook
playbooks/access.yml`, then `ansible-playbook site.yml`; a second site.yml reports changed=0 on every host.
No PCI, memory, storage or GPU fact is typed and no web UI is used: host_vars/<node>.yml stays as discover
wrote it, and the token and the fingerprint are what access.yml wrote.

The inventory is the discovered folder itself, with no labsim group_vars and nothing read from lab.json. The
test supplies only:

* the placeholders discover leaves to the user (tests/unit/discover/filling.py, as a user edits them): each VM's
  address (the router's lease of it, which the user reads on the router), the router's kind (dnsmasq),
  address, DHCP pool and login user (root), the VMs' login user (ubuntu, the installer's account) and which
  VMs run k3s (vm-1 the server, vm-2 and vm-gpu agents);
* on the command line, as the user passes them: `--vault-password-file` (a file only the user can read,
  whose password access.yml encrypts the vault with), `--become-password-file` (the sudo password the user
  gave the Ubuntu installer; README step 5's -K), `-e pve_host_reboot_allowed=true` (the user lets stage
  host reboot the node for the GPU blacklist);
* in an extra-vars file outside the inventory (`-e @machine.yml`), what the user's own machine has and this
  one cannot: the SSH key that logs in to the lab's hosts and the known_hosts holding their keys (a user has
  both in ~/.ssh, where ssh and the router's SSH backend find them without a setting; here the key is the lab's
  STATE/ssh/id_ed25519, and known_hosts is two files: the node's and the router's keys from ssh-keyscan, as
  README step 4 has the user record them, then the lab's known_hosts, which gets each VM's key when the VM
  host first boots (a user has the keys of the VMs they made already); ~/.ssh of this machine is not the
  lab's), the folder of ssh's
  shared connections (the lab's, closed when the lab goes down), the folder for the lab table, and the
  internet: the lab has none, so NVIDIA's container-toolkit repository and k3s's install script are the lab
  router's copies of them (inventory/homelab-lab sets the same four URLs the same way).

Every API call of gpulab's token goes to the URL discover wrote, https://NODE:8006 (the node's pveproxy), not
to the 127.0.0.1 URL of lab.json. Cost: one lab (homelab, bare: up in about 3 s) and five runs (discover,
access, two site.yml), about 170 s on this machine, most of it the first site.yml.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import ansible_runs
import pytest
import yaml
from unit.discover.filling import fill, placeholders

from .helpers import GPULAB, REPO, VENV_BIN, RunningLab

pytestmark = [pytest.mark.root, pytest.mark.slow]

VAULT_PASS = "a vault password only the user knows"


def playbook(inv: Path, name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return ansible_runs.ansible_playbook(
        "-i",
        inv,
        REPO / name,
        "--vault-password-file",
        str(inv.parent / "vault-pass"),
        "-e",
        f"@{inv.parent / 'machine.yml'}",
        *args,
        env=ansible_runs.playbook_env(),  # no GPULAB_LAB_STATE: nothing tells gpulab where the lab lives
        timeout=timeout,
    )


def test_discover_then_access_then_site_from_a_bare_node_and_a_second_run_changes_nothing(
    bare_homelab: RunningLab, tmp_path: Path
) -> None:
    lab = bare_homelab
    info = lab.info
    assert info["token_secret"] is None, "a bare node: no gpulab token before access.yml"
    node = info["node_host"]["address"]
    inv = tmp_path / "mylab"

    # the user's known_hosts: the node's and the router's keys as `ssh-keyscan` gives them once their
    # fingerprints are checked (README step 4); the VMs' keys are the lab's known_hosts (made at each VM
    # host's first boot, a line for the lab's range), read after it: discover's and the router backend's SSH
    # client (paramiko) read the first file only and match exact host names, not OpenSSH's wildcard lines
    router = info["router"]["address"]
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", node, router], capture_output=True, text=True, timeout=30
    )
    # (OpenSSH 10 prints a "# host:22 SSH-2.0-..." comment line before each key, on stdout)
    keys = [ln for ln in scan.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert scan.returncode == 0 and len(keys) == 2, scan.stdout + scan.stderr
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("\n".join(keys) + "\n")

    # 1. discover, over SSH with host key checking
    found = subprocess.run(
        [GPULAB, "discover", "-i", info["ssh_private_key"], "--known-hosts", str(known_hosts),
         f"root@{node}", str(inv)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stdout + found.stderr
    node_file = inv / "host_vars" / f"{info['node']}.yml"
    discovered_node = node_file.read_bytes()
    main = yaml.safe_load((inv / "group_vars" / "all" / "main.yml").read_text())
    assert main["pve_api_url"] == f"https://{node}:8006"
    assert not (inv / "group_vars" / "all" / "vault.yml").exists()

    # what the user decides, and nothing else
    leases = info["seed_leases"]
    fill(inv, {h: leases[h] for h in ("vm-1", "vm-2", "vm-gpu")},
         {"router_address": router, "router_kind": "dnsmasq", "router_user": "root",
          "start": f"{lab.prefix}.2", "end": f"{lab.prefix}.253"},
         ssh_user="ubuntu", server="vm-1", agents=("vm-2", "vm-gpu"))  # fmt: skip
    assert placeholders(inv) == {}
    vault_pass = tmp_path / "vault-pass"
    vault_pass.write_text(VAULT_PASS + "\n")
    become_pass = tmp_path / "become-pass"
    become_pass.write_text(info["seed"]["guest_password"] + "\n")
    for secret in (vault_pass, become_pass):
        os.chmod(secret, 0o600)
    machine = {
        "ansible_ssh_private_key_file": info["ssh_private_key"],
        "ansible_ssh_common_args": f"-o 'UserKnownHostsFile={known_hosts} {info['ssh_known_hosts']}'",
        "ansible_control_path_dir": info["ssh_control_path_dir"],
        "gpulab_state_dir": str(tmp_path / "gpulab-state"),
        "nvidia_container_toolkit_key_url": info["router"]["nvidia_key_url"],
        "nvidia_container_toolkit_repo_url": info["router"]["nvidia_repo_url"],
        "k3s_server_install_script_url": info["router"]["k3s_install_script_url"],
        "k3s_agent_install_script_url": info["router"]["k3s_install_script_url"],
    }
    (tmp_path / "machine.yml").write_text(yaml.safe_dump(machine))
    text_of = {p: p.read_text() for p in sorted(inv.rglob("*.yml"))}
    assert not any("labsim" in t or "lab.json" in t for t in text_of.values())

    # 2. access: the role, user and token over SSH on the node; the secret into the vault, the fingerprint kept
    made = playbook(inv, "playbooks/access.yml", timeout=300)
    assert made.returncode == 0, made.stdout[-4000:] + made.stderr
    vault = inv / "group_vars" / "all" / "vault.yml"
    assert vault.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    shown = subprocess.run(
        [str(VENV_BIN / "ansible-vault"), "view", "--vault-password-file", str(vault_pass), str(vault)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    secret = yaml.safe_load(shown.stdout)["vault_pve_api_token_secret"]
    assert secret == lab.pve_state()["access"]["users"]["gpulab@pve"]["tokens"]["ansible"]["secret"]
    main = yaml.safe_load((inv / "group_vars" / "all" / "main.yml").read_text())
    assert main["pve_api_fingerprint"] == info["fingerprint"]
    since = len(lab.requests())

    # 3. site.yml on that inventory: converge, then a second run with nothing to change
    args = ("--become-password-file", str(become_pass), "-e", "pve_host_reboot_allowed=true")
    first = playbook(inv, "site.yml", *args, timeout=1500)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    hosts = ansible_runs.recaps(first)
    # the controller's plays (preflight, the API, the router's reservations), the node and the three VMs
    assert set(hosts) == {"localhost", info["node"], "vm-1", "vm-2", "vm-gpu"}, hosts
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in hosts.values()), hosts
    assert hosts["vm-gpu"]["changed"] > 0  # the driver, the toolkit, k3s: the run did the work
    second = playbook(inv, "site.yml", *args, timeout=900)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-2000:]
    again = ansible_runs.recaps(second)
    assert set(again) == set(hosts)
    assert {h: r["changed"] for h, r in again.items()} == dict.fromkeys(again, 0), second.stdout[-6000:]
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in again.values()), again

    # the runs used what discover and access wrote: the token, at the node's own address and port
    calls = [r for r in lab.requests()[since:] if r.get("user") == "gpulab@pve!ansible"]
    assert calls, "site.yml reached the API with gpulab's token"
    assert {r.get("listener") for r in calls} == {"node:8006"}
    vms = lab.pve_state()["vms"]
    assert {vid: vms[vid]["status"] for vid in ("100", "101", "102")} == dict.fromkeys(
        ("100", "101", "102"), "running"
    )
    assert node_file.read_bytes() == discovered_node  # no node fact typed or rewritten
