"""What every part of the k3s stand-in shares: its paths, the release it reports, config.yaml, the node's
address, boot id and cards, and the requests between servers. Standard library only (PyYAML when the host has
it, for config.yaml)."""

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request

VERSION_FILE = "/var/lib/gpulab-sim/k3s-version"
DEFAULT_VERSION = "v1.35.6+k3s1"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
CONFIG = "/etc/rancher/k3s/config.yaml"
PORT = 6443
HEARTBEAT_S = 3
BOOT_ID = "/proc/sys/kernel/random/boot_id"
LOG = "/var/log/gpulab-standins.log"


def log_call(argv, rc):
    with contextlib.suppress(OSError), open(LOG, "a") as f:
        f.write(json.dumps({"time": time.time(), "command": "k3s", "argv": argv, "rc": rc}) + "\n")


def version():
    try:
        with open(VERSION_FILE) as f:
            return f.read().strip() or DEFAULT_VERSION
    except OSError:
        return DEFAULT_VERSION


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_config():
    """config.yaml (PyYAML when present, else the flat `key: value` / `- item` subset k3s configs use)."""
    try:
        with open(CONFIG) as f:
            text = f.read()
    except OSError:
        return {}
    try:
        import yaml

        return yaml.safe_load(text) or {}
    except ImportError:
        pass
    cfg, key = {}, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line.lstrip().startswith("- ") and key:
            cfg.setdefault(key, []).append(line.strip()[2:].strip().strip("'\""))
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip().strip("'\"")
        cfg[key] = value if value else []
    return cfg


def own_address():
    """The node's lab address (its global IPv4 address)."""
    import subprocess

    out = subprocess.run(["ip", "-4", "-j", "addr"], capture_output=True, text=True).stdout
    for link in json.loads(out or "[]"):
        for a in link.get("addr_info", []):
            if a.get("scope") == "global":
                return a["local"]
    return "127.0.0.1"


def gpu_cards():
    """The cards nvidia-smi lists (none without a working driver): UUID, name and total MiB, read once at start
    like HAMi's device plugin reads them through NVML."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    cards = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].startswith("GPU-"):
            mib = int(fields[2]) if fields[2].isdigit() else 0
            cards.append({"uuid": fields[0], "name": fields[1], "memory_mib": mib})
    return cards


def boot_id():
    """This boot of the host (a new one after each reboot)."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def start_id():
    """This start of the k3s process, a new one each time: the node's labels from config.yaml are set once per start."""
    return os.urandom(8).hex()


def labels_from(cfg):
    labels = {}
    items = cfg.get("node-label") or []
    for item in [items] if isinstance(items, str) else items:
        k, _, v = str(item).partition("=")
        labels[k] = v
    return labels


def truthy(value):
    return value is True or str(value).lower() == "true"


# k3s waits this long for a token file that is not there yet, looking every TOKEN_FILE_POLL_S (pkg/util/file.go
# ReadFile @v1.33.5+k3s1)
TOKEN_FILE_WAIT_S = 240
TOKEN_FILE_POLL_S = 2


def config_token(cfg, wait_s=TOKEN_FILE_WAIT_S):
    """The token a k3s server or agent is given: `token-file`'s content when config.yaml (or K3S_TOKEN_FILE)
    names one, whatever `token` says, else `token` (or K3S_TOKEN); '' when neither is set. As k3s' server and
    agent commands read it (pkg/cli/server/server.go, pkg/cli/agent/agent.go @v1.33.5+k3s1): the file's text
    without surrounding whitespace, a file not there yet waited for up to `wait_s` seconds. A file that stays
    missing, or cannot be read, is SystemExit with k3s' message, as k3s exits then."""
    path = str(cfg.get("token-file") or os.environ.get("K3S_TOKEN_FILE") or "")
    if not path:
        return str(cfg.get("token") or os.environ.get("K3S_TOKEN") or "")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path) as f:
                return f.read().strip()
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise SystemExit(
                    f'level=fatal msg="token-file {path}: timeout while trying to read the file"'
                ) from None
            print(f'level=info msg="Waiting for {path} to be available"', file=sys.stderr, flush=True)
            time.sleep(TOKEN_FILE_POLL_S)
        except OSError as exc:
            raise SystemExit(f'level=fatal msg="token-file {path}: {exc.strerror}"') from None


def http_send(peer, path, body=None, timeout=1.0):
    """One request to another server (`http://host:port`): (status, JSON reply); OSError when it does not answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{peer}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


def serve_in_thread(host, port, handler, what):
    """A ThreadingHTTPServer on host:port for `handler`, serving from a daemon thread; None when the port is
    taken (said on stderr, naming `what`). Imports its modules when called: kubectl calls do not need them."""
    import http.server
    import threading

    try:
        server = http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        print(f"gpulab lab k3s stand-in: {what} on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
