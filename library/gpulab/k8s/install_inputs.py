"""The inputs of a k3s install that a run can check before it changes anything: one rule each, one function.

Roles k3s_server, k3s_agent and k3s_install call these through filters (plugins/filter/k3s.py) just before
they act; preflight and `gpulab plan` (gpulab.labdef) call the same functions on the lab definition first, so a
run stops before the VMs, the router or the guests are touched.

* :func:`airgap_folder_problem`: the controller folder of an air-gapped install (k3s_server_airgap_dir,
  k3s_agent_airgap_dir) holds the release's ``k3s`` binary and its ``install.sh``; the images tarball
  (``k3s-airgap-images-*``) is optional, as for k3s (a node may pull its images from a mirror).
* :func:`server_join_problem` and :func:`agent_join_problem`: how a server starts or joins the cluster and how
  an agent registers (an https:// URL, the cluster's token).

Each returns None, or (why, fix).
"""

from __future__ import annotations

import os

#: What an air-gap folder must hold: the release's binary and the install script, as the role copies them.
AIRGAP_FILES = ("k3s", "install.sh")


def airgap_folder_problem(folder: str) -> tuple[str, str] | None:
    """Why the controller folder `folder` cannot serve an air-gapped install; None when it can ("" is no folder:
    the files are pre-placed on the host, which only the host can tell)."""
    folder = str(folder or "")
    if not folder:
        return None
    if not os.path.isabs(folder):
        why = "a relative path: the controller reads the air-gap files from an absolute folder"
        return why, "give the folder's absolute path, e.g. /srv/k3s-airgap"
    if not os.path.isdir(folder):
        why = "no such folder on the controller"
        return (
            why,
            f"create it with {' and '.join(AIRGAP_FILES)} of the k3s release (k3s-io/k3s releases page)",
        )
    missing = [name for name in AIRGAP_FILES if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        why = f"the folder lacks {', '.join(missing)}"
        fix = (
            f"put the release's k3s binary as {folder}/k3s and get.k3s.io's script as {folder}/install.sh "
            "(and k3s-airgap-images-amd64.tar.zst for a node without a registry)"
        )
        return why, fix
    return None


def server_join_problem(
    cluster_init: bool, join_url: str, token: str, dry_run: bool
) -> tuple[str, str] | None:
    """A k3s server either starts the cluster (cluster-init) or joins one through an https:// URL with the
    cluster's token; None when its inputs say one of them."""
    join_url, token = str(join_url or ""), str(token or "")
    if cluster_init and join_url:
        why = f"the server both starts the cluster (k3s_server_cluster_init) and joins {join_url}"
        return why, "leave k3s_server_cluster_init and k3s_server_join_url to the playbook (vars/k3s.yml)"
    if join_url and not join_url.startswith("https://"):
        why = f"the server joins through {join_url!r}, not an https:// URL"
        return (
            why,
            "give the URL as https://ADDRESS:6443, or leave it to the playbook (k3s_registration_address)",
        )
    if join_url and not token and not dry_run:
        why = "a joining server needs the cluster's token, and none is known"
        return why, "run the k3s stage on the first server first, or set k3s_token"
    return None


def agent_join_problem(server_url: str, token: str, dry_run: bool) -> tuple[str, str] | None:
    """A k3s agent registers through an https:// URL with the cluster's token; None when its inputs do."""
    server_url, token = str(server_url or ""), str(token or "")
    if not server_url.startswith("https://"):
        why = f"the agent registers through {server_url!r}, not an https:// URL"
        return (
            why,
            "give the URL as https://ADDRESS:6443, or leave it to the playbook (k3s_registration_address)",
        )
    if not token and not dry_run:
        why = "the agent needs the cluster's token, and none is known"
        return why, "run the k3s stage on the server first, or set k3s_token"
    return None


def message(problem: tuple[str, str] | None) -> str:
    """`why. Fix: fix`, or "" for none (what the roles' assertions print)."""
    return "" if problem is None else f"{problem[0]}. Fix: {problem[1]}."
