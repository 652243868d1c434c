"""Users, API tokens, tickets, CSRF tokens and privilege checks, modelled on PVE's access control.

Principals: ``root@pam`` (password; with a ticket it is the one user that bypasses every check), the users
and API tokens of the lab's access state (labsim.pve_access: roles, users, tokens and ACLs made through
``/access`` or the node's ``pveum``; a new lab has the project's user ``gpulab@pve`` with its token
``gpulab@pve!ansible``), with privilege separation on a token's privileges are the intersection of its
user's and its own ACLs; and any extra tokens a fixture's ``access.tokens`` list adds (``{userid, tokenid,
privs, privsep, secret?}``) for tests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

TICKET_LIFETIME_S = 2 * 3600

# What the project's token needs, and nothing more (no Sys.Modify: download-url takes Sys.AccessNetwork).
PROJECT_PRIVS = frozenset(
    {
        "VM.Allocate",
        "VM.Audit",
        "VM.Backup",
        "VM.Config.CDROM",
        "VM.Config.CPU",
        "VM.Config.Cloudinit",
        "VM.Config.Disk",
        "VM.Config.HWType",
        "VM.Config.Memory",
        "VM.Config.Network",
        "VM.Config.Options",
        "VM.GuestAgent.Audit",
        "VM.GuestAgent.FileRead",
        "VM.PowerMgmt",
        "Datastore.AllocateSpace",
        "Datastore.AllocateTemplate",
        "Datastore.Audit",
        "Sys.AccessNetwork",
        "Sys.Audit",
        "SDN.Use",
        "Mapping.Audit",
        "Mapping.Modify",
        "Mapping.Use",
    }
)

# Every privilege PVE 9 knows (the names the schema's permission entries use; root@pam holds them all).
ALL_PRIVS = PROJECT_PRIVS | {
    "VM.Clone",
    "VM.Console",
    "VM.GuestAgent.FileSystemMgmt",
    "VM.GuestAgent.FileWrite",
    "VM.GuestAgent.Unrestricted",
    "VM.Migrate",
    "VM.Replicate",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
    "Datastore.Allocate",
    "Sys.Console",
    "Sys.Incoming",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "Sys.Syslog",
    "SDN.Allocate",
    "SDN.Audit",
    "Pool.Allocate",
    "Pool.Audit",
    "Permissions.Modify",
    "Realm.Allocate",
    "Realm.AllocateUser",
    "Group.Allocate",
    "User.Modify",
}

TOKEN_HEADER_RE = re.compile(r"(?:^|\s)PVEAPIToken(?:=| )([^;]*)")
TOKEN_ID_RE = re.compile(r"^[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+![A-Za-z][A-Za-z0-9.\-_]+$")


class AuthError(Exception):
    """HTTP 401."""


class PermissionDenied(Exception):
    """HTTP 403 "Permission check failed (<what>)"."""

    def __init__(self, what: str):
        super().__init__(f"Permission check failed ({what})")


@dataclass
class Principal:
    """Who a request runs as."""

    userid: str  # user@realm, or user@realm!token for API tokens
    via: str  # "ticket" or "token"
    privs_by_acl: list[tuple[str, frozenset[str]]] = field(default_factory=list)

    @property
    def is_root_ticket(self) -> bool:
        """The one identity PVE's root@pam rules let through: root@pam logged in with a password."""
        return self.userid == "root@pam" and self.via == "ticket"

    @property
    def user(self) -> str:
        return self.userid.split("!", 1)[0]

    def privs(self, path: str) -> frozenset[str]:
        """Privileges on `path`: the union of propagating ACL entries on `path` and its parents."""
        if self.user == "root@pam" and not self.privs_by_acl:
            return ALL_PRIVS
        found: set[str] = set()
        for acl_path, privs in self.privs_by_acl:
            if acl_path == "/" or path == acl_path or path.startswith(acl_path.rstrip("/") + "/"):
                found |= privs
        return frozenset(found)

    def has(self, path: str, privs: list[str], any_of: bool = False) -> bool:
        mine = self.privs(path)
        return any(p in mine for p in privs) if any_of else all(p in mine for p in privs)

    def require(self, path: str, privs: list[str], any_of: bool = False) -> None:
        """Raise PermissionDenied naming the path and the missing privilege(s), as PVE does."""
        if self.has(path, privs, any_of):
            return
        if any_of:
            raise PermissionDenied(f"{path}, {'|'.join(privs)}")
        missing = next(p for p in privs if p not in self.privs(path))
        raise PermissionDenied(f"{path}, {missing}")


def new_credentials() -> dict[str, Any]:
    """Fresh secrets for a new lab state."""
    return {
        "root_password": secrets.token_urlsafe(12),
        "token_user": "gpulab@pve",
        "token_name": "ansible",
        "token_secret": str(uuid.uuid4()),
        "ticket_key": secrets.token_hex(32),
    }


class Access:
    """Authenticates requests and builds their Principal."""

    def __init__(
        self, credentials: dict[str, Any], extra_tokens: list[dict] | None = None, store: Any = None
    ):
        self.creds = credentials
        # the lab's access state (labsim.pve_access.AccessHandlers.token_record): read at every request
        self.store = store
        self.tokens: dict[str, dict[str, Any]] = {}
        for tok in extra_tokens or []:
            tokid = f"{tok['userid']}!{tok['tokenid']}"
            acl = [(str(tok.get("path", "/")), frozenset(tok.get("privs") or ()))]
            user_acl = [("/", ALL_PRIVS)] if tok["userid"] == "root@pam" else acl
            self.tokens[tokid] = {
                "secret": str(tok.get("secret") or uuid.uuid5(uuid.NAMESPACE_URL, tokid)),
                "user_acl": user_acl,
                "token_acl": acl,
                "privsep": bool(tok.get("privsep", True)),
            }

    # --------------------------------------------------------------------------- tickets
    def _sign(self, text: str) -> str:
        mac = hmac.new(bytes.fromhex(self.creds["ticket_key"]), text.encode(), hashlib.sha256).digest()
        return base64.b64encode(mac).decode().rstrip("=")

    def login(self, username: str, password: str, realm: str | None = None) -> dict[str, Any]:
        """POST /access/ticket: check the password (or a still valid ticket) and issue a new ticket."""
        userid = username if "@" in username else f"{username}@{realm or 'pam'}"
        ok = userid == "root@pam" and hmac.compare_digest(password, self.creds["root_password"])
        if not ok and password.startswith("PVE:"):
            ok = self.check_ticket(password) == userid
        if not ok:
            raise AuthError("authentication failure")
        stamp = f"{int(time.time()):08X}"
        plain = f"PVE:{userid}:{stamp}"
        return {
            "username": userid,
            "ticket": f"{plain}::{self._sign(plain)}",
            "CSRFPreventionToken": f"{stamp}:{self._sign('csrf:' + userid + ':' + stamp)}",
            "cap": {},
            "clustername": None,
        }

    def check_ticket(self, ticket: str) -> str | None:
        """The user a valid, unexpired ticket belongs to, or None."""
        m = re.match(r"^(PVE:([^:]+):([0-9A-F]{8}))::(.+)$", ticket)
        if not m or not hmac.compare_digest(self._sign(m.group(1)), m.group(4)):
            return None
        if time.time() - int(m.group(3), 16) > TICKET_LIFETIME_S:
            return None
        return m.group(2)

    def check_csrf(self, userid: str, token: str | None) -> bool:
        if not token or ":" not in token:
            return False
        stamp, sig = token.split(":", 1)
        if not re.fullmatch(r"[0-9A-F]{8}", stamp):
            return False
        if time.time() - int(stamp, 16) > TICKET_LIFETIME_S:
            return False
        return hmac.compare_digest(self._sign("csrf:" + userid + ":" + stamp), sig)

    # --------------------------------------------------------------------------- requests
    def authenticate(self, headers: Any, method: str) -> Principal:
        """Build the Principal for a request from its headers; raise AuthError (401) otherwise."""
        authz = headers.get("Authorization") or ""
        m = TOKEN_HEADER_RE.search(authz)
        if m:
            return self._token(m.group(1).strip())
        ticket = None
        cookie = headers.get("Cookie") or ""
        cm = re.search(r"(?:^|;\s*)PVEAuthCookie=([^;]+)", cookie)
        if cm:
            from urllib.parse import unquote

            ticket = unquote(cm.group(1))
        am = re.search(r"(?:^|\s)PVEAuthCookie=([^;\s]+)", authz)
        if ticket is None and am:
            ticket = am.group(1)
        if ticket is None:
            raise AuthError("No ticket")
        userid = self.check_ticket(ticket)
        if userid is None:
            raise AuthError("authentication failure")
        if method != "GET" and not self.check_csrf(userid, headers.get("CSRFPreventionToken")):
            raise AuthError("Permission denied - invalid csrf token")
        return Principal(userid=userid, via="ticket")

    def _token(self, value: str) -> Principal:
        if "=" not in value:
            raise AuthError("authentication failure")
        tokid, secret = value.rsplit("=", 1)
        if not TOKEN_ID_RE.match(tokid):
            raise AuthError("authentication failure")
        tok = self.tokens.get(tokid)
        if tok is None and self.store is not None:
            tok = self.store.token_record(tokid)
        if tok is None or not hmac.compare_digest(tok["secret"], secret):
            raise AuthError("authentication failure")
        acl = _intersect(tok["user_acl"], tok["token_acl"]) if tok["privsep"] else tok["user_acl"]
        return Principal(userid=tokid, via="token", privs_by_acl=acl)


def _intersect(a: list[tuple[str, frozenset[str]]], b: list[tuple[str, frozenset[str]]]):
    """Privilege separation: a token holds a privilege on a path only when user and token both do."""
    paths = {p for p, _ in a} | {p for p, _ in b}
    probe_a = Principal("x@pve", "token", a)
    probe_b = Principal("x@pve", "token", b)
    return [(p, probe_a.privs(p) & probe_b.privs(p)) for p in sorted(paths)]
