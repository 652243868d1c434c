#!/usr/bin/python3
"""A k3s stand-in for the simulated lab: k3s's install script and the `k3s` binary at the interfaces the roles use.

Nothing of Kubernetes runs here. What behaves like k3s (shared/reference/guest-stack.md section 4):

* `install` (the install script, get.k3s.io): the `INSTALL_K3S_*` and `K3S_*` environment variables, the
  command (`server`/`agent`, `agent` by default when `K3S_URL` is set, which then needs `K3S_TOKEN` or
  `K3S_TOKEN_FILE`), `INSTALL_K3S_SKIP_DOWNLOAD=true` with a pre-placed executable `<bin dir>/k3s`, the files it
  writes (binary, kubectl/crictl/ctr links, killall and uninstall scripts, unit and 0600 env file), the same
  `[INFO]` lines, and its idempotence: the service is restarted only when the binary, unit or env file changed
  ("No change detected so skipping service start"); start and enable go through `systemctl`.
* `k3s server` / `k3s agent` (what the unit runs): they read `/etc/rancher/k3s/config.yaml` (`token`,
  `token-file`, `server`, `node-name`, `node-label`, `bind-address`, `https-listen-port`). The server writes the
  token file (`K10<64 hex>::server:<password>`, `node-token` linked to it) and the kubeconfig, registers
  itself, and answers agents on its port (plain HTTP JSON instead of TLS). An agent joins with its token,
  node name, labels, whether `nvidia-container-runtime` is where k3s looks for it, and its GPUs (from
  `nvidia-smi`); a wrong token is refused and the agent exits, as a real one keeps failing.
* `k3s kubectl` on the server: `get nodes [-o json]` with the joined nodes, their labels and allocatable
  (HAMi's `nvidia.com/gpu` = cards x deviceSplitCount once a HelmChart `hami` is in the manifests folder and
  the node matches its nvidiaNodeSelector and has the nvidia runtime), `label node`, `get runtimeclass`
  (k3s's packaged RuntimeClasses), `get daemonsets -A -o json`, `wait` (job/helm-install-<name>, node Ready),
  `rollout status`, `drain`/`cordon`/`uncordon`, from the objects in `/var/lib/rancher/k3s/server/manifests`.
* `k3s --version`: `k3s version <tag> (<commit>)` then `go version ...`.

Standard library plus PyYAML (python3-yaml, present on Ubuntu and Debian hosts). Every call is appended to
`/var/log/gpulab-standins.log` as a JSON line. `GPULAB_K3S_ROOT` moves every path under another root (the
stand-in's own tests use it); `files()` gives the files to install on a lab host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.environ.get("GPULAB_K3S_ROOT", "/")
SCRIPT = os.environ.get("GPULAB_K3S_SCRIPT", "/usr/local/lib/gpulab/k3s_standin.py")
DEFAULT_VERSION = "v1.33.5+k3s1"
COMMIT = "9a8b7c6d"
NVIDIA_RUNTIME_DIRS = ("/usr/local/nvidia/toolkit", "/usr/bin")
RUNTIME_CLASSES = (
    "crun",
    "lunatic",
    "nvidia",
    "nvidia-experimental",
    "slight",
    "spin",
    "wasmedge",
    "wasmer",
    "wasmtime",
    "wws",
)


def path(p):
    return os.path.join(ROOT, p.lstrip("/")) if ROOT != "/" else p


CONFIG = "/etc/rancher/k3s/config.yaml"
SERVER_DIR = "/var/lib/rancher/k3s/server"
TOKEN = f"{SERVER_DIR}/token"
STATE = f"{SERVER_DIR}/gpulab-standin.json"
MANIFESTS = f"{SERVER_DIR}/manifests"
KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
LOG = "/var/log/gpulab-standins.log"


def log(argv, rc):
    try:
        os.makedirs(os.path.dirname(path(LOG)), exist_ok=True)
        with open(path(LOG), "a") as f:
            f.write(json.dumps({"time": time.time(), "command": "k3s", "argv": argv, "rc": rc}) + "\n")
    except OSError:
        pass


def info(msg):
    print(f"[INFO]  {msg}", flush=True)


def fatal(msg):
    print(f"[ERROR]  {msg}", file=sys.stderr, flush=True)
    return 1


def read(p, default=None):
    try:
        with open(path(p)) as f:
            return f.read()
    except OSError:
        return default


def write(p, text, mode=0o644):
    full = path(p)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    tmp = f"{full}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, full)


def sha(p):
    try:
        with open(path(p), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def load_config():
    import yaml

    text = read(CONFIG)
    conf = yaml.safe_load(text) if text else {}
    return conf or {}


# --- install script -----------------------------------------------------------------------------------------


def binary_wrapper(version, python=None, script=None):
    moved = f"GPULAB_K3S_ROOT='{ROOT}' " if ROOT != "/" else ""
    run = f"{python or sys.executable} {script or SCRIPT}"
    return f"#!/bin/sh\n{moved}GPULAB_K3S_VERSION='{version}' exec {run} k3s \"$@\"\n"


def install(env):
    """What get.k3s.io does, for the variables and files the roles rely on."""
    exec_args = (env.get("INSTALL_K3S_EXEC") or "").split()
    if exec_args and not exec_args[0].startswith("-"):
        cmd, args = exec_args[0], exec_args[1:]
    elif env.get("K3S_URL"):
        if not env.get("K3S_TOKEN") and not env.get("K3S_TOKEN_FILE"):
            return fatal(
                "Defaulted k3s exec command to 'agent' because K3S_URL is defined, but K3S_TOKEN or "
                "K3S_TOKEN_FILE is not defined."
            )
        cmd, args = "agent", exec_args
    else:
        cmd, args = "server", exec_args
    if env.get("K3S_URL") and not env["K3S_URL"].startswith("https://"):
        return fatal(f"Only https:// URLs are supported for K3S_URL (have {env['K3S_URL']})")
    name = "k3s" if cmd == "server" else "k3s-agent"
    bin_dir = env.get("INSTALL_K3S_BIN_DIR", "/usr/local/bin")
    unit_dir = env.get("INSTALL_K3S_SYSTEMD_DIR", "/etc/systemd/system")
    binary, unit, env_file = f"{bin_dir}/k3s", f"{unit_dir}/{name}.service", f"{unit_dir}/{name}.service.env"
    before = [sha(binary), sha(unit), sha(env_file)]

    if env.get("INSTALL_K3S_SKIP_DOWNLOAD") == "true":
        if not os.access(path(binary), os.X_OK):
            return fatal(f"Executable k3s binary not found at {binary}")
        info("Skipping k3s download and verify")
    else:
        version = env.get("INSTALL_K3S_VERSION") or DEFAULT_VERSION
        info(f"Using {version} as release")
        if read(binary) == binary_wrapper(version):
            info("Skipping binary downloaded, installed k3s matches hash")
        else:
            info(f"Downloading binary for {version}")
            write(binary, binary_wrapper(version), 0o755)
            info(f"Installing k3s to {binary}")
    for link in ("kubectl", "crictl", "ctr"):
        target = path(f"{bin_dir}/{link}")
        if not os.path.lexists(target) and shutil.which(link) is None:
            info(f"Creating {bin_dir}/{link} symlink to k3s")
            os.symlink("k3s", target)
    info(f"Creating killall script {bin_dir}/k3s-killall.sh")
    write(f"{bin_dir}/k3s-killall.sh", "#!/bin/sh\nsystemctl stop k3s k3s-agent 2>/dev/null\nexit 0\n", 0o755)
    uninstall = f"{bin_dir}/{name}-uninstall.sh"
    info(f"Creating uninstall script {uninstall}")
    write(uninstall, uninstall_script(name, bin_dir, unit, env_file), 0o755)
    info(f"env: Creating environment file {env_file}")
    lines = [f"{k}='{v}'" for k, v in sorted(env.items()) if k.startswith(("K3S_", "CONTAINERD_"))]
    write(env_file, "".join(line + "\n" for line in lines), 0o600)
    info(f"systemd: Creating service file {unit}")
    exec_line = " \\\n".join([f"ExecStart={bin_dir}/k3s", f"    {cmd}", *(f"\t'{a}'" for a in args)])
    write(unit, UNIT.format(name=name, exec=exec_line, env_file=env_file))
    after = [sha(binary), sha(unit), sha(env_file)]

    if env.get("INSTALL_K3S_SKIP_ENABLE") == "true":
        return 0
    info(f"systemd: Enabling {name} unit")
    subprocess.run(["systemctl", "daemon-reload"], check=False)
    subprocess.run(["systemctl", "enable", name], check=False, capture_output=True)
    if env.get("INSTALL_K3S_SKIP_START") == "true":
        return 0
    if before == after and env.get("INSTALL_K3S_FORCE_RESTART") != "true":
        info("No change detected so skipping service start")
        return 0
    info(f"systemd: Starting {name}")
    return subprocess.run(["systemctl", "restart", name], check=False).returncode


UNIT = """[Unit]
Description=Lightweight Kubernetes
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-{env_file}
KillMode=process
Delegate=yes
Restart=always
RestartSec=5s
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
{exec}

"""


def uninstall_script(name, bin_dir, unit, env_file):
    """Stops and removes what the install (and the service) made; every path under the stand-in's root."""
    p = {
        k: path(v)
        for k, v in {
            "unit": unit,
            "env": env_file,
            "bin": bin_dir,
            "server": SERVER_DIR,
            "kubeconfig": KUBECONFIG,
            "etc": "/etc/rancher/k3s",
            "agent": "/var/lib/rancher/k3s/agent",
        }.items()
    }
    extra = f"rm -rf {p['server']} {p['kubeconfig']}\n" if name == "k3s" else ""
    return (
        "#!/bin/sh\n"
        f"systemctl stop {name} 2>/dev/null\n"
        f"systemctl disable {name} 2>/dev/null\n"
        f"rm -f {p['unit']} {p['env']}\n"
        f"for l in kubectl crictl ctr; do [ -L {p['bin']}/$l ] && rm -f {p['bin']}/$l; done\n"
        f"rm -f {p['bin']}/k3s {p['bin']}/k3s-killall.sh\n"
        f"rm -rf {p['etc']} {p['agent']}\n{extra}"
        f"rm -f {p['bin']}/{name}-uninstall.sh\n"
    )


# --- server and agent processes -----------------------------------------------------------------------------


def token_of(conf):
    if conf.get("token-file"):
        return (read(conf["token-file"], "") or "").strip()
    return str(conf.get("token") or os.environ.get("K3S_TOKEN", ""))


def password_of(token):
    """Agents may give the full K10 token or only its password part."""
    return token.rsplit("::server:", 1)[-1] if "::server:" in token else token


def nvidia_runtime():
    return any(os.access(path(f"{d}/nvidia-container-runtime"), os.X_OK) for d in NVIDIA_RUNTIME_DIRS)


def gpus():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    args = [smi, "--query-gpu=uuid,name,memory.total", "--format=csv,noheader,nounits"]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return []
    return [line.split(", ")[0] for line in out.stdout.splitlines() if line.startswith("GPU-")]


def node_labels(conf, name, server):
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "k3s",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "k3s",
    }
    if server:
        labels["node-role.kubernetes.io/control-plane"] = "true"
    for item in conf.get("node-label") or []:
        key, _, value = str(item).partition("=")
        labels[key] = value
    return labels


def load_state():
    text = read(STATE)
    return json.loads(text) if text else {"nodes": {}}


def save_state(state):
    write(STATE, json.dumps(state, indent=1), 0o600)


def register(state, node):
    old = state["nodes"].get(node["name"], {})
    # Like k3s, labels given by node-label apply when the node registers; later `kubectl label` calls stay.
    labels = {**node["labels"], **old.get("labels", {})} if old else node["labels"]
    state["nodes"][node["name"]] = {**old, **node, "labels": labels, "last_seen": time.time()}


def run_server(conf):
    token = token_of(conf) or secrets.token_hex(16)
    if not read(TOKEN):
        ca = hashlib.sha256(secrets.token_bytes(32)).hexdigest()
        write(TOKEN, f"K10{ca}::server:{password_of(token)}\n", 0o600)
        link = path(f"{SERVER_DIR}/node-token")
        if not os.path.lexists(link):
            os.symlink("token", link)
    os.makedirs(path(MANIFESTS), exist_ok=True)
    port = int(conf.get("https-listen-port", 6443))
    write(
        KUBECONFIG, KUBECONFIG_TEXT.format(port=port), int(str(conf.get("write-kubeconfig-mode", "0600")), 8)
    )
    name = conf.get("node-name") or socket.gethostname()
    state = load_state()
    register(
        state,
        {
            "name": name,
            "labels": node_labels(conf, name, True),
            "server": True,
            "nvidia_runtime": nvidia_runtime(),
            "gpus": gpus(),
            "version": version(),
        },
    )
    state["started"] = time.time()
    save_state(state)
    expected = password_of(read(TOKEN).strip())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if password_of(str(body.get("token", ""))) != expected:
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error": "token rejected"}')
                return
            st = load_state()
            register(st, {k: body[k] for k in ("name", "labels", "nvidia_runtime", "gpus", "version")})
            save_state(st)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"joined": true}')

    server = ThreadingHTTPServer((conf.get("bind-address", "0.0.0.0"), port), Handler)
    server.serve_forever()
    return 0


KUBECONFIG_TEXT = """apiVersion: v1
clusters:
- cluster:
    server: https://127.0.0.1:{port}
  name: default
contexts:
- context:
    cluster: default
    user: default
  name: default
current-context: default
kind: Config
users:
- name: default
  user: {{}}
"""


def run_agent(conf):
    url = str(conf.get("server") or os.environ.get("K3S_URL", ""))
    if not url.startswith("https://"):
        print(f'level=fatal msg="--server is required and must be https://, not {url!r}"', file=sys.stderr)
        return 1
    name = conf.get("node-name") or socket.gethostname()
    body = {
        "name": name,
        "labels": node_labels(conf, name, False),
        "token": token_of(conf),
        "nvidia_runtime": nvidia_runtime(),
        "gpus": gpus(),
        "version": version(),
    }
    target = "http://" + url[len("https://") :].rstrip("/") + "/join"
    while True:
        req = urllib.request.Request(target, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                print('level=fatal msg="token rejected by the server"', file=sys.stderr)
                return 1
        except OSError:
            pass
        time.sleep(float(os.environ.get("GPULAB_K3S_HEARTBEAT", "10")))


# --- kubectl ------------------------------------------------------------------------------------------------


def manifest_objects():
    import yaml

    objs = []
    folder = path(MANIFESTS)
    for fname in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not fname.endswith((".yaml", ".yml", ".json")) or fname.startswith("."):
            continue
        with open(os.path.join(folder, fname)) as f:
            objs += [d for d in yaml.safe_load_all(f) if isinstance(d, dict)]
    # Objects a HelmChart for HAMi brings (chart hami: device plugin DaemonSet and scheduler Deployment).
    for chart in [
        o for o in objs if o.get("kind") == "HelmChart" and o.get("spec", {}).get("chart") == "hami"
    ]:
        ns = chart["spec"].get("targetNamespace") or chart["metadata"].get("namespace", "kube-system")
        release = chart["metadata"]["name"]
        image = {"name": "device-plugin", "image": "docker.io/projecthami/hami:v2.10.0"}
        objs.append(
            {
                "kind": "DaemonSet",
                "metadata": {"name": f"{release}-device-plugin", "namespace": ns},
                "spec": {"template": {"spec": {"containers": [image]}}},
            }
        )
        objs.append({"kind": "Deployment", "metadata": {"name": f"{release}-scheduler", "namespace": ns}})
    return objs


def hami_values():
    import yaml

    for obj in manifest_objects():
        if obj.get("kind") == "HelmChart" and obj.get("spec", {}).get("chart") == "hami":
            return yaml.safe_load(obj["spec"].get("valuesContent") or "") or {}
    return None


def node_objects():
    state = load_state()
    values = hami_values()
    plugin = (values or {}).get("devicePlugin", {})
    split = int(plugin.get("deviceSplitCount", 10))
    selector = plugin.get("nvidiaNodeSelector", {"gpu": "on"})
    items = []
    for name, node in sorted(state["nodes"].items()):
        allocatable = {"cpu": "4", "memory": "4010000Ki", "pods": "110", "ephemeral-storage": "57000000000"}
        labels = node["labels"]
        if (
            values is not None
            and node.get("gpus")
            and node.get("nvidia_runtime")
            and all(labels.get(k) == str(v) for k, v in selector.items())
        ):
            allocatable["nvidia.com/gpu"] = str(split * len(node["gpus"]))
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {"k3s.io/hostname": name, "k3s.io/node-args": '["********"]'},
                },
                "spec": {"unschedulable": True} if node.get("unschedulable") else {},
                "status": {
                    "conditions": [
                        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                        },
                    ],
                    "allocatable": allocatable,
                    "capacity": dict(allocatable),
                    "nodeInfo": {
                        "kubeletVersion": node.get("version", DEFAULT_VERSION),
                        "containerRuntimeVersion": "containerd://2.1.4-k3s1",
                    },
                },
            }
        )
    return items


def not_found(kind, name):
    print(f'Error from server (NotFound): {kind} "{name}" not found', file=sys.stderr)
    return 1


def kubectl(args):
    if not read(STATE):
        print(
            "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        return 1
    flags = {
        a.split("=", 1)[0]: (a.split("=", 1)[1] if "=" in a else True) for a in args if a.startswith("-")
    }
    words = [
        a for i, a in enumerate(args) if not a.startswith("-") and not (i and args[i - 1] in ("-o", "-n"))
    ]
    output = args[args.index("-o") + 1] if "-o" in args else flags.get("--output") or flags.get("-o")
    namespace = args[args.index("-n") + 1] if "-n" in args else "default"
    verb, rest = (words[0], words[1:]) if words else ("", [])
    state = load_state()
    objs = manifest_objects()

    def find(kind, name):
        return [
            o
            for o in objs
            if o.get("kind") == kind
            and o["metadata"]["name"] == name
            and o["metadata"].get("namespace", "default") == namespace
        ]

    if verb == "get" and rest[:1] in (["nodes"], ["node"]):
        items = node_objects()
        if output == "json":
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))
        else:
            print("NAME   STATUS   ROLES   AGE   VERSION")
            for n in items:
                print(
                    f"{n['metadata']['name']}   Ready   <none>   1m   {n['status']['nodeInfo']['kubeletVersion']}"
                )
        return 0
    if verb == "get" and rest[:1] == ["runtimeclass"]:
        names = rest[1:] or list(RUNTIME_CLASSES)
        for n in names:
            if n not in RUNTIME_CLASSES:
                return not_found("runtimeclasses.node.k8s.io", n)
        if output and str(output).startswith("jsonpath"):
            sys.stdout.write(" ".join(names))
        else:
            print("\n".join(f"{n}   {n}" for n in names))
        return 0
    if verb == "get" and rest[:1] == ["daemonsets"]:
        ds = [o for o in objs if o.get("kind") == "DaemonSet"]
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": ds}))
        return 0
    if verb in ("label", "drain", "cordon", "uncordon") and rest[:1] == ["node"]:
        rest = rest[1:]
    if verb == "label":
        name = rest[0]
        if name not in state["nodes"]:
            return not_found("nodes", name)
        for pair in rest[1:]:
            key, _, value = pair.partition("=")
            state["nodes"][name]["labels"][key] = value
        save_state(state)
        print(f"node/{name} labeled")
        return 0
    if verb in ("drain", "cordon", "uncordon"):
        name = rest[0]
        if name not in state["nodes"]:
            return not_found("nodes", name)
        state["nodes"][name]["unschedulable"] = verb != "uncordon"
        save_state(state)
        print(f"node/{name} {'drained' if verb == 'drain' else verb + 'ed'}")
        return 0
    if verb == "wait":
        target = rest[0]
        kind, _, name = target.partition("/")
        if kind == "job":
            release = name.removeprefix("helm-install-")
            return 0 if find("HelmChart", release) else not_found("jobs.batch", name)
        if kind == "node":
            return 0 if name in state["nodes"] else not_found("nodes", name)
        return 0
    if verb == "rollout" and rest[:1] == ["status"]:
        kind, _, name = rest[1].partition("/")
        kinds = {
            "deployment": ("Deployment", "deployments.apps"),
            "daemonset": ("DaemonSet", "daemonsets.apps"),
        }
        kind_name, api = kinds[kind]
        if not find(kind_name, name):
            return not_found(api, name)
        print(f'{kind} "{name}" successfully rolled out')
        return 0
    print(f"error: the k3s stand-in does not know `kubectl {' '.join(args)}`", file=sys.stderr)
    return 1


# --- systemctl ----------------------------------------------------------------------------------------------
# For lab hosts without a running systemd: what Ansible's systemd_service module and the install script ask of
# systemctl. Units with an ExecStart (k3s, k3s-agent) really run, in the background; other units (the guest
# agent, the time daemon) only keep their state. State lives in /var/lib/gpulab-sim/systemd.

UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMD_STATE = "/var/lib/gpulab-sim/systemd"


def _unit(name):
    name = name.strip("'\"")
    return name if "." in name else f"{name}.service"


def _unit_file(unit):
    for d in UNIT_DIRS:
        if os.path.exists(path(f"{d}/{unit}")):
            return f"{d}/{unit}"
    return None


def _exec_start(unit_path):
    text = (read(unit_path, "") or "").replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            import shlex

            return shlex.split(line[len("ExecStart=") :])
    return None


def _unit_state(unit):
    text = read(f"{SYSTEMD_STATE}/{unit}.json")
    return json.loads(text) if text else {"enabled": False, "active": False, "pid": None}


def _save_unit_state(unit, st):
    write(f"{SYSTEMD_STATE}/{unit}.json", json.dumps(st))


def _alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return " Z " not in f.read()
    except OSError:
        return False


def _active(unit, st):
    return _alive(st.get("pid")) if _exec_start(_unit_file(unit) or "") else st.get("active", False)


def _stop(unit, st):
    if _alive(st.get("pid")):
        with contextlib.suppress(OSError):
            os.killpg(st["pid"], 15)
        for _ in range(50):
            if not _alive(st["pid"]):
                break
            time.sleep(0.1)
    st.update(active=False, pid=None)


def _start(unit, st):
    argv = _exec_start(_unit_file(unit) or "")
    if argv:
        argv[0] = path(argv[0])
        env = dict(os.environ)
        for p in (read(f"/etc/systemd/system/{unit}.env", "") or "").splitlines():
            key, _, value = p.partition("=")
            env[key] = value.strip("'")
        os.makedirs(path("/var/log"), exist_ok=True)
        with open(path(f"/var/log/{unit}.log"), "a") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        st.update(pid=proc.pid)
    st.update(active=True)


def systemctl(args):
    args = [a for a in args if a not in ("--no-block", "--system", "--force", "-l", "--no-pager", "-q")]
    verb, names = (args[0], args[1:]) if args else ("", [])
    if verb in ("daemon-reload", "daemon-reexec", ""):
        return 0
    if verb == "list-unit-files":
        for n in names:
            unit = _unit(n.rstrip("*"))
            if _unit_file(unit):
                print(f"{unit} {'enabled' if _unit_state(unit)['enabled'] else 'disabled'}")
        return 0
    rc = 0
    for n in names:
        unit = _unit(n)
        if verb != "show" and not _unit_file(unit):
            print(f"Failed to {verb} {unit}: Unit {unit} not found.", file=sys.stderr)
            rc = 5 if verb not in ("is-enabled", "is-active") else 4
            continue
        st = _unit_state(unit)
        if verb == "show":
            loaded = _unit_file(unit) is not None
            active = loaded and _active(unit, st)
            print(
                f"Id={unit}\nNames={unit}\nLoadState={'loaded' if loaded else 'not-found'}\n"
                f"ActiveState={'active' if active else 'inactive'}\nSubState={'running' if active else 'dead'}\n"
                f"UnitFileState={'enabled' if st['enabled'] else 'disabled'}\nMainPID={st.get('pid') or 0}"
            )
        elif verb == "is-enabled":
            print("enabled" if st["enabled"] else "disabled")
            rc = rc or (0 if st["enabled"] else 1)
        elif verb == "is-active":
            active = _active(unit, st)
            print("active" if active else "inactive")
            rc = rc or (0 if active else 3)
        elif verb in ("enable", "disable"):
            st["enabled"] = verb == "enable"
        elif verb in ("start", "restart", "reload-or-restart", "try-restart"):
            if verb == "start" and _active(unit, st):
                continue
            if verb == "try-restart" and not _active(unit, st):
                continue
            _stop(unit, st)
            _start(unit, st)
        elif verb == "stop":
            _stop(unit, st)
        else:
            print(f"systemctl stand-in: unknown verb {verb}", file=sys.stderr)
            return 1
        _save_unit_state(unit, st)
    return rc


# --- entry points -------------------------------------------------------------------------------------------


def version():
    return os.environ.get("GPULAB_K3S_VERSION", DEFAULT_VERSION)


def k3s(args):
    if args[:1] in (["--version"], ["-v"], ["version"]):
        print(f"k3s version {version()} ({COMMIT})\ngo version go1.24.6")
        return 0
    if args[:1] == ["kubectl"]:
        return kubectl(args[1:])
    if args[:1] == ["server"]:
        return run_server(load_config())
    if args[:1] == ["agent"]:
        return run_agent(load_config())
    print(f"k3s stand-in: unknown command {args!r}", file=sys.stderr)
    return 1


def files(version=DEFAULT_VERSION):
    """Files to place on a lab host: {path: (mode, text)}; the binary and script are those of an air-gap install."""
    with open(os.path.abspath(__file__)) as f:
        me = f.read()
    script, python = "/usr/local/lib/gpulab/k3s_standin.py", "/usr/bin/python3"
    return {
        script: (0o755, me),
        "/usr/local/bin/k3s": (0o755, binary_wrapper(version, python, script)),
        "/usr/local/bin/k3s-install.sh": (0o755, f'#!/bin/sh\nexec {python} {script} install "$@"\n'),
        # Only for hosts without a running systemd: shadows /usr/bin/systemctl through the PATH.
        "/usr/local/bin/systemctl": (0o755, f'#!/bin/sh\nexec {python} {script} systemctl "$@"\n'),
    }


def main(argv):
    cmd, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if cmd == "install":
        rc = install(dict(os.environ))
    elif cmd == "k3s":
        rc = k3s(args)
    elif cmd == "systemctl":
        rc = systemctl(args)
    else:
        print("usage: k3s_standin.py {install|k3s ...|systemctl ...}", file=sys.stderr)
        rc = 2
    if not (cmd == "k3s" and args[:1] in (["server"], ["agent"])):
        log([cmd, *args], rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
