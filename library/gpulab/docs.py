"""The README's variable tables, generated from the lab-definition catalogue and every role's
meta/argument_specs.yml. `make docs` rewrites them; a test fails when README is out of date."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from gpulab.labdef import CATALOGUE

START, END = "<!-- variables:start -->", "<!-- variables:end -->"
SCOPES = {
    "all": "group_vars/all",
    "proxmox": "host_vars of each Proxmox node",
    "vms": "host_vars of each VM",
    "router": "host_vars of the router",
}


def _cell(value) -> str:
    if value is None or value == "":
        return ""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"`{text}`".replace("|", "\\|")


def render(root: Path) -> str:
    out = [
        "### Lab definition (inventory)",
        "",
        "| variable | where | type | default | required | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for v in CATALOGUE:
        req = "yes" if v.required else ("secret" if v.secret else "")
        out.append(
            f"| `{v.name}` | {SCOPES[v.scope]} | {v.type} | {_cell(v.default)} | {req} | "
            f"{v.doc.replace('|', chr(92) + '|')} |"
        )
    for spec in sorted(root.glob("roles/*/meta/argument_specs.yml")):
        role = spec.parent.parent.name
        data = yaml.safe_load(spec.read_text()) or {}
        options = (data.get("argument_specs") or {}).get("main", {}).get("options") or {}
        if not options:
            continue
        out += ["", f"### Role `{role}`", "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for name, opt in sorted(options.items()):
            desc = opt.get("description", "")
            if isinstance(desc, list):
                desc = " ".join(desc)
            out.append(
                f"| `{name}` | {opt.get('type', 'str')} | {_cell(opt.get('default'))} | "
                f"{' '.join(str(desc).split()).replace('|', chr(92) + '|')} |"
            )
    return "\n".join(out)


def update_readme(root: Path) -> bool:
    """Rewrite README's variable section; True when it changed."""
    readme = root / "README.md"
    text = readme.read_text()
    new = re.sub(
        re.escape(START) + ".*?" + re.escape(END),
        lambda _: f"{START}\n{render(root)}\n{END}",
        text,
        flags=re.S,
    )
    if new != text:
        readme.write_text(new)
    return new != text


# pve_vm's DOCUMENTATION options: generated from the option table gpulab.pve.vmoptions.
VM_MODULE = "plugins/modules/pve_vm.py"
VM_OPTIONS_START = (
    "options:  # generated from gpulab.pve.vmoptions by `make docs`: edit the table, not this block\n"
)


class _Indented(yaml.SafeDumper):
    """Lists indented under their key, as the hand-written DOCUMENTATION blocks are."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def render_vm_options() -> str:
    from gpulab.pve import vmoptions

    body = yaml.dump(vmoptions.documentation(), Dumper=_Indented, sort_keys=False, width=110)
    return VM_OPTIONS_START + "".join(f"  {line}\n" if line else "\n" for line in body.splitlines())


def vm_options_block(text: str) -> str:
    """The generated options block of the module's DOCUMENTATION (it ends DOCUMENTATION)."""
    return VM_OPTIONS_START + text.split(VM_OPTIONS_START, 1)[1].split('"""', 1)[0]


def _rewrite_block(path: Path, block_of, render) -> bool:
    """Replace the generated block of a module's DOCUMENTATION (`block_of(text)`) with `render()`; True when
    it changed."""
    text = path.read_text()
    new = text.replace(block_of(text), render())
    if new != text:
        path.write_text(new)
    return new != text


def update_vm_module(root: Path) -> bool:
    return _rewrite_block(root / VM_MODULE, vm_options_block, render_vm_options)


# dhcp_reservation's documentation of `options`: generated from the router kinds table
# gpulab.routers.kinds (one line per kind).
ROUTER_MODULE = "plugins/modules/dhcp_reservation.py"
ROUTER_OPTIONS_START = "  options:\n    description:  # generated from gpulab.routers.kinds by `make docs`\n"
ROUTER_OPTIONS_END = "    type: dict\n"


def render_router_options() -> str:
    from gpulab.routers.kinds import option_docs

    body = yaml.dump(option_docs(), Dumper=_Indented, width=110)
    return ROUTER_OPTIONS_START + "".join(f"      {line}\n" for line in body.splitlines())


def router_options_block(text: str) -> str:
    """The generated lines of the module's `options` description, from its start marker to `type: dict`."""
    return ROUTER_OPTIONS_START + text.split(ROUTER_OPTIONS_START, 1)[1].split(ROUTER_OPTIONS_END, 1)[0]


def update_router_module(root: Path) -> bool:
    return _rewrite_block(root / ROUTER_MODULE, router_options_block, render_router_options)


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    changed = update_readme(root)
    print("README.md variables updated" if changed else "README.md variables up to date")
    changed = update_vm_module(root)
    print(f"{VM_MODULE} options updated" if changed else f"{VM_MODULE} options up to date")
    changed = update_router_module(root)
    print(f"{ROUTER_MODULE} options updated" if changed else f"{ROUTER_MODULE} options up to date")
