"""Running commands on a router host: over SSH (paramiko) or locally (tests, a router on the controller).

Why the controller drives SSH routers itself instead of running a module on the router: OpenWrt has
no Python, a Pi or Debian router may have none either, and one engine with one set of refusals then
covers every kind of router. The router host only needs a POSIX shell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import re
import shlex
import subprocess

from .model import AuthError, ConnectError, RouterError


@dataclasses.dataclass
class CmdResult:
    rc: int
    out: str
    err: str


class Shell:
    """Run shell command lines on the router host."""

    where = "router host"

    def run(self, cmd: str, *, stdin: str | None = None) -> CmdResult:
        raise NotImplementedError

    def check(self, cmd: str, *, stdin: str | None = None, doing: str = "") -> str:
        res = self.run(cmd, stdin=stdin)
        if res.rc != 0:
            detail = (res.err or res.out).strip().splitlines()
            raise RouterError(
                f"{doing or 'running a command'} on {self.where} failed (exit {res.rc}): "
                + (detail[-1] if detail else "no output")
            )
        return res.out

    def read(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        q = shlex.quote(path)
        res = self.run(f"if [ -e {q} ]; then cat -- {q}; else exit 3; fi")
        if res.rc == 3:
            return None
        if res.rc != 0:
            raise RouterError(f"reading {path} on {self.where} failed: {res.err.strip() or res.rc}")
        return res.out

    def write_atomic(self, path: str, text: str) -> None:
        """Replace `path` with `text` in one rename, so readers never see half a file.

        The text goes to a temporary file beside `path` first. A connection that drops while it is sent ends
        `cat` as if the text were complete (the router's shell reads end of input), so the file's size is
        checked against the text's before the rename: a short file is removed and `path` keeps serving the
        previous reservations."""
        q = shlex.quote(path)
        tmp = shlex.quote(path + ".gpulab-tmp")
        d = shlex.quote(posixpath.dirname(path) or ".")
        size = len(text.encode())
        self.check(
            f"mkdir -p {d} && cat > {tmp} && n=$(wc -c < {tmp}) && "
            f'if [ "$n" -ne {size} ]; then rm -f {tmp}; '
            f'echo "only $n of {size} bytes arrived (the connection dropped?); {path} is unchanged" >&2; exit 75; fi '
            f"&& chmod 0644 {tmp} && mv -f {tmp} {q}",
            stdin=text,
            doing=f"writing {path}",
        )

    def close(self) -> None:
        pass


class LocalShell(Shell):
    """Commands on this machine, optionally behind a prefix such as `ip netns exec NAME`."""

    def __init__(self, prefix: list[str] | None = None, env: dict | None = None):
        self.prefix = list(prefix or [])
        self.env = env
        self.where = "the local router host"

    def run(self, cmd: str, *, stdin: str | None = None) -> CmdResult:
        proc = subprocess.run(
            [*self.prefix, "sh", "-c", cmd],
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        )
        return CmdResult(proc.returncode, proc.stdout, proc.stderr)


def parse_ssh_args(text: str | None) -> dict:
    """Host-key settings from OpenSSH-style arguments (ansible_ssh_common_args / _extra_args).

    Returns {"known_hosts": path or None, "policy": "strict" | "accept-new" | "no" | None}.
    """
    out: dict = {"known_hosts": None, "policy": None}
    words = shlex.split(text or "")
    opts = []
    for n, w in enumerate(words):
        if w == "-o" and n + 1 < len(words):
            opts.append(words[n + 1])
        elif w.startswith("-o") and len(w) > 2:
            opts.append(w[2:])
    for opt in opts:
        m = re.match(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)$", opt)
        if not m:
            continue
        key, value = m.group(1).lower(), m.group(2).strip()
        if key == "userknownhostsfile":
            out["known_hosts"] = value.split()[0] if value else None
        elif key == "stricthostkeychecking":
            out["policy"] = {"no": "no", "off": "no", "accept-new": "accept-new"}.get(value.lower(), "strict")
    return out


class SSHShell(Shell):
    """Commands over SSH with paramiko, as the inventory host of group `router`.

    Host keys: `host_key_policy` "strict" (default) accepts only keys in the known_hosts files (the
    user's and `known_hosts`), "accept-new" also accepts a host seen for the first time and records
    its key in `known_hosts` (OpenSSH's StrictHostKeyChecking=accept-new; a changed key is still
    refused), "no" accepts any key. `host_key_checking=False` means "no". `become` runs commands
    through `sudo -n` for a non-root user.
    """

    def __init__(
        self,
        host: str,
        *,
        port: int = 22,
        user: str = "root",
        password: str | None = None,
        key_filename: str | None = None,
        host_key_checking: bool = True,
        known_hosts: str | None = None,
        host_key_policy: str | None = None,
        become: bool = False,
        timeout: float = 15.0,
    ):
        import paramiko  # controller-side only

        self.where = f"{user}@{host}:{port}"
        self.become = become
        self.client = paramiko.SSHClient()
        with contextlib.suppress(OSError):
            self.client.load_system_host_keys()
        if known_hosts:
            with contextlib.suppress(OSError):
                self.client.load_host_keys(known_hosts)
        policy = host_key_policy or ("strict" if host_key_checking else "no")
        if policy == "no":
            self.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        elif policy == "accept-new":
            self.client.set_missing_host_key_policy(_AcceptNew(known_hosts, paramiko))
        else:
            self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            self.client.connect(
                host,
                port=port,
                username=user,
                password=password,
                key_filename=key_filename,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                allow_agent=password is None and key_filename is None,
                look_for_keys=password is None and key_filename is None,
            )
        except paramiko.AuthenticationException:
            raise AuthError(
                f"SSH login to {self.where} was refused: check router_user and the SSH key or password "
                "of the router host in the inventory"
            ) from None
        except paramiko.BadHostKeyException:
            raise ConnectError(
                f"the SSH host key of {self.where} changed since it was recorded in known_hosts; if the router "
                "was reinstalled, remove its old key (ssh-keygen -R), otherwise stop: someone may be in between"
            ) from None
        except paramiko.SSHException as e:
            raise ConnectError(
                f"SSH to {self.where} failed: {e}; if the host key is unknown, add it to known_hosts "
                "(ssh-keyscan) or set router_ssh_host_key_checking: false for a throw-away lab"
            ) from None
        except OSError as e:
            raise ConnectError(f"cannot reach {self.where} over SSH: {e.strerror or e}") from None

    def run(self, cmd: str, *, stdin: str | None = None) -> CmdResult:
        if self.become:
            cmd = "sudo -n sh -c " + shlex.quote(cmd)
        chan_in, chan_out, chan_err = self.client.exec_command(cmd, timeout=60)
        if stdin:
            chan_in.write(stdin)
        chan_in.channel.shutdown_write()
        out = chan_out.read().decode("utf-8", "replace")
        err = chan_err.read().decode("utf-8", "replace")
        rc = chan_out.channel.recv_exit_status()
        return CmdResult(rc, out, err)

    def close(self) -> None:
        self.client.close()


class _AcceptNew:
    """paramiko policy for StrictHostKeyChecking=accept-new: trust a first-seen key and record it."""

    def __init__(self, known_hosts: str | None, paramiko):
        self.known_hosts = known_hosts
        self.paramiko = paramiko

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts and self.known_hosts != "/dev/null":
            with open(self.known_hosts, "a", encoding="ascii") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
