"""A Proxmox VE API client on proxmoxer, with what the modules need around it.

proxmoxer builds the resource paths (`api.nodes(node).qemu(vmid).config.get()`) and reads the JSON
envelope. This module supplies the session it runs on:
  * API-token or root@pam-ticket auth (the ticket call goes through the same session, so TLS pinning
    applies to it too; proxmoxer's own password auth posts outside the session);
  * TLS verification on by default, against the system store, a CA file, or a pinned SHA-256 certificate
    fingerprint (an adapter on the session: urllib3 checks the peer certificate's digest);
  * bounded retries with backoff for 5xx answers and connection resets, then an error naming the call;
  * errors that carry PVE's own message: 401 says to check the credentials, 403 names the privilege PVE
    reported missing;
  * a count of read and write requests (the modules report it; the tests assert on it);
  * waiting for UPID tasks, with an optional progress callback.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from proxmoxer.backends.https import JsonSerializer, ProxmoxHttpSession
from proxmoxer.core import ProxmoxResource
from requests.adapters import HTTPAdapter

from gpulab.constants import PVE_FINGERPRINT_RE, PVE_TOKEN_ID_RE
from gpulab.tls import certificate_rejected

RETRY_STATUS = frozenset({500, 502, 503, 504, 595, 596, 597, 599})
# PVE answers 500 for these too, but they will not change by asking again.
_DETERMINISTIC = re.compile(r"does not exist|already exists|no such|not a valid|refusing|mismatch", re.I)


class PveError(Exception):
    """Any failure talking to PVE. `call` names the request ("POST /nodes/pve/qemu")."""

    def __init__(self, message: str, call: str = "", status: int | None = None, errors: Any = None):
        self.message = message
        self.call = call
        self.status = status
        self.errors = errors
        text = f"{call}: {message}" if call else message
        if errors:
            text += f" ({json.dumps(errors, sort_keys=True)})"
        super().__init__(text)


class PveAuthError(PveError):
    """401: the credentials were refused."""


class PvePermissionError(PveError):
    """403: the user lacks a privilege; PVE's message names it."""


class PveConnectionError(PveError):
    """The API could not be reached (after retries), or TLS verification failed."""


class PveTaskError(PveError):
    """A UPID task ended in error. `log` holds its last lines."""

    def __init__(self, message: str, call: str = "", upid: str = "", log: list[str] | None = None):
        super().__init__(message, call)
        self.upid = upid
        self.log = log or []


def raw_pci_login(token_id: str | None, user: str | None) -> bool:
    """PVE attaches a raw PCI address only for root@pam with a password, never for a token."""
    return not token_id and user == "root@pam"


@dataclass
class PveConnection:
    """How to reach and authenticate to one PVE API."""

    api_url: str
    token_id: str | None = None
    token_secret: str | None = None
    user: str | None = None
    password: str | None = None
    validate_certs: bool = True
    ca_file: str | None = None
    fingerprint: str | None = None
    timeout: float = 30.0
    retries: int = 3
    backoff: float = 0.5

    def check(self) -> None:
        """Raise ValueError with the fix when the settings cannot work."""
        parts = urlsplit(self.api_url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"api_url {self.api_url!r} is not a URL like https://pve.example:8006")
        if self.token_id or self.token_secret:
            if not (self.token_id and self.token_secret):
                raise ValueError("an API token needs both api_token_id and api_token_secret")
            if not PVE_TOKEN_ID_RE.match(self.token_id):
                raise ValueError(
                    f"api_token_id {self.token_id!r} is not USER@REALM!TOKENID (e.g. root@pam!gpulab)"
                )
        elif not (self.user and self.password):
            raise ValueError("give api_token_id + api_token_secret, or api_user + api_password")
        if self.fingerprint and not PVE_FINGERPRINT_RE.match(self.fingerprint):
            raise ValueError(
                f"api_fingerprint {self.fingerprint!r} is not a SHA-256 fingerprint "
                "(32 hex bytes joined by colons, as PVE shows it under Node > Certificates)"
            )

    @property
    def base_url(self) -> str:
        url = self.api_url.rstrip("/")
        if url.endswith("/api2/json"):
            url = url[: -len("/api2/json")]
        return url + "/api2/json"

    @property
    def uses_token(self) -> bool:
        return bool(self.token_id)

    @property
    def may_attach_raw_pci(self) -> bool:
        return raw_pci_login(self.token_id, self.user)

    @property
    def userid(self) -> str:
        """The user PVE sees: `root@pam!tok` for a token (not root@pam: raw PCI devices are refused)."""
        return self.token_id if self.token_id else (self.user or "")


class FingerprintAdapter(HTTPAdapter):
    """Accept exactly the server certificate whose SHA-256 digest is pinned (chain checks are off)."""

    def __init__(self, fingerprint: str, **kwargs: Any):
        self._fingerprint = fingerprint.replace(":", "").lower()
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["assert_fingerprint"] = self._fingerprint
        super().init_poolmanager(*args, **kwargs)

    def proxy_manager_for(self, *args: Any, **kwargs: Any):
        kwargs["assert_fingerprint"] = self._fingerprint
        return super().proxy_manager_for(*args, **kwargs)


class _Auth(requests.auth.AuthBase):
    """Adds the token header, or the ticket cookie and CSRF token. proxmoxer reads verify/timeout here."""

    def __init__(self, verify: Any, timeout: float):
        self.verify_ssl = verify
        self.timeout = timeout
        self.header: str | None = None
        self.ticket: str | None = None
        self.csrf: str | None = None

    def get_cookies(self):
        return requests.cookies.cookiejar_from_dict({"PVEAuthCookie": self.ticket} if self.ticket else {})

    def __call__(self, req):
        if self.header:
            req.headers["Authorization"] = self.header
        if self.ticket and req.method != "GET" and self.csrf:
            req.headers["CSRFPreventionToken"] = self.csrf
        return req


def _encode(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """Form values as PVE wants them: booleans as 1/0 (the string 'true' fails), no None."""
    if not data:
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        out[key] = value
    return out


class _Session(ProxmoxHttpSession):
    """proxmoxer's session plus retries, PVE error messages and request accounting."""

    def __init__(self, client: PveClient):
        super().__init__()
        self._client = client

    def request(self, method, url, params=None, data=None, **kwargs):  # type: ignore[override]
        client = self._client
        path = url.split("/api2/json", 1)[-1]
        call = f"{method} {path}"
        conn = client.conn
        data = _encode(data)
        params = _encode(params)
        attempt = 0
        while True:
            attempt += 1
            client._count(method, path)
            try:
                resp = super().request(method, url, params=params, data=data, **kwargs)
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                # SSLError is a ConnectionError: a rejected certificate is a setting to fix, while a
                # connection that broke inside TLS (EOF without close_notify) is retried like a reset.
                if certificate_rejected(exc):
                    raise PveConnectionError(
                        f"TLS verification failed ({exc}); set api_ca_file to the PVE CA "
                        "(/etc/pve/pve-root-ca.pem), pin the certificate with api_fingerprint, or, on a lab "
                        "only, set api_validate_certs false",
                        call,
                    ) from exc
                if attempt <= conn.retries:
                    time.sleep(conn.backoff * 2 ** (attempt - 1))
                    continue
                raise PveConnectionError(
                    f"no answer after {attempt} attempts ({exc.__class__.__name__}: {exc}); is the API at "
                    f"{conn.api_url} up and reachable?",
                    call,
                ) from exc
            if resp.status_code < 400:
                return resp
            message, errors = _error_body(resp)
            if (
                resp.status_code in RETRY_STATUS
                and attempt <= conn.retries
                and not errors
                and not _DETERMINISTIC.search(message)
            ):
                time.sleep(conn.backoff * 2 ** (attempt - 1))
                continue
            if resp.status_code == 401:
                raise PveAuthError(
                    f"authentication failed ({message}); check the API token id and secret (or user and "
                    "password) and that the token is not expired",
                    call,
                    401,
                )
            if resp.status_code == 403:
                raise PvePermissionError(
                    f"permission denied: {message}; grant that privilege to {conn.userid} on that path "
                    "(pveum acl modify), or use a role that has it",
                    call,
                    403,
                )
            if resp.status_code in RETRY_STATUS and attempt > 1:
                message = f"{message} (still failing after {attempt} attempts)"
            raise PveError(message, call, resp.status_code, errors)


def _error_body(resp: requests.Response) -> tuple[str, Any]:
    message = resp.reason or ""
    errors = None
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or message).strip()
        errors = body.get("errors") or None
    return f"HTTP {resp.status_code} {message}".strip(), errors


@dataclass
class TaskResult:
    upid: str
    exitstatus: str
    log: list[str] = field(default_factory=list)


class PveClient:
    """One authenticated connection. `api` is the proxmoxer resource tree; `get/post/put/delete` take a
    path string. `reads` and `writes` count requests (retries included)."""

    def __init__(self, conn: PveConnection):
        conn.check()
        self.conn = conn
        self.requests: Counter[str] = Counter()
        self.calls: list[str] = []
        if conn.fingerprint:
            verify: Any = False
        elif not conn.validate_certs:
            verify = False
        else:
            verify = conn.ca_file or True
        self._auth = _Auth(verify, conn.timeout)
        session = _Session(self)
        session.auth = self._auth
        session.verify = verify
        session.headers["accept"] = JsonSerializer().get_accept_types()
        if conn.fingerprint:
            session.mount("https://", FingerprintAdapter(conn.fingerprint))
        self._session = session
        self.api = ProxmoxResource(base_url=conn.base_url, session=session, serializer=JsonSerializer())
        if conn.uses_token:
            self._auth.header = f"PVEAPIToken={conn.token_id}={conn.token_secret}"
        else:
            self._login()

    def _login(self) -> None:
        try:
            data = self.post("access/ticket", username=self.conn.user, password=self.conn.password)
        except PveAuthError as exc:
            raise PveAuthError(
                f"login as {self.conn.user} refused; check api_user and api_password", exc.call, 401
            ) from exc
        if not isinstance(data, dict) or "ticket" not in data:
            raise PveAuthError("the ticket call returned no ticket", "POST /access/ticket", 401)
        if data.get("NeedTFA"):
            raise PveAuthError(
                f"{self.conn.user} has two-factor authentication; use an API token instead",
                "POST /access/ticket",
                401,
            )
        self._auth.ticket = data["ticket"]
        self._auth.csrf = data.get("CSRFPreventionToken")

    def _count(self, method: str, path: str) -> None:
        self.requests["read" if method == "GET" else "write"] += 1
        self.calls.append(f"{method} {path}")

    @property
    def reads(self) -> int:
        return self.requests["read"]

    @property
    def writes(self) -> int:
        return self.requests["write"]

    def _res(self, path: str) -> ProxmoxResource:
        return self.api(path.strip("/"))

    def get(self, path: str, **params: Any) -> Any:
        return self._res(path).get(**params)

    def post(self, path: str, **data: Any) -> Any:
        return self._res(path).post(**data)

    def put(self, path: str, **data: Any) -> Any:
        return self._res(path).put(**data)

    def delete(self, path: str, **params: Any) -> Any:
        return self._res(path).delete(**params)

    # ------------------------------------------------------------------------------------------ tasks

    def wait_task(
        self,
        node: str,
        upid: str,
        timeout: float = 600,
        what: str = "",
        on_progress: Callable[[dict[str, Any], list[str]], None] | None = None,
        poll: float = 0.05,
        max_poll: float = 2.0,
    ) -> TaskResult:
        """Wait for a UPID task. Raises PveTaskError with PVE's message when it ends in error, and when
        it outlives `timeout`. `on_progress(status, new_log_lines)` is called on every poll."""
        if not upid:
            return TaskResult("", "OK")
        call = what or f"task {upid}"
        deadline = time.monotonic() + timeout
        log_start = 0
        while True:
            status = self.get(f"nodes/{node}/tasks/{upid}/status")
            if on_progress is not None:
                lines = self.get(f"nodes/{node}/tasks/{upid}/log", start=log_start, limit=500) or []
                log_start += len(lines)
                on_progress(status, [str(line.get("t", "")) for line in lines])
            if status.get("status") == "stopped":
                exitstatus = str(status.get("exitstatus", ""))
                if exitstatus == "OK" or exitstatus.startswith("WARNINGS"):
                    return TaskResult(upid, exitstatus)
                log = self.task_log(node, upid)
                raise PveTaskError(f"task failed: {exitstatus}", call, upid, log)
            if time.monotonic() > deadline:
                raise PveTaskError(
                    f"task still running after {timeout:.0f}s; it goes on in PVE (see the node's task "
                    "list); raise the timeout or run again later",
                    call,
                    upid,
                )
            time.sleep(poll)
            poll = min(poll * 1.5, max_poll)

    def task_log(self, node: str, upid: str, tail: int = 20) -> list[str]:
        try:
            lines = self.get(f"nodes/{node}/tasks/{upid}/log", start=0, limit=5000) or []
        except PveError:
            return []
        return [str(line.get("t", "")) for line in lines][-tail:]
