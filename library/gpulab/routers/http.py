"""A small HTTP client for router APIs: one session, clear errors, secrets masked in every message."""

from __future__ import annotations

import urllib.parse

import requests

from gpulab.tls import certificate_rejected

from .model import AuthError, ConnectError, RouterError

MASK = "********"


def mask(text: str, secrets) -> str:
    """`text` with every secret (and its URL-encoded form) replaced by ********."""
    out = str(text)
    for s in secrets:
        if s and len(str(s)) >= 3:
            for form in {str(s), urllib.parse.quote(str(s), safe=""), urllib.parse.quote_plus(str(s))}:
                out = out.replace(form, MASK)
    return out


class HttpClient:
    def __init__(
        self,
        base_url: str,
        *,
        router: str,
        auth=None,
        headers: dict | None = None,
        verify: bool = True,
        timeout: float = 20.0,
        secrets=(),
    ):
        self.base = base_url.rstrip("/")
        self.router = router
        self.session = requests.Session()
        self.session.auth = auth
        self.session.verify = verify
        if (
            not verify
        ):  # the user chose it (router_validate_certs: false): one note in the docs, no warning per request
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.session.headers.update(headers or {})
        self.timeout = timeout
        self.secrets = [s for s in secrets if s]
        if auth:
            self.secrets.extend(a for a in auth[1:] if a)
        self.requests = 0

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base + "/" + path.lstrip("/")

    def request(self, method: str, path: str, *, doing: str, ok=(200, 201, 204), **kw) -> requests.Response:
        """Send one request; raise ConnectError/AuthError/RouterError for anything not in `ok`."""
        url = self.url(path)
        self.requests += 1
        try:
            # verify per request: requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE override session.verify=False
            resp = self.session.request(method, url, timeout=self.timeout, verify=self.session.verify, **kw)
        except requests.exceptions.SSLError as e:
            if not certificate_rejected(e):
                raise ConnectError(
                    self.mask(f"{doing}: the TLS connection to {self.router} at {self.base} broke: {e}")
                ) from None
            raise ConnectError(
                self.mask(
                    f"{doing}: TLS check of {self.base} failed ({e.__class__.__name__}); give the router a "
                    "certificate this machine trusts, or set router_validate_certs: false for a self-signed one"
                )
            ) from None
        except requests.RequestException as e:
            raise ConnectError(
                self.mask(f"{doing}: cannot reach {self.router} at {self.base}: {e}")
            ) from None
        if resp.status_code in (401, 403) and resp.status_code not in ok:
            raise AuthError(
                self.mask(
                    f"{doing}: {self.router} refused the credentials (HTTP {resp.status_code}); check "
                    "router_user and router_password (an API key and secret for OPNsense) in the inventory"
                )
            )
        if resp.status_code not in ok:
            raise RouterError(
                self.mask(
                    f"{doing}: {self.router} answered HTTP {resp.status_code}: {resp.text.strip()[:400]}"
                )
            )
        return resp

    def json(self, method: str, path: str, *, doing: str, **kw):
        resp = self.request(method, path, doing=doing, **kw)
        try:
            return resp.json() if resp.content else None
        except ValueError:
            raise RouterError(
                self.mask(f"{doing}: {self.router} did not answer JSON: {resp.text.strip()[:200]}")
            ) from None

    def mask(self, text: str) -> str:
        return mask(text, self.secrets)

    def close(self) -> None:
        self.session.close()
