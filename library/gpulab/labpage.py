"""lab-table.html: the lab table as one self-contained page (inline style, no script, nothing fetched) with a
picture of the lab: each Proxmox node with its VMs, each VM's address, k3s role and state, the cards passed through
to it and each card's shares (the engines holding it, their percent, the percent free), the problems the table shows,
and where the lab's UIs are reached.

`page()` is pure: it reads only the rows of gpulab.labtable (the same as lab-table.json), so the page, the Markdown
and the JSON always say the same. `problems()` lists what the rows show wrong.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

#: a card's entry in the shares column (labtable.shares_text): `GPU-e1924eea: ns/pod 40 %, ...; 15 % free`
_CARD = re.compile(r"^(?P<uuid>\S+): (?P<pods>.*?)(?P<free>\d+) % free$")
_POD = re.compile(r"(?P<pod>\S+) (?P<percent>\d+) %, ")
_PALETTE = ("#2f6fbf", "#d9822b", "#7a4fbf", "#2a9d8f", "#c2410c", "#4d7c0f")


def cards_of(row: Mapping[str, str]) -> list[dict[str, Any]]:
    """The cards of one row: what the inventory names (gpu), what nvidia-smi shows (driver), and HAMi's shares of
    each (pods with percent, free percent), card by card in the order the columns list them."""
    gpus = [] if row.get("gpu", "-") in ("-", "") else row["gpu"].split("; ")
    drivers = [] if row.get("driver", "-") in ("-", "") else row["driver"].split("; ")
    shares = [] if row.get("shares", "-") in ("-", "") else row["shares"].split("; ")
    out = []
    for i in range(max(len(gpus), len(drivers), len(shares))):
        card: dict[str, Any] = {
            "gpu": gpus[i] if i < len(gpus) else "",
            "driver": drivers[i] if i < len(drivers) else "",
            "uuid": "",
            "pods": [],
            "free": None,
        }
        m = _CARD.match(shares[i]) if i < len(shares) else None
        if m:
            card["uuid"] = m["uuid"]
            card["pods"] = [{"pod": p["pod"], "percent": int(p["percent"])} for p in _POD.finditer(m["pods"])]
            card["free"] = int(m["free"])
        out.append(card)
    return out


def k3s_of(row: Mapping[str, str]) -> tuple[str, str]:
    """(state, role) from the k3s column (`Ready control-plane,etcd,master v1.33.5+k3s1`): role server or agent."""
    words = row.get("k3s", "-").split()
    if not words or words[0] == "-":
        return "-", "-"
    roles = words[1] if len(words) > 1 and not words[1].startswith("v") else "agent"
    return words[0], "server" if "control-plane" in roles.split(",") else "agent"


def problems(table: list[Mapping[str, str]]) -> list[str]:
    """What the rows show wrong: a VM PVE does not hold, no address, not a k3s node or not Ready, a passed-through
    card the guest's driver does not see or HAMi does not offer, a card with nothing free."""
    out = []
    for row in table:
        vm = row.get("vm", "?")
        if row.get("shape") == "absent":
            out.append(f"{vm}: PVE holds no such VM")
        if row.get("address") in ("?", "", None):
            out.append(f"{vm}: no address")
        state, _role = k3s_of(row)
        if state == "-":
            out.append(f"{vm}: not a k3s node")
        elif state != "Ready":
            out.append(f"{vm}: k3s node {state}")
        if row.get("gpu", "-") != "-":
            if row.get("driver", "-") == "-":
                out.append(f"{vm}: nvidia-smi shows no card for {row['gpu']}")
            if row.get("hami", "-") in ("-", "0"):
                out.append(f"{vm}: HAMi offers no vGPU on it")
        for card in cards_of(row):
            if card["free"] == 0:
                out.append(f"{vm}: card {card['uuid']} has no memory left to share")
    return out


_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2933;background:#f5f7fa}
h1{margin:0 0 4px;font-size:22px}h2{font-size:16px;margin:0 0 10px}h3{font-size:15px;margin:0 0 6px}
.summary{color:#52606d;margin:0 0 18px}
.lab{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
.pve{background:#e4e7eb;border:2px solid #9aa5b1;border-radius:10px;padding:12px;min-width:300px}
.vms{display:flex;flex-wrap:wrap;gap:12px}
.vm{background:#fff;border:1px solid #cbd2d9;border-radius:8px;padding:10px;width:280px}
.vm.server{border-top:5px solid #2f6fbf}.vm.agent{border-top:5px solid #3e9b5f}.vm.none{border-top:5px solid #9aa5b1}
.vm.bad{outline:3px solid #d64545}
.vmid{color:#7b8794;font-weight:normal}
dl{display:grid;grid-template-columns:auto 1fr;gap:2px 8px;margin:0 0 6px}dt{color:#7b8794}dd{margin:0}
.role{display:inline-block;padding:0 6px;border-radius:4px;color:#fff;font-size:12px}
.role.server{background:#2f6fbf}.role.agent{background:#3e9b5f}.role.none{background:#9aa5b1}
.card{border:1px dashed #7b8794;border-radius:6px;padding:6px;margin-top:6px;background:#fbfcfd}
.card-name{font-weight:600;font-size:13px}.card-driver{color:#52606d;font-size:12px}
.bar{display:flex;height:26px;border-radius:4px;overflow:hidden;margin-top:4px;background:#e4e7eb}
.share,.free{font-size:11px;line-height:26px;white-space:nowrap;overflow:hidden;text-align:center}
.share{color:#fff}.free{color:#323f4b;background:repeating-linear-gradient(45deg,#e4e7eb,#e4e7eb 6px,#f5f7fa 6px,#f5f7fa 12px)}
.legend{display:flex;flex-wrap:wrap;gap:2px 10px;font-size:12px;margin-top:4px;color:#323f4b}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.legend-free i{background:#cbd2d9}
#problems,#links,#table{margin-top:22px;background:#fff;border:1px solid #cbd2d9;border-radius:8px;padding:12px}
#problems li{color:#ab091e}#problems .none{color:#3e9b5f;margin:0}
table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #cbd2d9;padding:3px 6px;text-align:left}
th{background:#e4e7eb}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _card_html(card: Mapping[str, Any]) -> str:
    parts = [f'<div class="card" data-uuid="{_e(card["uuid"])}">']
    parts.append(f'<div class="card-name">{_e(card["gpu"] or card["uuid"] or "card")}</div>')
    if card["driver"]:
        parts.append(f'<div class="card-driver">{_e(card["driver"])}</div>')
    if card["free"] is not None:
        parts.append(f'<div class="bar" title="HAMi shares of {_e(card["uuid"])}">')
        for i, p in enumerate(card["pods"]):
            name = p["pod"].split("/", 1)[-1]
            parts.append(
                f'<div class="share" style="width:{p["percent"]}%;background:{_PALETTE[i % len(_PALETTE)]}" '
                f'data-pod="{_e(p["pod"])}" data-percent="{p["percent"]}" title="{_e(p["pod"])} {p["percent"]} %">'
                f"{_e(name)} {p['percent']} %</div>"
            )
        parts.append(
            f'<div class="free" style="width:{card["free"]}%" data-percent="{card["free"]}">'
            f"{str(card['free']) + ' % free' if card['free'] >= 20 else ''}</div>"
        )
        parts.append("</div>")
        legend = [
            f'<span><i style="background:{_PALETTE[i % len(_PALETTE)]}"></i>{_e(p["pod"])} {p["percent"]} %</span>'
            for i, p in enumerate(card["pods"])
        ]
        legend.append(f'<span class="legend-free"><i></i>{card["free"]} % free</span>')
        parts.append(f'<div class="legend">{"".join(legend)}</div>')
    parts.append("</div>")
    return "".join(parts)


def _vm_html(row: Mapping[str, str], bad: bool) -> str:
    _state, role = k3s_of(row)
    kind = {"server": "server", "agent": "agent"}.get(role, "none")
    label = {"server": "k3s server", "agent": "k3s agent"}.get(role, "no k3s")
    cards = "".join(_card_html(c) for c in cards_of(row))
    return (
        f'<div class="vm {kind}{" bad" if bad else ""}" data-vm="{_e(row.get("vm"))}" data-role="{_e(role)}">'
        f'<h3>{_e(row.get("vm"))} <span class="vmid">#{_e(row.get("vmid", ""))}</span> '
        f'<span class="role {kind}">{label}</span></h3>'
        f'<dl><dt>address</dt><dd class="address">{_e(row.get("address", "?"))}</dd>'
        f'<dt>k3s</dt><dd class="k3s">{_e(row.get("k3s", "-"))}</dd>'
        + (
            f'<dt>kubectl</dt><dd class="context" data-context="{_e(row["context"])}">--context '
            f"{_e(row['context'])}</dd>"
            if row.get("context")
            else ""
        )
        + f"<dt>shape</dt><dd>{_e(row.get('shape', ''))}</dd>"
        f"<dt>HAMi</dt><dd>{_e(row.get('hami', '-'))} vGPUs</dd></dl>"
        f"{cards}</div>"
    )


def page(
    table: list[Mapping[str, str]],
    links: Mapping[str, str] | None = None,
    columns: tuple[tuple[str, str], ...] = (),
) -> str:
    """The whole page (see the module docstring); `columns` (key, title) are the table's at its end (labtable's)."""
    found = problems(table)
    bad_vms = {p.split(":", 1)[0] for p in found}
    nodes: dict[str, list[Mapping[str, str]]] = {}
    for row in table:
        nodes.setdefault(row.get("node") or "-", []).append(row)
    cards = sum(len([c for c in cards_of(r) if c["gpu"]]) for r in table)
    out = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>gpulab lab</title><style>{_STYLE}</style></head><body>",
        "<header><h1>gpulab lab</h1>",
        f'<p class="summary">{len(nodes)} Proxmox node(s), {len(table)} VM(s), {cards} card(s) passed through, '
        f"{len(found)} problem(s)</p></header>",
        '<section id="lab" class="lab">',
    ]
    for node, rows in nodes.items():
        out.append(
            f'<div class="pve" data-node="{_e(node)}"><h2>Proxmox node {_e(node)}</h2><div class="vms">'
        )
        out += [_vm_html(r, r.get("vm") in bad_vms) for r in rows]
        out.append("</div></div>")
    out.append('</section><section id="problems"><h2>Problems found</h2>')
    if found:
        out.append("<ul>" + "".join(f"<li>{_e(p)}</li>" for p in found) + "</ul>")
    else:
        out.append('<p class="none">none</p>')
    out.append("</section>")
    if links:
        items = "".join(
            f'<li>{_e(name)}: <a href="{_e(url)}">{_e(url)}</a></li>' for name, url in links.items()
        )
        out.append(f'<section id="links"><h2>Reached at</h2><ul>{items}</ul></section>')
    head = "".join(f"<th>{_e(title)}</th>" for _key, title in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(r.get(k, ''))}</td>" for k, _t in columns) + "</tr>" for r in table
    )
    out.append(f'<section id="table"><h2>The table</h2><table><tr>{head}</tr>{body}</table></section>')
    out.append("</body></html>\n")
    return "\n".join(out)
