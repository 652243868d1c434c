"""The k3s roles' own input rules, applied to the lab definition before any change (gpulab.k8s.install_inputs).

Stage k3s hands roles k3s_server and k3s_agent inputs it derives from the lab definition (playbooks/vars/k3s.yml:
three or more servers run embedded etcd, the first with cluster-init, the others joining it; every agent and
joining server registers through https://<k3s_registration_address, else the first server's vm_address>:6443),
and role k3s_install copies an air-gapped install's files from a controller folder (k3s_server_airgap_dir,
k3s_agent_airgap_dir). The roles check those inputs just before they act; this module checks the same inputs,
through the same functions, from the inventory and the run's extra vars (which win over the playbook's), so
preflight and `gpulab plan` refuse them first. The cluster's token is read from the first server at run time
unless k3s_token (or -e) gives it, so only a token given empty with -e is a problem here.
"""

from __future__ import annotations

from typing import Any

from gpulab.k8s import install_inputs
from gpulab.labdef.definition import LabDefinition
from gpulab.labdef.problems import Problem, Problems

#: The role inputs a run may give with -e (they win over playbooks/vars/k3s.yml), per role.
SERVER_INPUTS = ("k3s_server_cluster_init", "k3s_server_join_url", "k3s_server_token")
AGENT_INPUTS = ("k3s_agent_server_url", "k3s_agent_token")
AIRGAP_INPUTS = ("k3s_server_airgap", "k3s_server_airgap_dir", "k3s_agent_airgap", "k3s_agent_airgap_dir")
EXTRA_INPUTS = SERVER_INPUTS + AGENT_INPUTS + AIRGAP_INPUTS
_FROM_THE_RUN = object()  # the token the first server holds, read at run time


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def _registration_url(d: LabDefinition) -> str:
    """playbooks/vars/k3s.yml's gpulab_k3s_registration_url."""
    first = d.k3s_servers[0] if d.k3s_servers else None
    address = d.globals.get("k3s_registration_address") or (d.vms.get(first) or {}).get("vm_address") or ""
    return f"https://{address}:6443"


def _token(d: LabDefinition, extra: dict[str, Any], name: str) -> Any:
    if name in extra:
        return extra[name]
    return d.globals.get("k3s_token") or _FROM_THE_RUN


def check_k3s_inputs(d: LabDefinition, extra: dict[str, Any], out: Problems) -> None:
    """Each k3s server's and agent's join inputs and air-gap folder, as the roles will see them."""
    servers = d.k3s_servers
    etcd = len(servers) >= 3
    url = _registration_url(d)
    for host in servers:
        joins = etcd and host != servers[0]
        init = extra.get("k3s_server_cluster_init", etcd and host == servers[0])
        join_url = extra.get("k3s_server_join_url", url if joins else "")
        token = _token(d, extra, "k3s_server_token")
        dry = token is _FROM_THE_RUN
        problem = install_inputs.server_join_problem(_true(init), join_url, "" if dry else token, dry)
        if problem:
            field = next((n for n in SERVER_INPUTS if n in extra), "k3s_registration_address")
            out.add(host, field, extra.get(field, join_url), *problem)
    for host in d.k3s_agents:
        server_url = extra.get("k3s_agent_server_url", url)
        token = _token(d, extra, "k3s_agent_token")
        dry = token is _FROM_THE_RUN
        problem = install_inputs.agent_join_problem(server_url, "" if dry else token, dry)
        if problem:
            field = next((n for n in AGENT_INPUTS if n in extra), "k3s_registration_address")
            out.add(host, field, extra.get(field, server_url), *problem)
    seen: set[tuple[str, str]] = set()
    for role, hosts in (("server", servers), ("agent", d.k3s_agents)):
        for host in hosts:
            own = {**d.other_vars.get(host, {}), **extra}
            folder = str(own.get(f"k3s_{role}_airgap_dir") or "")
            if not _true(own.get(f"k3s_{role}_airgap", False)) or not folder or (role, folder) in seen:
                continue
            seen.add((role, folder))  # one folder, reported once (on its first host)
            problem = install_inputs.airgap_folder_problem(folder)
            if problem:
                out.add(host, f"k3s_{role}_airgap_dir", folder, *problem)


def extra_problems(d: LabDefinition, extra: dict[str, Any]) -> list[Problem]:
    """What the role inputs given with -e break, beyond what the inventory alone does."""
    given = {k: v for k, v in extra.items() if k in EXTRA_INPUTS}
    if not given:
        return []
    before, after = Problems(), Problems()
    check_k3s_inputs(d, {}, before)
    check_k3s_inputs(d, given, after)
    known = {(p.host, p.why) for p in before}
    return [p for p in after if (p.host, p.why) not in known]
