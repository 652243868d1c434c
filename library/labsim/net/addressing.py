"""Choosing the lab's network range so that it never meets the machine's own networks.

Pure functions over the route table (``ip -j route show table all``), so the rules are testable
without root: a range is free when no route or address of the machine overlaps it (the default
route does not count: it overlaps everything by definition).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

Network = ipaddress.IPv4Network


class SubnetConflict(ValueError):
    """A configured lab range overlaps something that already exists on the machine."""


def read_routes(netns: str | None = None) -> list[dict[str, Any]]:
    """IPv4 routes of every table (main, local, policy tables) of the root or a named namespace."""
    cmd = ["ip", "-4", "-j", "route", "show", "table", "all"]
    if netns:
        cmd = ["ip", "-n", netns, *cmd[1:]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out or "[]")


def route_network(route: dict[str, Any]) -> Network | None:
    """The destination range of one route, or None for default routes and oddities."""
    dst = route.get("dst", "")
    if not dst or dst == "default":
        return None
    try:
        return ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return None


def describe_route(route: dict[str, Any]) -> str:
    """One route as `ip route` would print it, for messages."""
    parts = []
    if route.get("type") and route["type"] != "unicast":
        parts.append(route["type"])
    parts.append(route.get("dst", "?"))
    for key, word in (("gateway", "via"), ("dev", "dev"), ("table", "table"), ("protocol", "proto")):
        if route.get(key) and not (key == "table" and route[key] == "main"):
            parts.append(f"{word} {route[key]}")
    if route.get("prefsrc"):
        parts.append(f"src {route['prefsrc']}")
    return " ".join(parts)


def conflicts(subnet: Network, routes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The routes whose destination overlaps `subnet`."""
    return [r for r in routes if (net := route_network(r)) is not None and net.overlaps(subnet)]


def check_subnet(subnet: Network, routes: Iterable[dict[str, Any]]) -> None:
    """Refuse a configured lab range that overlaps a route or address of the machine."""
    found = conflicts(subnet, routes)
    if found:
        names = "; ".join(describe_route(r) for r in found)
        raise SubnetConflict(
            f"lab network {subnet} overlaps what this machine already uses ({names}); the lab would "
            f"disturb that network. Set network.subnet in the lab fixture to a free private range "
            f"(e.g. 10.213.0.0/24), or to 'auto' to let the lab pick one"
        )


def candidates(seed: str) -> Iterator[Network]:
    """Private /24 ranges in a seed-dependent order (so parallel labs tend to pick different ones)."""
    h = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:4], "big")
    start = h % 4096
    for i in range(4096):  # 10.200.0.0/24 .. 10.215.255.0/24
        n = (start + i) % 4096
        yield ipaddress.ip_network(f"10.{200 + n // 256}.{n % 256}.0/24")
    for second in range(16, 32):
        for third in range(200, 256):
            yield ipaddress.ip_network(f"172.{second}.{third}.0/24")


def choose_subnet(seed: str, routes: Iterable[dict[str, Any]]) -> Network:
    """The first candidate range that overlaps nothing on the machine."""
    routes = list(routes)
    for net in candidates(seed):
        if not conflicts(net, routes):
            return net
    raise SubnetConflict("no free private /24 left for the lab network; set network.subnet in the fixture")


def translate(address: str, subnet: Network) -> ipaddress.IPv4Address:
    """The address with the same host part inside `subnet` (192.168.100.5 -> 10.x.y.5 for a /24)."""
    host_part = int(ipaddress.ip_address(address)) & int(subnet.hostmask)
    return subnet.network_address + host_part


def pool_ranges(
    first: ipaddress.IPv4Address, last: ipaddress.IPv4Address, exclude: Iterable[ipaddress.IPv4Address]
) -> list[tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]]:
    """[first, last] split around the excluded addresses (the lab's own static ones)."""
    ranges = []
    start = int(first)
    for ex in sorted(int(e) for e in exclude if int(first) <= int(e) <= int(last)):
        if ex > start:
            ranges.append((ipaddress.IPv4Address(start), ipaddress.IPv4Address(ex - 1)))
        start = ex + 1
    if start <= int(last):
        ranges.append((ipaddress.IPv4Address(start), last))
    return ranges
