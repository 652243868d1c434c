"""Huawei EchoLife ONT web UI simulator: login, "DHCP Static IP Configuration", LAN DHCP clients.

Built from the HG8145C firmware's own pages (web/frame_huawei/login.asp, html/bbsp/dhcpstatic/
dhcpstatic.asp, html/bbsp/common/GetLanUserDhcpInfo.asp, bbspdes.html strings), the page the
reference lab's TIME router shows:

* login: GET /asp/GetRandCount.asp gives a one-time token (answered with a UTF-8 BOM); POST
  /login.cgi with UserName, PassWord (base64) and x.X_HW_Token sets the session cookie `Cookie`.
  A wrong password answers 200 with the login page again. One admin session at a time: a second
  login while one is active is refused the same way (and counted as a failure). After 3 failures in
  a row logins are refused for `lockout_s` seconds.
* every page answers 200 + the login page when the session cookie is missing or expired;
* the static table page embeds `new stDhcp(path, enable, ip, mac)` rows with strings JS-escaped
  (`.` -> `\\x2e`, `:` -> `\\x3a`) and a fresh `onttoken` on every load; add.cgi / set.cgi / del.cgi
  take that token (a stale one is refused) and answer with the re-rendered page (RequestFile),
  never with an error status: what the firmware refuses (more than 16 entries, an address used by
  another rule, a MAC already in the table, an address outside the LAN subnet) simply is not in
  the table afterwards, with the firmware's message in a script alert.
"""

from __future__ import annotations

import base64
import html
import ipaddress
import secrets
import time

from .base import Reply, Request, RouterSim

STATIC = "InternetGatewayDevice.LANDevice.1.LANHostConfigManagement.DHCPStaticAddress"
HOSTS = "InternetGatewayDevice.LANDevice.1.Hosts.Host"
PAGE = "html/bbsp/dhcpstatic/dhcpstatic.asp"
MAX_ENTRIES = 16
MSG_LIMIT = "Cannot configure more than 16 DHCP static IP instances."
MSG_IP_USED = "The IP address has been used by another DHCP static IP rule."
MSG_MAC_USED = "The MAC address has been used by another DHCP static IP rule."
MSG_SUBNET = "The IP address must be in the same subnet as the LAN or WAN IP address."


def js_escape(text: str) -> str:
    """The firmware's escaping of strings embedded in pages: anything but letters and digits as \\xNN."""
    return "".join(c if c.isalnum() else f"\\x{ord(c):02x}" for c in str(text))


LOGIN_PAGE = """<html><head><title>Login</title></head><body>
<script language="JavaScript" src="/resource/common/md5.js"></script>
<script>var LoginTimes = {times}; var LockLeftTime = {lock}; var Language = 'english';</script>
<form id="loginform"><input type="text" id="txt_Username" name="UserName">
<input type="password" id="txt_Password" name="PassWord"></form></body></html>"""


class HuaweiOntSim(RouterSim):
    name = "huawei_ont"

    def __init__(
        self, *, user="admin", password="admin", lan="192.168.100.1/24", session_s=300, lockout_s=60, **kw
    ):
        super().__init__(**kw)
        self.user, self.password = user, password
        self.lan = ipaddress.IPv4Interface(lan)
        self.session_s, self.lockout_s = session_s, lockout_s
        self.rand_token = secrets.token_hex(16)
        self.sessions: dict[str, float] = {}  # sid -> last use
        self.failures = 0
        self.locked_until = 0.0
        self.page_token: str | None = None
        self.entries: dict[int, dict] = {}  # instance -> {enable, ip, mac}
        self.hosts: list[dict] = []  # LAN DHCP clients
        self.alerts: list[str] = []

    # --- test helpers ---------------------------------------------------------------------------
    def add_client(self, mac: str, ip: str, name: str = "", remain: int = 86400) -> None:
        with self.lock:
            self.hosts.append({"name": name, "ip": ip, "mac": mac.lower(), "remain": remain})

    def expire_sessions(self) -> None:
        with self.lock:
            self.sessions.clear()

    def table(self) -> list[tuple[str, str]]:
        return [(e["mac"], e["ip"]) for _, e in sorted(self.entries.items())]

    # --- pages ----------------------------------------------------------------------------------
    def _login_page(self) -> Reply:
        lock = max(0, int(self.locked_until - time.time()))
        return Reply(200, LOGIN_PAGE.format(times=self.failures, lock=lock))

    def _static_page(self) -> str:
        self.page_token = secrets.token_hex(16)
        rows = "".join(
            f'new stDhcp("{js_escape(f"{STATIC}.{n}")}","{e["enable"]}","{js_escape(e["ip"])}","{js_escape(e["mac"])}"),'
            for n, e in sorted(self.entries.items())
        )
        alert = f"<script>alert('{html.escape(self.alerts.pop())}');</script>" if self.alerts else ""
        return (
            "<html><head><title>DHCP Static IP Configuration</title></head><body>\n"
            f'<script language="JavaScript">\nvar Dhcps = new Array({rows}null);\n</script>\n{alert}'
            f'<input type="hidden" name="onttoken" id="hwonttoken" value="{self.page_token}">\n</body></html>'
        )

    def _hosts_page(self) -> str:
        rows = "".join(
            f'new DHCPInfo("{js_escape(f"{HOSTS}.{n + 1}")}","{js_escape(h["name"])}","{js_escape(h["ip"])}",'
            f'"{js_escape(h["mac"])}","{h["remain"]}","","ETH","DHCP"),'
            for n, h in enumerate(self.hosts)
        )
        return f"<script>var UserDhcpinfo = new Array({rows}null);</script>"

    def _session(self, req: Request) -> str | None:
        now = time.time()
        for sid, last in list(self.sessions.items()):
            if now - last > self.session_s:
                del self.sessions[sid]
        value = req.cookies.get("Cookie", "")
        sid = value.split(":", 1)[0].removeprefix("sid=") if value.startswith("sid=") else None
        if sid in self.sessions:
            self.sessions[sid] = now
            return sid
        return None

    def _login(self, req: Request) -> Reply:
        form = req.form()
        token_ok = form.get("x.X_HW_Token") == self.rand_token
        self.rand_token = secrets.token_hex(16)  # one use only
        if time.time() < self.locked_until:
            return self._login_page()
        try:
            pw = base64.b64decode(form.get("PassWord", "")).decode()
        except ValueError:
            pw = None
        if not token_ok or form.get("UserName") != self.user or pw != self.password or self.sessions:
            self.failures += 1
            if self.failures >= 3:
                self.locked_until = time.time() + self.lockout_s
            return self._login_page()
        self.failures = 0
        sid = secrets.token_hex(32)
        self.sessions[sid] = time.time()
        return Reply(
            200,
            '<html><script>window.location="/index.asp";</script></html>',
            {"Set-Cookie": f"Cookie=sid={sid}:Language:english:id=1; path=/"},
        )

    def _write(self, req: Request, op: str) -> Reply:
        form = req.form()
        if form.get("x.X_HW_Token") != self.page_token or self.page_token is None:
            self.page_token = None
            return Reply(200, "<html><script>alert('Operation failed.');</script></html>")
        self.page_token = None
        target = req.query.get("x", "")
        if op == "del":
            for key in form:
                if key.startswith(STATIC + "."):
                    self.entries.pop(int(key.rsplit(".", 1)[1]), None)
            return Reply(200, self._static_page())
        ip, mac = form.get("x.Yiaddr", ""), form.get("x.Chaddr", "").lower()
        me = int(target.rsplit(".", 1)[1]) if op == "set" and target.startswith(STATIC + ".") else None
        if op == "set" and me not in self.entries:
            self.alerts.append("The instance does not exist.")
            return Reply(200, self._static_page())
        try:
            in_lan = ipaddress.IPv4Address(ip) in self.lan.network
        except ValueError:
            in_lan = False
        others = [e for n, e in self.entries.items() if n != me]
        if op == "add" and len(self.entries) >= MAX_ENTRIES:
            self.alerts.append(MSG_LIMIT)
        elif not in_lan:
            self.alerts.append(MSG_SUBNET)
        elif any(e["ip"] == ip for e in others):
            self.alerts.append(MSG_IP_USED)
        elif any(e["mac"] == mac for e in others):
            self.alerts.append(MSG_MAC_USED)
        elif op == "add":
            n = max(self.entries, default=0) + 1
            self.entries[n] = {"enable": form.get("x.Enable", "1"), "ip": ip, "mac": mac}
        else:
            self.entries[me].update(ip=ip, mac=mac)
        return Reply(200, self._static_page())

    def handle(self, req: Request) -> Reply:
        p = req.path
        if p == "/asp/GetRandCount.asp":
            return Reply(200, "\ufeff" + self.rand_token)
        if p == "/login.cgi" and req.method == "POST":
            return self._login(req)
        if p in ("/", "/login.asp"):
            return self._login_page()
        sid = self._session(req)
        if sid is None:
            return self._login_page()
        if p == "/logout.cgi":
            self.sessions.pop(sid, None)
            return Reply(200, "<html>logged out</html>")
        if p == "/" + PAGE and req.method == "GET":
            return Reply(200, self._static_page())
        if p == "/html/bbsp/common/GetLanUserDhcpInfo.asp":
            return Reply(200, self._hosts_page())
        for op in ("add", "set", "del"):
            if p == f"/html/bbsp/dhcpstatic/{op}.cgi" and req.method == "POST":
                return self._write(req, op)
        return Reply(404, "<html>404 Not Found</html>")
