"""PID 1 of a lab host (node or VM): private root, own sshd, boots and reboots.

Started by :mod:`labsim.network_lab` as
``ip netns exec NS unshare --mount --propagation private --uts --pid --fork --kill-child -- python3 hostinit.py
CONFIG``, so this process is PID 1 of a fresh pid namespace, owns a private mount namespace and
hostname, and lives in the host's network namespace. It uses the standard library only.

What one "boot" does:

* (first boot of the process) mount the host's root: an overlay of the lower directory (``/``
  by default: a copy-on-write view of the machine) and the host's own upper directory, so every
  write lands in the host's upper directory and nowhere else; then a private ``/proc``, the netns'
  ``/sys``, a minimal ``/dev`` (no disks), fresh tmpfs ``/run`` and ``/tmp``;
* apply the boot views the config names (files bind-mounted over ``/proc`` and ``/sys`` entries,
  e.g. ``/proc/cmdline`` of a Proxmox node, or a sysfs PCI tree), after running the optional
  ``boot_hook`` command that prepares them; a new ``/proc/sys/kernel/random/boot_id`` each boot;
* get the address: static, or by DHCP with the host's own ``dhclient`` (its lease file lives in
  the host's ``/var/lib/dhcp``; the hook script only sets the address);
* start ``sshd -D`` on that address only, with the config file this module writes;
* write ``status.json`` (boot number, address, sshd pid) where the lab reads it.

A reboot is requested from inside the host by creating ``/run/gpulab/reboot`` (the ``reboot`` and
``shutdown`` stand-ins do that); ``/run/gpulab/poweroff`` ends the host. Rebooting kills every
other process of the host (so SSH connections drop, as on a real reboot) and boots again.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

POLL_S = 0.05


def run(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, **kw)


def mount(*args):
    run("mount", *args)


class Host:
    def __init__(self, cfg):
        self.cfg = cfg
        self.root = cfg["root"]
        self.boot = 0
        self.sshd = None
        self.address = None
        self.port = int(cfg.get("port", 22))  # another port: a host that shares the machine's network
        self.skipped_views = []
        self.services = {}
        self.systemd = cfg.get("init") == "systemd"
        self.inner = None
        self.reaped = {}

    # -- file system ------------------------------------------------------------------------
    def path(self, inner):
        return os.path.join(self.root, inner.lstrip("/"))

    def mount_root(self):
        c = self.cfg
        mount(
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={c['lower']},upperdir={c['upper']},workdir={c['work']}",
            self.root,
        )
        mount("-t", "proc", "proc", self.path("/proc"))
        real_sys = self.cfg.get("real_sys")
        if real_sys:
            # the node's /sys is a view; the netns' real sysfs is mounted aside and lent to it in part
            mount("-t", "sysfs", "sysfs", real_sys)
        else:
            mount("-t", "sysfs", "sysfs", self.path("/sys"))
        dev = self.path("/dev")
        mount("-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", dev)
        for name in ("null", "zero", "full", "random", "urandom", "tty"):
            target = os.path.join(dev, name)
            open(target, "w").close()
            mount("--bind", f"/dev/{name}", target)
        os.makedirs(os.path.join(dev, "pts"))
        os.makedirs(os.path.join(dev, "shm"))
        mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", os.path.join(dev, "pts"))
        os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
        for src, name in (
            ("/proc/self/fd", "fd"),
            ("/proc/self/fd/0", "stdin"),
            ("/proc/self/fd/1", "stdout"),
        ):
            os.symlink(src, os.path.join(dev, name))

    def fresh_tmpfs(self):
        for inner, mode in (("/run", "755"), ("/tmp", "1777")):
            target = self.path(inner)
            while os.path.ismount(target):
                run("umount", "-l", target)
            mount("-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", target)
        for d in ("/run/sshd", "/run/gpulab", "/run/lock"):
            os.makedirs(self.path(d), exist_ok=True)
        os.chmod(self.path("/run/sshd"), 0o755)

    def unmount_views(self):
        """Unmount the views of the previous boot, innermost first (lazily: a shell may be in one)."""
        for _src, inner in reversed(self.views()):
            target = self.path(inner)
            while os.path.ismount(target):
                run("umount", "-l", target)

    def views(self):
        boot_id = os.path.join(self.cfg["state"], "boot_id")
        return [(boot_id, "/proc/sys/kernel/random/boot_id"), *self.cfg.get("views", [])]

    def mount_views(self):
        """Bind the boot views (prepared by boot_hook) over /proc and /sys entries, in order."""
        self.skipped_views = []
        with open(os.path.join(self.cfg["state"], "boot_id"), "w") as f:
            f.write(f"{uuid.uuid4()}\n")
        for src, inner in self.views():
            if not os.path.exists(src):
                continue
            target = self.path(inner)
            if not os.path.lexists(target) and inner.startswith("/proc/"):
                # procfs cannot grow entries (e.g. /proc/modules on a kernel without module support)
                self.skipped_views.append(inner)
                continue
            if not os.path.lexists(target):
                # a mount point inside an earlier view (a directory tree on disk), e.g. /sys/class/net
                if os.path.isdir(src):
                    os.makedirs(target, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    open(target, "w").close()
            mount("--bind", src, target)

    # -- network ----------------------------------------------------------------------------
    def iface_address(self):
        out = run("ip", "-4", "-j", "addr", "show", "dev", self.cfg["iface"], capture_output=True, text=True)
        for info in json.loads(out.stdout or "[]"):
            for a in info.get("addr_info", []):
                if a.get("scope") == "global":
                    return a["local"]
        return None

    def get_address(self):
        c = self.cfg
        if c.get("address"):
            return c["address"].split("/")[0]
        run("ip", "-4", "addr", "flush", "dev", c["iface"])
        dhcp = c["dhcp"]
        deadline = time.monotonic() + dhcp.get("timeout", 20)
        while time.monotonic() < deadline:
            # -1: try once and exit non-zero without a lease; with one it stays in the background and renews
            res = run(
                "chroot",
                self.root,
                "dhclient",
                "-4",
                "-1",
                "-sf",
                dhcp["hook"],
                "-lf",
                "/var/lib/dhcp/dhclient.leases",
                "-pf",
                "/run/dhclient.pid",
                c["iface"],
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            addr = self.iface_address()
            if res.returncode == 0 and addr:
                return addr
            time.sleep(0.2)
        raise RuntimeError(f"{c['name']}: no DHCP lease on {c['iface']}")

    # -- users (cloud-init's ciuser / sshkeys, the lab key for root; or an installer's user) ------
    # a user's "password" is set when the user is made; "sudo": true is passwordless (cloud-init's
    # NOPASSWD rule), "sudo": "password" membership of group sudo (sudo asks for the password)
    def ensure_users(self):
        for user in self.cfg.get("users", []):
            name = user["name"]
            if name != "root":
                known = run("chroot", self.root, "id", "-u", name, check=False, capture_output=True)
                if known.returncode != 0:
                    run("chroot", self.root, "useradd", "-m", "-s", "/bin/bash", "-U", name)
                    if user.get("password"):
                        # made at an installer: a password of its own, set once (the guest may change it)
                        run("chroot", self.root, "chpasswd", input=f"{name}:{user['password']}\n", text=True)
                if user.get("sudo") == "password":
                    # the Ubuntu installer's user: in group sudo, whose sudoers rule asks for the password
                    run("chroot", self.root, "usermod", "-a", "-G", "sudo", name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path(f"/etc/sudoers.d/90-gpulab-{name}"))
                elif not user.get("password"):
                    # '*': no password, but not "locked" (sshd without PAM refuses locked accounts)
                    run("chroot", self.root, "usermod", "-p", "*", name)
                if user.get("sudo") and user.get("sudo") != "password":
                    sudoers = self.path(f"/etc/sudoers.d/90-gpulab-{name}")
                    os.makedirs(os.path.dirname(sudoers), exist_ok=True)
                    with open(sudoers, "w") as f:
                        f.write(f"{name} ALL=(ALL) NOPASSWD:ALL\n")
                    os.chmod(sudoers, 0o440)
            home = "/root" if name == "root" else f"/home/{name}"
            ssh_dir = self.path(f"{home}/.ssh")
            os.makedirs(ssh_dir, exist_ok=True)
            keys_file = os.path.join(ssh_dir, "authorized_keys")
            with open(keys_file, "w") as f:
                f.write("".join(k.strip() + "\n" for k in user.get("keys", [])))
            os.chmod(ssh_dir, 0o700)
            os.chmod(keys_file, 0o600)
            if name != "root":
                run("chroot", self.root, "chown", "-R", f"{name}:{name}", f"{home}/.ssh")

    # -- sshd -------------------------------------------------------------------------------
    def write_sshd_config(self):
        c = self.cfg
        lines = [
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {c['host_key']}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "AcceptEnv LANG LC_*",
            "PrintMotd no",
            "PidFile /run/sshd.pid",
            "Subsystem sftp internal-sftp",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
        ]
        with open(self.path(c["sshd_config"]), "w") as f:
            f.write("# written by gpulab labsim at each boot of this lab host\n" + "\n".join(lines) + "\n")

    def start_sshd(self):
        if not self.cfg.get("address"):
            self.address = self.iface_address() or self.address  # a renew may have moved it
        self.write_sshd_config()
        with open(os.path.join(self.cfg["state"], "sshd.log"), "ab") as log:
            self.sshd = subprocess.Popen(
                ["chroot", self.root, "/usr/sbin/sshd", "-D", "-e", "-f", self.cfg["sshd_config"]],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        self.wait_for_ssh(self.sshd, "sshd", 10, 0.02, "sshd does not listen")

    def wait_for_ssh(self, proc, what: str, timeout: float, pause: float, late: str) -> None:
        """Return once the host's address and port take connections; raise if `proc` (`what`) exits
        first, or with `late` once `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((self.address, self.port)) == 0:
                    return
            if proc.poll() is not None:
                raise RuntimeError(f"{self.cfg['name']}: {what} exited with {proc.returncode}")
            time.sleep(pause)
        raise RuntimeError(f"{self.cfg['name']}: {late} on {self.address}:{self.port}")

    # -- services (a DHCP server on the router host), restarted when they die, as systemd would; one with
    # "once" (a VM's unattended-upgrades run after boot) runs once a boot ------------------------------------
    def start_service(self, index):
        svc = self.cfg["services"][index]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **svc.get("env", {})}
        with open(os.path.join(self.cfg["state"], f"service-{svc['name']}.log"), "ab") as log:
            proc = subprocess.Popen(
                ["chroot", self.root, *svc["argv"]], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env
            )
        self.services[index] = (proc, time.monotonic())
        ready = svc.get("ready_file")
        deadline = time.monotonic() + 10
        while ready and not os.path.exists(self.path(ready)) and time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            time.sleep(0.02)

    def start_services(self):
        for d in self.cfg.get("run_dirs", []):
            os.makedirs(self.path(d), exist_ok=True)
            os.chmod(self.path(d), 0o750)  # as systemd's RuntimeDirectory= makes them (Kea wants no more)
        for index in range(len(self.cfg.get("services", []))):
            self.start_service(index)

    def watch_services(self):
        for index, (proc, started) in list(self.services.items()):
            if self.cfg["services"][index].get("once"):
                continue  # a one-shot job (Type=oneshot): it ends, and stays ended until the next boot
            if proc.poll() is not None and time.monotonic() - started > 1.0:
                self.start_service(index)

    # -- systemd as PID 1 of an inner pid namespace (the host's service manager) ---------------------
    def cgroup_root(self):
        """Mount the cgroup2 hierarchy aside (ip netns exec hid /sys/fs/cgroup); return our own cgroup dir."""
        mnt = os.path.join(self.cfg["state"], "cgroup")
        os.makedirs(mnt, exist_ok=True)
        if not os.path.ismount(mnt):
            mount("-t", "cgroup2", "cgroup2", mnt)
        with open("/proc/self/cgroup") as f:
            own = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
        return os.path.join(mnt, own.lstrip("/"))

    def start_systemd(self):
        base = self.cgroup_root()
        payload = os.path.join(base, "host")
        remove_cgroup_tree(payload)
        os.makedirs(payload, exist_ok=True)

        def into_payload():
            with open(os.path.join(payload, "cgroup.procs"), "w") as f:
                f.write("0")

        unshare = [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--cgroup",
            "--mount",
            "--propagation",
            "private",
        ]
        with open(os.path.join(self.cfg["state"], "systemd.log"), "ab") as log:
            self.inner = subprocess.Popen(
                [*unshare, "--", sys.executable, os.path.abspath(__file__), "--inner", self.cfg["_path"]],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                preexec_fn=into_payload,
            )
        self.wait_for_ssh(self.inner, "systemd", 60, 0.05, "systemd did not start sshd")

    def inner_main(self):
        """In the inner pid and mount namespace: fresh /proc and cgroup2, the views again, then systemd."""
        mount("-t", "proc", "proc", self.path("/proc"))
        mount("-t", "cgroup2", "cgroup2", self.path("/sys/fs/cgroup"))
        for src, inner in self.views():
            target = self.path(inner)
            if os.path.exists(src) and os.path.lexists(target) and inner.startswith("/proc/"):
                mount("--bind", src, target)
        console = self.path("/dev/console")
        if not os.path.exists(console):
            open(console, "w").close()
        mount("--bind", "/dev/null", console)
        os.execv(
            "/usr/sbin/chroot",
            ["chroot", self.root, "/usr/bin/env", "-i", "container=gpulab", "TERM=dumb",
             "/lib/systemd/systemd", "--log-target=console"],
        )  # fmt: skip

    # -- boot cycle -------------------------------------------------------------------------
    def write_status(self, **extra):
        status = {"boot": self.boot, "address": self.address, "views_skipped": self.skipped_views, **extra}
        if self.sshd:
            status["sshd_pid_in_host"] = self.sshd.pid
        path = os.path.join(self.cfg["state"], "status.json")
        with open(path + ".tmp", "w") as f:
            json.dump(status, f)
        os.replace(path + ".tmp", path)

    def do_boot(self):
        self.boot += 1
        self.fresh_tmpfs()
        self.unmount_views()
        hook = self.cfg.get("boot_hook")
        if hook:
            env = dict(os.environ, GPULAB_HOST_ROOT=self.root, GPULAB_BOOT=str(self.boot))
            run(*hook, env=env)
        self.mount_views()
        self.ensure_users()
        run("ip", "link", "set", "lo", "up")
        run("ip", "link", "set", self.cfg["iface"], "up")
        self.address = self.get_address()
        if self.systemd:
            self.write_sshd_config()  # the gpulab-sshd unit reads it
            self.start_systemd()
        else:
            self.start_services()
            self.start_sshd()
        self.write_status()

    def kill_others(self):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)  # as PID 1: every other process of this pid namespace
        self.services = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.01)
        self.sshd = None

    def reap(self):
        """Collect every exited child (PID 1 adopts orphans); keep the status of the inner systemd's."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.inner is not None and pid == self.inner.pid:
                self.reaped[pid] = status

    def loop(self):
        run_dir = self.path("/run/gpulab")
        while True:
            self.reap()
            if os.path.exists(os.path.join(run_dir, "poweroff")):
                time.sleep(0.3)
                return
            if os.path.exists(os.path.join(run_dir, "reboot")):
                # let the command that asked for the reboot return to its caller first
                time.sleep(0.5)
                self.kill_others()
                self.do_boot()
                continue
            status = self.reaped.pop(self.inner.pid, None) if self.inner is not None else None
            if status is not None:
                # systemd ended: killed by SIGHUP means a reboot, anything else a power-off (as in a container)
                if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGHUP):
                    return
                self.inner = None
                self.kill_others()
                self.do_boot()
                continue
            self.watch_services()
            if self.sshd is not None and self.sshd.poll() is not None:
                self.start_sshd()  # sshd killed from inside (e.g. a restart): bring it back, as systemd would
            time.sleep(POLL_S)


def remove_cgroup_tree(path):
    """Remove a cgroup directory and its children, deepest first (each must be empty of processes)."""
    if not os.path.isdir(path):
        return
    for _ in range(50):
        for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if not os.path.isdir(path):
            return
        time.sleep(0.05)


def main(argv):
    if argv[1] == "--inner":
        with open(argv[2]) as f:
            cfg = json.load(f)
        cfg["_path"] = argv[2]
        Host(cfg).inner_main()
        return 1
    with open(argv[1]) as f:
        cfg = json.load(f)
    cfg["_path"] = argv[1]
    # hostname of this UTS namespace only
    run("hostname", cfg["name"])
    host = Host(cfg)
    try:
        host.mount_root()
        host.do_boot()
    except Exception as exc:
        with open(os.path.join(cfg["state"], "status.json"), "w") as f:
            json.dump({"error": str(exc)}, f)
        raise
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host.loop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
