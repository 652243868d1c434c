"""Huawei EchoLife ONT/HGW (the reference lab's TIME fibre router), described as an http_form profile.

From the HG8145C firmware's pages: login with the one-time token of /asp/GetRandCount.asp and a
base64 password; the "DHCP Static IP Configuration" page (html/bbsp/dhcpstatic/dhcpstatic.asp)
lists `new stDhcp(path, enable, ip, mac)` rows and carries a fresh `onttoken` for each write;
add.cgi / set.cgi / del.cgi post forms against the TR-098 DHCPStaticAddress table and answer with
the page re-rendered; current clients come from html/bbsp/common/GetLanUserDhcpInfo.asp. At most 16
entries; no host name field. ISP firmware may move pages: pass `router_options.profile`, a mapping or
the path of a YAML file, with the keys to override (see gpulab.routers.httpform for the format).
"""

from __future__ import annotations

from .httpform import HttpFormBackend

STATIC = "InternetGatewayDevice.LANDevice.1.LANHostConfigManagement.DHCPStaticAddress"
PAGE = "html/bbsp/dhcpstatic/dhcpstatic.asp"

HUAWEI_ONT = {
    "name": "Huawei EchoLife ONT",
    "cookies": {"Cookie": "body:Language:english:id=-1"},
    "login": [
        {"method": "GET", "url": "/asp/GetRandCount.asp", "extract": {"token": r"^\s*([0-9A-Za-z]+)"}},
        {
            "method": "POST",
            "url": "/login.cgi",
            "form": {
                "UserName": "{{ user }}",
                "PassWord": "{{ password | b64 }}",
                "x.X_HW_Token": "{{ token }}",
            },
            "fail_if": r'id="txt_Username"',
        },
    ],
    "logged_out_if": r'id="txt_Username"',
    "logout": [
        {
            "method": "POST",
            "url": "/logout.cgi?RequestFile=html/logout.html",
            "form": {"x.X_HW_Token": "{{ csrf | default('') }}"},
        }
    ],
    "reservations": {
        "request": {"method": "GET", "url": "/" + PAGE},
        "rows": r'new stDhcp\("([^"]*)","([^"]*)","([^"]*)","([^"]*)"\)',
        "fields": ["ref", "enabled", "ip", "mac"],
        "unescape": "js",
        "extract": {"csrf": r'id="hwonttoken" value="([^"]*)"'},
    },
    "leases": {
        "request": {"method": "GET", "url": "/html/bbsp/common/GetLanUserDhcpInfo.asp"},
        "rows": r'new DHCPInfo\("([^"]*)","([^"]*)","([^"]*)","([^"]*)"',
        "fields": ["ref", "hostname", "ip", "mac"],
        "unescape": "js",
    },
    "create": {
        "method": "POST",
        "url": f"/html/bbsp/dhcpstatic/add.cgi?x={STATIC}&RequestFile={PAGE}",
        "form": {
            "x.Yiaddr": "{{ ip }}",
            "x.Chaddr": "{{ mac }}",
            "x.Enable": "1",
            "x.X_HW_Token": "{{ csrf }}",
        },
    },
    "update": {
        "method": "POST",
        "url": "/html/bbsp/dhcpstatic/set.cgi?x={{ ref }}&RequestFile=" + PAGE,
        "form": {"x.Yiaddr": "{{ ip }}", "x.Chaddr": "{{ mac }}", "x.X_HW_Token": "{{ csrf }}"},
    },
    "delete": {
        "method": "POST",
        "url": f"/html/bbsp/dhcpstatic/del.cgi?x={STATIC}&RequestFile={PAGE}",
        "form": {"{{ ref }}": "", "x.X_HW_Token": "{{ csrf }}"},
    },
    "refresh_csrf": True,
    "max_reservations": 16,
    "supports_hostname": False,
    "mac_format": "lower-colon",
    "refusals": {
        r"more than 16 DHCP static": "the router holds at most 16 static entries",
        r"used by another DHCP static IP rule": "the address or MAC is already used by another static entry",
        r"same subnet as the LAN": "the address must be in the LAN's subnet",
    },
}


class HuaweiOntBackend(HttpFormBackend):
    kind = "huawei_ont"

    def __init__(self, url, *, profile=None, **kw):
        if isinstance(profile, str):  # a YAML file with the keys to override
            import yaml

            with open(profile, encoding="utf-8") as fh:
                profile = yaml.safe_load(fh) or {}
        super().__init__(url, {**HUAWEI_ONT, **(profile or {})}, **kw)
