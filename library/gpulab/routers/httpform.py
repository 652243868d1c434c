"""http_form: describe an ISP router's web UI declaratively and drive it as a reservation backend.

Many ISP routers offer no API, only HTML pages and form posts. A *profile* (a plain mapping, so it
can come from YAML) tells this engine how to log in, how to see that a session expired, where the
reservation and lease tables are and how to read rows out of them (a regular expression, then
JS/HTML unescaping), and which form to post to add, change and delete an entry. Values in `url` and
`form` are Jinja2 templates over: user, password, csrf, every value extracted so far, and for
writes mac, ip, hostname, ref (the entry's handle from its row); filter `b64` base64-encodes.

Such pages answer 200 whether or not they did what was asked, so the engine judges success only by
re-reading: after each write the reservation table must show the change (the write's answer is the
re-rendered table page on most firmware; otherwise the table is loaded again). A page that matches
`logged_out_if` means the session expired: the engine logs in again once and repeats the request.
`close()` logs out, since many of these routers allow one admin session at a time.

Profile keys:
  name, cookies {name: value} (preset), login [step...], logged_out_if (regex), logout [step...],
  reservations {request, rows (regex with groups), fields (names of the groups: ref, ip, mac,
  hostname...), unescape (js|html|none), extract {var: regex}}, leases {same}, create, update,
  delete (steps), refresh_csrf (reload the reservation page before each write), max_reservations,
  supports_hostname, mac_format (lower-colon|upper-colon|lower-dash|upper-dash), refusals
  {regex: message} (firmware messages found in a write's answer, explained to the user).
A step is {method, url, form (mapping), extract {var: regex}, fail_if (regex)}.

What this cannot describe: logins computed in JavaScript (RSA/AES-encrypted or nonce-hashed
passwords), captchas, multi-page wizards. Such routers need a Python backend of their own.
"""

from __future__ import annotations

import base64
import html
import re

import jinja2.sandbox

from .backend import Backend
from .http import HttpClient
from .model import AuthError, Lease, LimitError, Reservation, RouterError, ip4, norm_mac

_JS = re.compile(r"\\x([0-9a-fA-F]{2})|\\u([0-9a-fA-F]{4})|\\(.)")


def js_unescape(text: str) -> str:
    def sub(m):
        if m.group(1):
            return chr(int(m.group(1), 16))
        if m.group(2):
            return chr(int(m.group(2), 16))
        return {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(3), m.group(3))

    return _JS.sub(sub, text)


UNESCAPE = {"js": js_unescape, "html": html.unescape, "none": lambda s: s}


def format_mac(mac: str, style: str) -> str:
    text = mac.replace(":", "-") if style.endswith("dash") else mac
    return text.upper() if style.startswith("upper") else text


class HttpFormBackend(Backend):
    kind = "http_form"

    def __init__(self, url: str, profile: dict, *, user=None, password=None, validate_certs=True, **kw):
        kw.setdefault("name", profile.get("name"))
        super().__init__(**kw)
        self.profile = profile
        self.max_reservations = profile.get("max_reservations")
        self.supports_hostname = bool(profile.get("supports_hostname", False))
        self.http = HttpClient(url, router=self.name, verify=validate_certs, secrets=[password])
        self.vars: dict = {"user": user or "", "password": password or ""}
        self.env = jinja2.sandbox.SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
        self.env.filters["b64"] = lambda s: base64.b64encode(str(s).encode()).decode()
        self.logged_in = False
        self._preset_cookies()

    # --- requests -----------------------------------------------------------------------------
    def _preset_cookies(self):
        for name, value in (self.profile.get("cookies") or {}).items():
            self.http.session.cookies.set(name, value)

    def _render(self, value, extra):
        return self.env.from_string(str(value)).render({**self.vars, **extra})

    def _send(self, step: dict, extra: dict, doing: str) -> str:
        url = self._render(step["url"], extra)
        form = {self._render(k, extra): self._render(v, extra) for k, v in (step.get("form") or {}).items()}
        method = step.get("method", "POST" if form else "GET")
        resp = self.http.request(method, url, data=form or None, doing=doing)
        resp.encoding = resp.encoding or "utf-8"
        text = resp.text.lstrip("\ufeff")
        for var, rx in (step.get("extract") or {}).items():
            m = re.search(rx, text)
            if not m:
                raise RouterError(
                    f"{doing}: the page did not show {var} (pattern {rx!r}); the profile does not fit this firmware"
                )
            self.vars[var] = m.group(1)
        return text

    def _expired(self, text: str) -> bool:
        rx = self.profile.get("logged_out_if")
        return bool(rx and re.search(rx, text))

    def login(self) -> None:
        steps = self.profile.get("login") or []
        text = ""
        for n, step in enumerate(steps):
            text = self._send(step, {}, f"logging in to {self.name} (step {n + 1})")
            fail = step.get("fail_if")
            if fail and re.search(fail, text):
                raise AuthError(self._login_failure(text))
        # the cookie the router set replaces a preset one of the same name
        preset = set(self.profile.get("cookies") or {})
        jar = self.http.session.cookies
        for c in list(jar):
            if c.name in preset and c.domain == "" and sum(1 for o in jar if o.name == c.name) > 1:
                jar.clear(c.domain, c.path, c.name)
        self.logged_in = True

    def _login_failure(self, text: str) -> str:
        lock = re.search(r"LockLeftTime\s*=\s*['\"]?(\d+)", text)
        extra = ""
        if lock and int(lock.group(1)) > 0:
            extra = f"; it refuses logins for another {lock.group(1)} s after repeated failures"
        return (
            f"{self.name} refused the login as {self.vars['user']!r}: wrong router_user/router_password, or "
            f"another admin session is open (these routers allow one: log out of the web page){extra}"
        )

    def page(self, step: dict, extra: dict, doing: str) -> str:
        """Send a step as a logged-in user; on an expired session log in once more and repeat it."""
        if not self.logged_in:
            self.login()
        text = self._send(step, extra, doing)
        if self._expired(text):
            self.logged_in = False
            self.login()
            if step.get("method", "GET") != "GET" and self.profile.get("refresh_csrf"):
                self._table()  # a write needs a token from the new session
            text = self._send(step, extra, doing)
            if self._expired(text):
                raise AuthError(f"{doing}: {self.name} shows its login page again right after a login")
        return text

    # --- tables -------------------------------------------------------------------------------
    def _rows(self, spec: dict, text: str) -> list[dict]:
        unescape = UNESCAPE[spec.get("unescape", "none")]
        for var, rx in (spec.get("extract") or {}).items():
            m = re.search(rx, text)
            if m:
                self.vars[var] = m.group(1)
        rows = []
        for m in re.finditer(spec["rows"], text):
            rows.append({f: unescape(v) for f, v in zip(spec["fields"], m.groups(), strict=False)})
        return rows

    def _table(self, text: str | None = None) -> list[Reservation]:
        spec = self.profile["reservations"]
        if text is None:
            text = self.page(spec["request"], {}, f"reading the reservation table of {self.name}")
        out = []
        for row in self._rows(spec, text):
            try:
                out.append(
                    Reservation(
                        norm_mac(row["mac"]), ip4(row["ip"]), row.get("hostname") or None, row.get("ref")
                    )
                )
            except ValueError:
                continue  # an empty or half-filled row of the page
        return out

    def list_reservations(self) -> list[Reservation]:
        return self._table()

    def list_leases(self) -> list[Lease]:
        spec = self.profile.get("leases")
        if not spec:
            return []
        text = self.page(spec["request"], {}, f"reading the DHCP clients of {self.name}")
        out = []
        for row in self._rows(spec, text):
            try:
                out.append(Lease(norm_mac(row["mac"]), ip4(row["ip"]), row.get("hostname") or None))
            except ValueError:
                continue
        return out

    # --- writes -------------------------------------------------------------------------------
    def _post(self, what: str, r: Reservation, ref: str | None, check) -> None:
        step = self.profile[what]
        if self.profile.get("refresh_csrf"):
            self._table()
        extra = {
            "mac": format_mac(r.mac, self.profile.get("mac_format", "lower-colon")),
            "ip": str(r.ip),
            "hostname": r.hostname or "",
            "ref": ref or "",
        }
        doing = f"{ {'create': 'adding', 'update': 'changing', 'delete': 'removing'}[what] } {r.line()} on {self.name}"
        text = self.page(step, extra, doing)
        table = self._table(text) if re.search(self.profile["reservations"]["rows"], text) else self._table()
        if not check(table):
            reason = ""
            for rx, message in (self.profile.get("refusals") or {}).items():
                if re.search(rx, text):
                    reason = message
            cls = LimitError if re.search(r"at most|more than|limit", reason) else RouterError
            raise cls(
                f"{doing}: the router did not take it (re-reading its table shows no change)"
                + (f": {reason}" if reason else "; check the entry on the router's page")
            )

    def _create(self, r: Reservation) -> None:
        self._post("create", r, None, lambda t: any(x.mac == r.mac and x.ip == r.ip for x in t))

    def _update(self, old: Reservation, new: Reservation) -> None:
        ref = next((x.ref for x in self._table() if x.mac == old.mac), old.ref)
        self._post("update", new, ref, lambda t: any(x.mac == new.mac and x.ip == new.ip for x in t))

    def _delete(self, old: Reservation) -> None:
        ref = next((x.ref for x in self._table() if x.mac == old.mac), old.ref)
        self._post("delete", old, ref, lambda t: not any(x.mac == old.mac for x in t))

    def close(self) -> None:
        if self.logged_in:
            for step in self.profile.get("logout") or []:
                try:
                    self._send(step, {}, f"logging out of {self.name}")
                except RouterError:
                    break
            self.logged_in = False
        self.http.close()
