"""gpulab lab stand-in for the k3s binary: server, agent, kubectl (a small part), --version.

Served by the lab's file server (``http://ROUTER/k3s/k3s``) and installed by the lab's ``install.sh`` stand-in
the way get.k3s.io installs k3s: binary in ``INSTALL_K3S_BIN_DIR``, a systemd unit ``k3s`` or ``k3s-agent``,
``/etc/rancher/k3s/config.yaml`` read at start. Standard library only (PyYAML when the host has it, for
config.yaml). The binary is this package as one file, a zipapp (:func:`build_zipapp`) that the host's
``/usr/bin/python3`` runs.

By concern: ``server`` (``k3s server``: token, kubeconfig, the server's loop), ``apiserver`` (the API and
its node edits), ``tls`` (k3s' certificates and the TLS listener), ``kubeapi`` (the Kubernetes API a real kubectl
reads), ``cluster`` (the cluster state, the manifests' Deployments and their pods), ``etcd``
(embedded etcd), ``kube_vip`` (kube-vip's control-plane VIP), ``hami`` (HAMi's device plugin, webhook and
scheduler), ``hami_metrics`` (HAMi's scheduler and vGPU monitor metrics), ``monitoring_charts`` (the Prometheus
and Grafana charts of stage monitoring), ``agent`` (``k3s agent``), ``kubectl`` (``k3s kubectl``), ``common`` (what they share) and
``__main__`` (the command line). Each module's docstring says what it stands in for.

The install script stand-in (``K3S_INSTALL`` in ``package_archive.py``, served as ``install.sh``) writes the
unit, env file, ``k3s-killall.sh`` and ``k3s-uninstall.sh``/``k3s-agent-uninstall.sh``, as get.k3s.io.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

INTERPRETER = "/usr/bin/python3"


def build_zipapp(target: Path) -> Path:
    """Write the k3s binary to `target`: this package's modules and its data files (``data/*.json``, HAMi's
    rendered chart) in one executable zipapp (``#!/usr/bin/python3``), run through ``__main__.run``.

    Each module goes in with its byte code, compiled by `INTERPRETER` (unchecked-hash .pyc files beside
    the sources, where zipimport looks): an archive of sources alone is compiled again at every call, which
    made each `k3s kubectl` or `k3s --version` in the lab cost about 0.1 s of compiling."""
    import zipapp

    package = Path(__file__).parent

    def wanted(path: Path) -> bool:
        if path.parts[0] != package.name:
            return False
        if path.parts[1:2] == ("data",):
            return len(path.parts) == 2 or (len(path.parts) == 3 and path.suffix == ".json")
        return len(path.parts) == 1 or (len(path.parts) == 2 and path.suffix in (".py", ".pyc"))

    with tempfile.TemporaryDirectory(prefix="gpulab-k3s-") as tmp:
        source = Path(tmp) / package.name
        shutil.copytree(package, source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        subprocess.run(
            [
                INTERPRETER,
                "-m",
                "compileall",
                "-q",
                "-b",
                "-l",
                "--invalidation-mode",
                "unchecked-hash",
                str(source),
            ],
            check=True,
        )
        zipapp.create_archive(
            Path(tmp), target, interpreter=INTERPRETER, main=f"{package.name}.__main__:run", filter=wanted
        )
    target.chmod(0o755)
    return target
