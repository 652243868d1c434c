#!/usr/bin/python3
"""The lab node's ``pvesh``, ``pveum`` and ``pvenode``: real PVE's command-line tools, answered by the lab's API.

Installed into the node host as ``/usr/local/lib/gpulab/pve_tools.py`` with one wrapper per command
(``/usr/sbin/pvesh`` runs ``pve_tools.py pvesh "$@"``). Standard library only (it runs with the host's
``/usr/bin/python3``).

On a real node these tools run the API's own code in-process as root@pam. Here they send the same call to
the lab's PVE API simulator, the one the HTTPS API serves, through the Unix socket the server keeps for
the node (``/var/lib/gpulab-sim/api/api.sock``, bound into the node from ``STATE/node-api``), logged in as
root@pam with the credential the server wrote beside it (``root.json``, mode 0600). So what they change
(a role, a user, a token, an ACL) is what the HTTPS API then enforces, and what ``pvesh get`` prints is what
``GET /api2/json<path>`` returns for root@pam.

* ``pvesh get|create|set|delete PATH [-key value ...] [--output-format text|json|json-pretty]``
  (``ls`` and ``usage`` are not stood in);
* ``pveum role add|modify|delete|list``, ``pveum user add|modify|delete|list``,
  ``pveum user token add|modify|remove|list``, ``pveum acl modify|delete|list`` (and the old aliases
  ``roleadd``, ``useradd``, ``aclmod`` ...);
* ``pvenode cert info``.

Errors are printed the way the real tools print them (the API's message, then each parameter's error) and
end with exit code 255, as a Perl ``die`` in PVE's CLI handler does.
"""

import http.client
import json
import os
import socket
import sys

NODE_API = "/var/lib/gpulab-sim/api"
# another folder for the socket and the credential (the tests run these tools beside an in-process lab)
NODE_API_ENV = "GPULAB_NODE_API"
FORMATS = ("text", "json", "json-pretty")


class CliError(Exception):
    """A refusal printed on stderr, exit code 255."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=120)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _encode(params):
    from urllib.parse import urlencode

    return urlencode([(k, x) for k, v in params.items() for x in (v if isinstance(v, list) else [v])])


class Api:
    """root@pam's session with the lab's API through the node's socket."""

    def __init__(self):
        folder = os.environ.get(NODE_API_ENV) or NODE_API
        self.sock = os.path.join(folder, "api.sock")
        try:
            with open(os.path.join(folder, "root.json")) as f:
                cred = json.load(f)
        except (OSError, ValueError) as exc:
            raise CliError(f"ipcc_send_rec[1] failed: Connection refused ({exc})") from exc
        login = self._send("POST", "/access/ticket", cred, {})
        self.headers = {
            "Cookie": f"PVEAuthCookie={login['ticket']}",
            "CSRFPreventionToken": login["CSRFPreventionToken"],
        }

    def _send(self, method, path, params, headers):
        conn = _UnixConnection(self.sock)
        body = None
        url = "/api2/json" + path
        headers = dict(headers)
        if method in ("GET", "DELETE"):
            if params:
                url += "?" + _encode(params)
        else:
            body = _encode(params)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            conn.request(method, url, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:
            raise CliError(f"ipcc_send_rec[1] failed: Connection refused ({exc})") from exc
        finally:
            conn.close()
        try:
            payload = json.loads(raw or b"{}")
        except ValueError:
            payload = {}
        if resp.status != 200:
            message = (payload.get("message") or resp.reason or "").rstrip("\n")
            lines = [message] + [
                f"{k}: {str(v).rstrip()}" for k, v in sorted((payload.get("errors") or {}).items())
            ]
            raise CliError("\n".join(lines))
        return payload.get("data")

    def call(self, method, path, params=None):
        return self._send(
            method, "/" + path.strip("/") if path.strip("/") else "/", params or {}, self.headers
        )


# --- arguments ------------------------------------------------------------------------------------------


def parse_options(argv, positional_names=()):
    """``-key value`` / ``--key value`` / ``--key=value`` pairs (repeated keys make a list) and positionals."""
    opts, pos = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and len(a) > 1 and not _is_number(a):
            key = a.lstrip("-")
            if "=" in key:
                key, value = key.split("=", 1)
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise CliError(f"400 unable to parse option\n{key}: missing value")
            if key in opts:
                opts[key] = (opts[key] if isinstance(opts[key], list) else [opts[key]]) + [value]
            else:
                opts[key] = value
        else:
            pos.append(a)
        i += 1
    return opts, pos


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def take_format(opts):
    fmt = opts.pop("output-format", "text")
    for flag in ("noborder", "noheader", "human-readable", "quiet"):
        opts.pop(flag, None)
    if fmt not in FORMATS:
        raise CliError(
            f"400 Parameter verification failed.\noutput-format: value '{fmt}' does not have a value in the "
            f"enumeration '{', '.join(FORMATS)}'"
        )
    return fmt


# --- output ---------------------------------------------------------------------------------------------


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def table(rows, columns):
    """A table as PVE's CLI formatter draws it (UTF-8 borders, a double line under the header)."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(left, mid, right, fill):
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def row(values):
        return "│" + "│".join(f" {v:<{w}} " for v, w in zip(values, widths, strict=True)) + "│"

    out = [line("┌", "┬", "┐", "─"), row(columns), line("╞", "╪", "╡", "═")]
    for n, values in enumerate(cells):
        if n:
            out.append(line("├", "┼", "┤", "─"))
        out.append(row(values))
    out.append(line("└", "┴", "┘", "─"))
    return "\n".join(out)


def show(data, fmt, columns=None):
    """Print `data` in the asked format: JSON as the API's `data`, or text (scalars plain, lists and
    objects as tables)."""
    if fmt == "json":
        print(json.dumps(data, sort_keys=True, separators=(",", ":")))
        return
    if fmt == "json-pretty":
        print(json.dumps(data, sort_keys=True, indent=4))
        return
    if data is None:
        return
    if isinstance(data, list):
        if not data:
            return
        if all(isinstance(x, dict) for x in data):
            cols = columns or sorted({k for x in data for k in x})
            print(table(data, cols))
        else:
            for x in data:
                print(_cell(x))
        return
    if isinstance(data, dict):
        print(table([{"key": k, "value": v} for k, v in sorted(data.items())], ["key", "value"]))
        return
    print(_cell(data))


# --- pvesh ----------------------------------------------------------------------------------------------

PVESH_METHODS = {"get": "GET", "create": "POST", "set": "PUT", "delete": "DELETE"}


def cmd_pvesh(argv):
    if not argv or argv[0] not in PVESH_METHODS:
        raise CliError(
            "USAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n"
            "       pvesh create <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"
            "       pvesh delete <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"
            "       pvesh get <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"
            "       pvesh set <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"
            "(the gpulab lab's pvesh has no 'ls' and 'usage')"
        )
    opts, pos = parse_options(argv[1:])
    fmt = take_format(opts)
    if len(pos) != 1:
        raise CliError("400 wrong number of arguments\napi_path: property is missing and it is not optional")
    show(Api().call(PVESH_METHODS[argv[0]], pos[0], opts), fmt)
    return 0


# --- pveum ----------------------------------------------------------------------------------------------

ALIASES = {
    "roleadd": ["role", "add"],
    "rolemod": ["role", "modify"],
    "roledel": ["role", "delete"],
    "useradd": ["user", "add"],
    "usermod": ["user", "modify"],
    "userdel": ["user", "delete"],
    "aclmod": ["acl", "modify"],
    "acldel": ["acl", "delete"],
}


def _need(pos, names):
    if len(pos) < len(names):
        missing = names[len(pos)]
        raise CliError(f"400 not enough arguments\n{missing}: property is missing and it is not optional")
    if len(pos) > len(names):
        raise CliError(f"400 too many arguments\nunexpected argument '{pos[len(names)]}'")
    return pos


def pveum_role(api, sub, opts, pos, fmt):
    if sub == "list":
        _need(pos, [])
        return show(api.call("GET", "/access/roles"), fmt, ["roleid", "privs", "special"])
    if sub == "add":
        (roleid,) = _need(pos, ["roleid"])
        return show(api.call("POST", "/access/roles", {"roleid": roleid, **opts}), fmt)
    if sub == "modify":
        (roleid,) = _need(pos, ["roleid"])
        return show(api.call("PUT", f"/access/roles/{roleid}", opts), fmt)
    if sub == "delete":
        (roleid,) = _need(pos, ["roleid"])
        return show(api.call("DELETE", f"/access/roles/{roleid}", opts), fmt)
    raise CliError(f"unknown command 'pveum role {sub}'")


def pveum_token(api, sub, opts, pos, fmt):
    if sub == "list":
        (userid,) = _need(pos, ["userid"])
        return show(
            api.call("GET", f"/access/users/{userid}/token"), fmt, ["tokenid", "comment", "expire", "privsep"]
        )
    userid, tokenid = _need(pos, ["userid", "tokenid"])
    path = f"/access/users/{userid}/token/{tokenid}"
    if sub == "add":
        return show(api.call("POST", path, opts), fmt)
    if sub == "modify":
        return show(api.call("PUT", path, opts), fmt)
    if sub == "remove":
        return show(api.call("DELETE", path, opts), fmt)
    raise CliError(f"unknown command 'pveum user token {sub}'")


def pveum_user(api, sub, opts, pos, fmt):
    if sub == "token":
        if not pos:
            raise CliError("unknown command 'pveum user token'")
        return pveum_token(api, pos[0], opts, pos[1:], fmt)
    if sub == "list":
        _need(pos, [])
        return show(
            api.call("GET", "/access/users", opts),
            fmt,
            [
                "userid",
                "comment",
                "email",
                "enable",
                "expire",
                "firstname",
                "groups",
                "keys",
                "lastname",
                "realm-type",
                "tfa-locked-until",
                "tokens",
            ],
        )
    (userid,) = _need(pos, ["userid"])
    if sub == "add":
        return show(api.call("POST", "/access/users", {"userid": userid, **opts}), fmt)
    if sub == "modify":
        return show(api.call("PUT", f"/access/users/{userid}", opts), fmt)
    if sub == "delete":
        return show(api.call("DELETE", f"/access/users/{userid}", opts), fmt)
    raise CliError(f"unknown command 'pveum user {sub}'")


def pveum_acl(api, sub, opts, pos, fmt):
    if sub == "list":
        _need(pos, [])
        return show(api.call("GET", "/access/acl"), fmt, ["path", "ugid", "type", "propagate", "roleid"])
    (path,) = _need(pos, ["path"])
    if sub == "modify":
        return show(api.call("PUT", "/access/acl", {"path": path, **opts}), fmt)
    if sub == "delete":
        return show(api.call("PUT", "/access/acl", {"path": path, "delete": 1, **opts}), fmt)
    raise CliError(f"unknown command 'pveum acl {sub}'")


PVEUM = {"role": pveum_role, "user": pveum_user, "acl": pveum_acl}


def cmd_pveum(argv):
    argv = ALIASES.get(argv[0], [argv[0]]) + argv[1:] if argv else []
    if len(argv) < 2 or argv[0] not in PVEUM:
        raise CliError(
            "USAGE: pveum <COMMAND> [ARGS] [OPTIONS]\n"
            "(the gpulab lab's pveum stands in for: role, user, user token, acl)"
        )
    opts, pos = parse_options(argv[2:])
    fmt = take_format(opts)
    PVEUM[argv[0]](Api(), argv[1], opts, pos, fmt)
    return 0


# --- pvenode --------------------------------------------------------------------------------------------


def _node_name():
    """The local node, as PVE's tools take it: the host name (tests beside an in-process lab set it)."""
    return os.environ.get("GPULAB_NODE_NAME") or socket.gethostname().split(".")[0]


def cmd_pvenode(argv):
    if argv[:2] != ["cert", "info"]:
        raise CliError(
            "USAGE: pvenode <COMMAND> [ARGS] [OPTIONS]\n(the gpulab lab's pvenode answers 'cert info' only)"
        )
    opts, pos = parse_options(argv[2:])
    fmt = take_format(opts)
    _need(pos, [])
    certs = Api().call("GET", f"/nodes/{_node_name()}/certificates/info")
    if fmt != "text":
        return show(certs, fmt) or 0
    for cert in certs or []:
        print(
            table([{"key": k, "value": v} for k, v in sorted(cert.items()) if k != "pem"], ["key", "value"])
        )
    return 0


COMMANDS = {"pvesh": cmd_pvesh, "pveum": cmd_pveum, "pvenode": cmd_pvenode}


def main(argv):
    cmd, args = argv[1], argv[2:]
    try:
        return COMMANDS[cmd](args) or 0
    except CliError as exc:
        print(str(exc), file=sys.stderr)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv))
