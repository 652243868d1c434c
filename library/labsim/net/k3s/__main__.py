"""The k3s stand-in's command line: ``k3s server``, ``k3s agent``, ``k3s kubectl`` (also run as ``kubectl``),
``k3s --version``. Every call but ``server`` and ``agent`` is logged (JSON lines) to
``/var/log/gpulab-standins.log``."""

import os
import sys

from .common import log_call, version

# Each command imports only its own part (server, agent, kubectl) when it runs: a `k3s kubectl` or
# `k3s --version` call then loads what it uses, not the server's HTTP and the agent's client as well.


def main(argv):
    if not argv or argv[0] in ("--version", "-v", "version"):
        print(f"k3s version {version()} (0000000a)\ngo version go1.24.6")
        return 0
    cmd, args = argv[0], argv[1:]
    if cmd == "server":
        try:
            import yaml  # noqa: F401 - the HelmChart controller reads the manifests with it
        except ImportError:
            # the real k3s parses YAML itself; this stand-in borrows the guest's PyYAML (python3-yaml,
            # in every Ubuntu cloud image as cloud-init's dependency) and says so instead of hanging
            print("gpulab lab k3s stand-in: `k3s server` needs python3-yaml in this host", file=sys.stderr)
            return 1
        from .server import run_server

        return run_server()
    if cmd == "agent":
        from .agent import run_agent

        return run_agent()
    if cmd == "kubectl":
        from .kubectl import kubectl

        return kubectl(args)
    print(f"gpulab lab k3s stand-in: `k3s {cmd}` is not stood in", file=sys.stderr)
    return 1


def run():
    """The binary's entry point (the zipapp's ``__main__``): argv from the command line, `kubectl` by name."""
    name = os.path.basename(sys.argv[0])
    argv = ["kubectl", *sys.argv[1:]] if name == "kubectl" else sys.argv[1:]
    rc = main(argv)
    if argv[:1] not in (["server"], ["agent"]):
        log_call(argv, rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
