"""The simulated PVE's users, API tokens, roles and ACLs (``/access/...``) and its certificate info.

The lab keeps them in its persistent state (``access`` of ``pve-state.json``), as PVE keeps ``user.cfg``
and ``priv/token.cfg``: ``roles`` (role -> privileges), ``users`` (user -> settings and ``tokens``, each with
its secret), ``acl`` (entries ``{path, type: user|token, ugid, roleid, propagate}``). A token's privileges
are read from there at every request (labsim.pve_auth.Access.store), so a role changed with ``pveum role
modify`` takes effect at the next call, as on PVE.

A new lab state is *bootstrapped* with the project's access, in the order README's pveum commands make
it: role ``gpulab``, user ``gpulab@pve``, token ``ansible`` (privilege separation), ACLs on ``/`` for the
user and the token. A lab with real hosts makes it with those very commands, run by ``gpulab lab up`` as
root on the node host over SSH (:func:`bootstrap_commands`, labsim.cli.bootstrap_on_node); an API-only lab
(no node host) gets it from the same handlers ``pveum`` calls, with the lab's secret. A fixture's ``access: {bootstrap: false}`` leaves a bare node (root@pam only), for the flow that
creates the access itself (playbooks/access.yml).

Messages follow PVE's (pve-access-control: ``role 'X' already exists``, ``no such user ('X')``, ...); they
come back as HTTP 500 as a ``die`` in PVE's API does, or 400 for a parameter.
"""

from __future__ import annotations

import datetime
import re
import uuid
from pathlib import Path
from typing import Any

from labsim.certs import CERT_FILE, certificate_info
from labsim.pve_auth import ALL_PRIVS, PROJECT_PRIVS
from labsim.pve_common import ApiError

BOOT_ROLE, BOOT_USER, BOOT_TOKEN = "gpulab", "gpulab@pve", "ansible"

# PVE's built-in roles (special: 1, cannot be changed), the ones a node lists first
AUDIT_PRIVS = frozenset(p for p in ALL_PRIVS if p.endswith(".Audit"))
BUILTIN_ROLES: dict[str, frozenset[str]] = {
    "Administrator": frozenset(ALL_PRIVS),
    "NoAccess": frozenset(),
    "PVEAuditor": AUDIT_PRIVS,
}
REALMS = ("pam", "pve")


def _error(status: int, message: str, errors: dict[str, str] | None = None) -> ApiError:
    return ApiError(status, message, errors)


def _privlist(text: Any) -> list[str]:
    items = text if isinstance(text, list) else [text]
    privs = [p for item in items for p in re.split(r"[,;\s]+", str(item or "")) if p]
    for p in privs:
        if p not in ALL_PRIVS:
            raise _error(400, "Parameter verification failed.", {"privs": f"invalid privilege '{p}'"})
    return sorted(set(privs))


def _list(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [x for item in items for x in re.split(r"[,;\s]+", str(item or "")) if x]


def wants_bootstrap(fixture: dict[str, Any]) -> bool:
    return bool((fixture.get("access") or {}).get("bootstrap", True))


def bootstrap_commands() -> str:
    """The shell script `gpulab lab up` runs as root on a lab's node host: README's pveum steps, made
    idempotent (a bootstrap cut short is finished by the next `lab up`); it prints the token as pveum's JSON."""
    token = f"{BOOT_USER}!{BOOT_TOKEN}"
    privs = ",".join(sorted(PROJECT_PRIVS))
    return "\n".join(
        [
            "set -e",
            f"pveum role add {BOOT_ROLE} --privs {privs} 2>/dev/null || pveum role modify {BOOT_ROLE} --privs {privs}",
            f"pvesh get /access/users/{BOOT_USER} >/dev/null 2>&1 || "
            f"pveum user add {BOOT_USER} --comment 'gpulab automation (API token only)'",
            f"pveum user token remove {BOOT_USER} {BOOT_TOKEN} >/dev/null 2>&1 || true",
            f"out=$(pveum user token add {BOOT_USER} {BOOT_TOKEN} --privsep 1 --output-format json)",
            f"pveum acl modify / --roles {BOOT_ROLE} --users {BOOT_USER}",
            f"pveum acl modify / --roles {BOOT_ROLE} --tokens '{token}'",
            'printf "%s\\n" "$out"',
        ]
    )


class AccessHandlers:
    """The /access endpoints of PveApiSim (mixed in; `self.state` is the lab's state, lock held)."""

    state: Any
    fixture: dict[str, Any]

    # --------------------------------------------------------------------------- state
    def access_data(self) -> dict[str, Any]:
        return self.state.data.setdefault("access", {"roles": {}, "users": {}, "acl": []})

    def bootstrap_access(self, creds: dict[str, Any], on_node: bool = False) -> None:
        """Give a new state the project's access (unless the fixture asks for a bare node); once.

        With ``on_node`` (a lab with real hosts) nothing is made here: `gpulab lab up` makes it once the
        node host is up, with the node's pveum over SSH (:func:`bootstrap_commands`), as a user would."""
        with self.lock:
            if "access" in self.state.data:
                return
            self.access_data()
            if (self.fixture.get("access") or {}).get("bootstrap", True) and not on_node:
                self.h_post_access_roles(
                    {"roleid": BOOT_ROLE, "privs": ",".join(sorted(PROJECT_PRIVS))}, None
                )
                self.h_post_access_users(
                    {"userid": BOOT_USER, "comment": "gpulab automation (API token only)"}, None
                )
                self._add_token(BOOT_USER, BOOT_TOKEN, {"privsep": 1}, secret=creds["token_secret"])
                self.h_put_access_acl({"path": "/", "roles": BOOT_ROLE, "users": BOOT_USER}, None)
                self.h_put_access_acl(
                    {"path": "/", "roles": BOOT_ROLE, "tokens": f"{BOOT_USER}!{BOOT_TOKEN}"}, None
                )
            self.state.mark()

    def role_privs(self, roleid: str) -> frozenset[str]:
        if roleid in BUILTIN_ROLES:
            return BUILTIN_ROLES[roleid]
        return frozenset(self.access_data()["roles"].get(roleid) or ())

    def acl_of(self, kind: str, ugid: str) -> list[tuple[str, frozenset[str]]]:
        """The (path, privileges) entries the ACL gives a user or a token."""
        out: dict[str, set[str]] = {}
        for e in self.access_data()["acl"]:
            if e["type"] == kind and e["ugid"] == ugid:
                out.setdefault(e["path"], set()).update(self.role_privs(e["roleid"]))
        return [(p, frozenset(v)) for p, v in sorted(out.items())]

    def token_record(self, tokid: str) -> dict[str, Any] | None:
        """For labsim.pve_auth.Access: the token `user@realm!name`, its secret and its ACLs, or None."""
        with self.lock:
            userid, _, name = tokid.partition("!")
            user = self.access_data()["users"].get(userid)
            tok = (user or {}).get("tokens", {}).get(name)
            if user is None or tok is None or not user.get("enable", 1):
                return None
            expire = int(tok.get("expire") or 0)
            if expire and expire < datetime.datetime.now(datetime.UTC).timestamp():
                return None
            user_acl = [("/", ALL_PRIVS)] if userid == "root@pam" else self.acl_of("user", userid)
            return {
                "secret": tok["secret"],
                "user_acl": user_acl,
                "token_acl": self.acl_of("token", tokid),
                "privsep": bool(tok.get("privsep", 1)),
            }

    def _user(self, userid: str) -> dict[str, Any]:
        if userid == "root@pam":
            return self.access_data()["users"].setdefault(
                "root@pam", {"enable": 1, "expire": 0, "tokens": {}}
            )
        user = self.access_data()["users"].get(userid)
        if user is None:
            raise _error(500, f"no such user ('{userid}')")
        return user

    def h_get_access_ticket(self, args, who):
        """GET /access/ticket: PVE's answer is empty (the login is the POST, which the server answers)."""
        return None

    # --------------------------------------------------------------------------- roles
    def h_get_access_roles(self, args, who):
        out = [{"roleid": r, "privs": ",".join(sorted(p)), "special": 1} for r, p in BUILTIN_ROLES.items()]
        out += [
            {"roleid": r, "privs": ",".join(sorted(p)), "special": 0}
            for r, p in sorted(self.access_data()["roles"].items())
        ]
        return out

    def h_post_access_roles(self, args, who):
        roleid = args["roleid"]
        if roleid in BUILTIN_ROLES or roleid in self.access_data()["roles"]:
            raise _error(500, f"role '{roleid}' already exists")
        self.access_data()["roles"][roleid] = _privlist(args.get("privs"))
        self.state.mark()
        return None

    def _own_role(self, roleid: str) -> list[str]:
        if roleid in BUILTIN_ROLES:
            raise _error(500, f"cannot modify predefined role '{roleid}'")
        if roleid not in self.access_data()["roles"]:
            raise _error(500, f"role '{roleid}' does not exist")
        return self.access_data()["roles"][roleid]

    def h_get_access_roles_roleid(self, args, who):
        roleid = args["roleid"]
        if roleid not in BUILTIN_ROLES and roleid not in self.access_data()["roles"]:
            raise _error(500, f"role '{roleid}' does not exist")
        return {p: 1 for p in sorted(self.role_privs(roleid))}

    def h_put_access_roles_roleid(self, args, who):
        roleid = args["roleid"]
        current = self._own_role(roleid)
        privs = _privlist(args.get("privs"))
        self.access_data()["roles"][roleid] = (
            sorted(set(current) | set(privs)) if args.get("append") else privs
        )
        self.state.mark()
        return None

    def h_delete_access_roles_roleid(self, args, who):
        roleid = args["roleid"]
        self._own_role(roleid)
        del self.access_data()["roles"][roleid]
        self.access_data()["acl"] = [e for e in self.access_data()["acl"] if e["roleid"] != roleid]
        self.state.mark()
        return None

    # --------------------------------------------------------------------------- users
    def _user_entry(self, userid: str, user: dict[str, Any], full: bool) -> dict[str, Any]:
        entry = {
            "userid": userid,
            "enable": int(user.get("enable", 1)),
            "expire": int(user.get("expire", 0)),
            "realm-type": userid.rsplit("@", 1)[1],
        }
        for key in ("comment", "email", "firstname", "lastname"):
            if user.get(key):
                entry[key] = user[key]
        if full:
            entry["tokens"] = [self._token_entry(t, tok) for t, tok in sorted(user.get("tokens", {}).items())]
        return entry

    def h_get_access_users(self, args, who):
        self._user("root@pam")
        users = self.access_data()["users"]
        out = []
        for userid, user in sorted(users.items()):
            if args.get("enabled") and not user.get("enable", 1):
                continue
            visible = who is None or who.is_root_ticket or userid == who.user
            if not visible and who is not None:
                visible = who.has("/access/groups", ["User.Modify", "Sys.Audit"], any_of=True)
            if visible:
                out.append(self._user_entry(userid, user, bool(args.get("full"))))
        return out

    def h_post_access_users(self, args, who):
        userid = args["userid"]
        realm = userid.rsplit("@", 1)[-1]
        if realm not in REALMS:
            raise _error(500, f"create user failed: domain '{realm}' does not exist")
        users = self.access_data()["users"]
        if userid in users or userid == "root@pam":
            raise _error(500, f"create user failed: user '{userid}' already exists")
        users[userid] = {
            "enable": int(args.get("enable", 1)),
            "expire": int(args.get("expire", 0)),
            "tokens": {},
            **{k: args[k] for k in ("comment", "email", "firstname", "lastname") if args.get(k)},
        }
        self.state.mark()
        return None

    def h_get_access_users_userid(self, args, who):
        userid = args["userid"]
        user = self._user(userid)
        entry = self._user_entry(userid, user, False)
        entry.pop("userid")
        entry.pop("realm-type")
        entry["tokens"] = {
            t: self._token_entry(t, tok, False) for t, tok in sorted(user.get("tokens", {}).items())
        }
        return entry

    def h_put_access_users_userid(self, args, who):
        user = self._user(args["userid"])
        for key in ("comment", "email", "firstname", "lastname", "enable", "expire"):
            if key in args:
                user[key] = args[key]
        self.state.mark()
        return None

    def h_delete_access_users_userid(self, args, who):
        userid = args["userid"]
        self._user(userid)
        if userid == "root@pam":
            raise _error(500, "delete user failed: cannot delete the root@pam user")
        del self.access_data()["users"][userid]
        self.access_data()["acl"] = [
            e
            for e in self.access_data()["acl"]
            if not (e["ugid"] == userid or e["ugid"].startswith(userid + "!"))
        ]
        self.state.mark()
        return None

    # --------------------------------------------------------------------------- tokens
    @staticmethod
    def _token_entry(tokenid: str, tok: dict[str, Any], with_id: bool = True) -> dict[str, Any]:
        entry = {"privsep": int(tok.get("privsep", 1)), "expire": int(tok.get("expire", 0))}
        if tok.get("comment"):
            entry["comment"] = tok["comment"]
        return {"tokenid": tokenid, **entry} if with_id else entry

    def _add_token(self, userid: str, tokenid: str, args: dict, secret: str | None = None) -> dict[str, Any]:
        user = self._user(userid)
        if tokenid in user["tokens"]:
            raise _error(500, "Token already exists.")
        tok = {
            "privsep": int(args.get("privsep", 1)),
            "expire": int(args.get("expire", 0) or 0),
            "secret": secret or str(uuid.uuid4()),
        }
        if args.get("comment"):
            tok["comment"] = args["comment"]
        user["tokens"][tokenid] = tok
        self.state.mark()
        return tok

    def _token(self, userid: str, tokenid: str) -> dict[str, Any]:
        tok = self._user(userid)["tokens"].get(tokenid)
        if tok is None:
            raise _error(500, f"no such token '{tokenid}' for user '{userid}'")
        return tok

    def h_get_access_users_userid_token(self, args, who):
        user = self._user(args["userid"])
        return [self._token_entry(t, tok) for t, tok in sorted(user["tokens"].items())]

    def h_get_access_users_userid_token_tokenid(self, args, who):
        return self._token_entry(args["tokenid"], self._token(args["userid"], args["tokenid"]), False)

    def h_post_access_users_userid_token_tokenid(self, args, who):
        userid, tokenid = args["userid"], args["tokenid"]
        tok = self._add_token(userid, tokenid, args)
        info = {"privsep": str(tok["privsep"])}
        if tok["expire"]:
            info["expire"] = str(tok["expire"])
        if tok.get("comment"):
            info["comment"] = tok["comment"]
        return {"full-tokenid": f"{userid}!{tokenid}", "info": info, "value": tok["secret"]}

    def h_put_access_users_userid_token_tokenid(self, args, who):
        tok = self._token(args["userid"], args["tokenid"])
        for key in ("comment", "expire", "privsep"):
            if key in args:
                tok[key] = args[key]
        for key in _list(args.get("delete")):
            tok.pop(key, None)
        self.state.mark()
        return self._token_entry(args["tokenid"], tok, False)

    def h_delete_access_users_userid_token_tokenid(self, args, who):
        userid, tokenid = args["userid"], args["tokenid"]
        self._token(userid, tokenid)
        del self._user(userid)["tokens"][tokenid]
        full = f"{userid}!{tokenid}"
        self.access_data()["acl"] = [e for e in self.access_data()["acl"] if e["ugid"] != full]
        self.state.mark()
        return None

    # --------------------------------------------------------------------------- ACL
    def h_get_access_acl(self, args, who):
        out = []
        for e in sorted(
            self.access_data()["acl"], key=lambda e: (e["path"], e["type"], e["ugid"], e["roleid"])
        ):
            if who is None or who.is_root_ticket or who.has(e["path"], ["Permissions.Modify"]):
                out.append({k: e[k] for k in ("path", "type", "ugid", "roleid", "propagate")})
        return out

    def h_put_access_acl(self, args, who):
        path = "/" + str(args["path"]).strip("/") if str(args["path"]).strip("/") else "/"
        roles = _list(args.get("roles"))
        if not roles:
            raise _error(
                400, "Parameter verification failed.", {"roles": "property is missing and it is not optional"}
            )
        for roleid in roles:
            if roleid not in BUILTIN_ROLES and roleid not in self.access_data()["roles"]:
                raise _error(500, f"role '{roleid}' does not exist")
        targets = [("user", u) for u in _list(args.get("users"))] + [
            ("token", t) for t in _list(args.get("tokens"))
        ]
        if _list(args.get("groups")):
            raise _error(500, f"group '{_list(args.get('groups'))[0]}' does not exist")
        for kind, ugid in targets:
            if kind == "user":
                if ugid != "root@pam" and ugid not in self.access_data()["users"]:
                    raise _error(500, f"user '{ugid}' does not exist")
            else:
                userid, _, name = ugid.partition("!")
                if name not in (self.access_data()["users"].get(userid) or {}).get("tokens", {}):
                    raise _error(500, f"no such token '{name}' for user '{userid}'")
        acl = self.access_data()["acl"]
        propagate = int(args.get("propagate", 1))
        for kind, ugid in targets:
            for roleid in roles:
                acl[:] = [
                    e
                    for e in acl
                    if not (
                        e["path"] == path
                        and e["type"] == kind
                        and e["ugid"] == ugid
                        and e["roleid"] == roleid
                    )
                ]
                if not args.get("delete"):
                    acl.append(
                        {"path": path, "type": kind, "ugid": ugid, "roleid": roleid, "propagate": propagate}
                    )
        self.state.mark()
        return None

    # --------------------------------------------------------------------------- certificate
    def h_get_nodes_node_certificates_info(self, args, who):
        return [certificate_info(Path(self.state_dir) / CERT_FILE)]
