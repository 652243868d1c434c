"""The SSH side of `gpulab discover`: one paramiko session to the node, commands run one at a time.

Host key checking is on: the node's key must be in ``~/.ssh/known_hosts`` (or the file given with
``--known-hosts``). An unknown key stops the run with the key's fingerprint and how to add it; a changed
key stops it too. The login is the user's own: ``-i KEY``, else the SSH agent and ``~/.ssh/id_*``.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import paramiko

TIMEOUT_S = 15
COMMAND_TIMEOUT_S = 120


class SshError(Exception):
    """The node could not be reached or logged in to; the message says why and what to do."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a host key (what `ssh-keygen -lf` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _Refuse(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise SshError(
            f"the host key of {hostname} ({key.get_name()} {fingerprint(key)}) is not in known_hosts, so gpulab "
            "does not trust it. Fix: compare that fingerprint with what the node's console shows for "
            "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` (the node's shell in the web UI), then add it: "
            f"`ssh {hostname}` once and answer yes, or `ssh-keyscan {hostname} >> ~/.ssh/known_hosts` "
            "(or pass --known-hosts FILE)"
        )


def split_target(target: str) -> tuple[str, str]:
    """`user@host` -> (user, host); a bare host is root's."""
    user, sep, host = target.rpartition("@")
    if not sep:
        return "root", target
    if not user or not host:
        raise SshError(f"{target!r} is not USER@HOST. Fix: write it like root@192.168.100.5")
    return user, host


class Session:
    """An SSH connection whose `run(command)` returns (exit code, stdout, stderr)."""

    def __init__(
        self, target: str, port: int = 22, key_file: str | None = None, known_hosts: str | None = None
    ) -> None:
        self.user, self.host = split_target(target)
        if key_file and not Path(key_file).is_file():
            raise SshError(
                f"no SSH key at {key_file} (-i). Fix: give the private key that logs in to the node"
            )
        self.client = paramiko.SSHClient()
        try:
            self.client.load_system_host_keys()
            if known_hosts:
                self.client.load_host_keys(known_hosts)
        except OSError as exc:
            raise SshError(
                f"cannot read known_hosts {known_hosts}: {exc}. Fix: give a readable file"
            ) from exc
        self.client.set_missing_host_key_policy(_Refuse())
        try:
            self.client.connect(
                self.host,
                port=port,
                username=self.user,
                key_filename=key_file,
                timeout=TIMEOUT_S,
                banner_timeout=TIMEOUT_S,
                auth_timeout=TIMEOUT_S,
                look_for_keys=key_file is None,
                allow_agent=key_file is None,
            )
        except SshError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise SshError(
                f"the host key of {self.host} is not the one known_hosts holds ({exc.key.get_name()} "
                f"{fingerprint(exc.key)} now): the node was reinstalled, or something else answers there. Fix: "
                f"check the key on the node's console, then `ssh-keygen -R {self.host}` and add it again"
            ) from exc
        except paramiko.AuthenticationException as exc:
            how = f"the key {key_file}" if key_file else "your SSH agent and ~/.ssh/id_* keys"
            raise SshError(
                f"{self.user}@{self.host} refused {how} ({exc}). Fix: `ssh-copy-id {self.user}@{self.host}`, "
                "or give the key that logs in with -i KEY"
            ) from exc
        except (OSError, paramiko.SSHException) as exc:
            raise SshError(
                f"cannot reach {self.host} port {port} over SSH ({exc}). Fix: check the address, that the node "
                "is up and that sshd listens there (`ssh -p PORT USER@HOST` from this machine)"
            ) from exc

    def run(self, command: str) -> tuple[int, str, str]:
        _, stdout, stderr = self.client.exec_command(command, timeout=COMMAND_TIMEOUT_S)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def close(self) -> None:
        self.client.close()


def public_key_of(key_file: str | None) -> str | None:
    """The public half of the login key (KEY.pub beside -i KEY, else ~/.ssh/id_ed25519.pub or id_rsa.pub)."""
    candidates = (
        [Path(key_file + ".pub")]
        if key_file
        else [Path.home() / ".ssh" / n for n in ("id_ed25519.pub", "id_rsa.pub")]
    )
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.startswith(("ssh-", "ecdsa-")):
            return text
    return None
