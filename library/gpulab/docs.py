"""The README's variable tables, generated from the lab-definition catalogue and every role's
meta/argument_specs.yml. `make docs` rewrites them; a test fails when README is out of date."""

from __future__ import annotations

import re
import subprocess
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


# The argument spec of each controller module (its engine's OPTIONS, gpulab.tasks.<name>, with the PVE connection
# options of a PVE task), written into the module file as a Python literal so that Ansible and ansible-test's
# validate-modules read the module's real arguments without the engine. `make docs` writes it (then
# `ruff format` lays it out); tests/test_module_docs.py checks each file's spec is its engine's.
CONTROLLER_MODULES = (
    "dhcp_reservation",
    "hami_values",
    "hami_workloads",
    "lab_table",
    "monitoring_charts",
    "pve_download",
    "pve_info",
    "pve_pci_mapping",
    "pve_vm",
)
SPEC_START = "# generated from gpulab.tasks.{name} by `make docs`: edit its OPTIONS, not these lines\n"
SPEC_END = "# end of the generated argument spec\n"


class _Fallback:
    """Stands for Ansible's env_fallback while the spec is rendered: written as its name."""

    def __repr__(self) -> str:
        return "env_fallback"


def _literal(value) -> str:
    if isinstance(value, dict) and all(isinstance(k, str) and k.isidentifier() for k in value):
        return "dict(" + ", ".join(f"{k}={_literal(v)}" for k, v in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_literal(v) for v in value)
        return (
            f"({items},)"
            if isinstance(value, tuple) and len(value) == 1
            else (f"({items})" if isinstance(value, tuple) else f"[{items}]")
        )
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def render_argument_spec(name: str) -> str:
    """The generated lines of controller module `name`: ARGUMENT_SPEC and RULES (AnsibleModule's keyword
    arguments between options), one option a line (`ruff format` splits the long ones)."""
    from gpulab import tasks

    task = tasks.of(name)
    spec = tasks.argument_spec(task, _Fallback())
    rules = {k: [list(group) for group in v] for k, v in tasks.rules(task).items()}
    lines = [SPEC_START.format(name=name), "ARGUMENT_SPEC = dict(\n"]
    lines += [f"    {option}={_literal(entry)},\n" for option, entry in spec.items()]
    lines.append(")\n")
    lines.append(f"RULES = {_literal(rules)}\n")
    lines.append(SPEC_END)
    return _formatted("".join(lines), name)


def _formatted(code: str, name: str) -> str:
    """`code` laid out as `ruff format` lays out the module file (the project's ruff settings), so that
    `make docs` writes what the lint accepts; unchanged where ruff is not installed."""
    try:
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        return code
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [find_ruff_bin(), "format", "--stdin-filename", f"plugins/modules/{name}.py", "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    return proc.stdout if proc.returncode == 0 else code


def argument_spec_block(text: str, name: str) -> str:
    start = SPEC_START.format(name=name)
    if start not in text:
        raise ValueError(f"plugins/modules/{name}.py has no line {start.strip()!r}")
    return start + text.split(start, 1)[1].split(SPEC_END, 1)[0] + SPEC_END


def update_argument_specs(root: Path) -> list[str]:
    """Rewrite each controller module's generated argument spec; the names of those that changed."""
    changed = []
    for name in CONTROLLER_MODULES:
        path = root / "plugins" / "modules" / f"{name}.py"
        if _rewrite_block(
            path, lambda text, n=name: argument_spec_block(text, n), lambda n=name: render_argument_spec(n)
        ):
            changed.append(name)
    return changed


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    changed = update_readme(root)
    print("README.md variables updated" if changed else "README.md variables up to date")
    changed = update_vm_module(root)
    print(f"{VM_MODULE} options updated" if changed else f"{VM_MODULE} options up to date")
    changed = update_router_module(root)
    print(f"{ROUTER_MODULE} options updated" if changed else f"{ROUTER_MODULE} options up to date")
    changed_specs = update_argument_specs(root)
    print(
        f"argument specs updated: {', '.join(changed_specs)}"
        if changed_specs
        else "argument specs up to date"
    )
