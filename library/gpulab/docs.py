"""What `make docs` writes: docs/variables.md, each role's README, the command blocks of the docs and the
data-flow picture, the generated options of two modules, pve_vm's argument spec and the PVE connection options
of plugins/module_utils/pve.py. Each comes from one source (the catalogue, the roles' meta/argument_specs.yml
and defaults, library/gpulab/data/commands.yml, the tables of the engine); tests/unit/labdef/test_docs.py fails when
a written file is out of date."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpulab.labdef import CATALOGUE

START, END = "<!-- variables:start -->", "<!-- variables:end -->"
VARIABLES = "docs/variables.md"
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


def _text(desc) -> str:
    """An argument spec's description (a string or a list of paragraphs) as one Markdown table cell."""
    if isinstance(desc, list):
        desc = " ".join(str(d) for d in desc)
    return " ".join(str(desc or "").split()).replace("|", "\\|")


def _options(spec: Path, entry: str = "main") -> dict:
    data = yaml.safe_load(spec.read_text()) or {}
    return (data.get("argument_specs") or {}).get(entry, {}).get("options") or {}


def render(root: Path) -> str:
    """The variable tables: the lab definition's catalogue, then each role's options."""
    out = [
        "## Lab definition (inventory)",
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
        options = _options(spec)
        if not options:
            continue
        out += [
            "",
            f"## Role `{role}` ([README](../roles/{role}/README.md))",
            "",
            "| variable | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for name, opt in sorted(options.items()):
            out.append(
                f"| `{name}` | {opt.get('type', 'str')} | {_cell(opt.get('default'))} | "
                f"{_text(opt.get('description', ''))} |"
            )
    return "\n".join(out)


def _replace_between(text: str, start: str, end: str, body: str) -> str:
    return re.sub(
        re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text, flags=re.S
    )


def _write(path: Path, new: str) -> bool:
    """Write `new` to `path` when it differs; True when it changed."""
    if path.exists() and path.read_text() == new:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    return True


def update_variables(root: Path) -> bool:
    """Rewrite the tables of docs/variables.md; True when it changed."""
    path = root / VARIABLES
    return _write(path, _replace_between(path.read_text(), START, END, render(root)))


# --- the commands the docs show, from library/gpulab/data/commands.yml ------------------------------------
COMMANDS = "library/gpulab/data/commands.yml"
WIDTH = 110


def load_commands(root: Path) -> dict[str, dict]:
    """The command blocks by name: {prompt, commands: [{run, comment}]}."""
    return yaml.safe_load((root / COMMANDS).read_text())["blocks"]


def _wrap(line: str, prompt: str) -> list[str]:
    """A long command broken after commas with a backslash, as a shell reads it back."""
    if len(prompt) + 1 + len(line) <= WIDTH:
        return [line]
    out, current = [], ""
    for piece in re.split(r"(?<=,)", line):
        if current and len(current) + len(piece) > WIDTH - 4:
            out.append(current + "\\")
            current = ""
        current += piece
    return [*out, current]


def render_commands(block: dict) -> str:
    """A console block: each command after its prompt, comments aligned where the lines stay short; a long
    command without a comment broken at its commas."""
    prompt = block.get("prompt", "$")
    commented = [len(c["run"]) for c in block["commands"] if c.get("comment")]
    longest = max((len(c.get("comment", "")) for c in block["commands"]), default=0)
    pad = max(commented, default=0) if max(commented, default=0) + longest + 6 <= WIDTH else 0
    lines = []
    for command in block["commands"]:
        run, comment = command["run"], command.get("comment")
        if comment:
            lines.append(f"{prompt} {run.ljust(pad)}  # {comment}")
            continue
        wrapped = _wrap(run, prompt)
        lines += [f"{prompt} {wrapped[0]}", *wrapped[1:]]
    return "```console\n" + "\n".join(lines) + "\n```"


def _command_markers(name: str) -> tuple[str, str]:
    return f"<!-- commands:{name} -->", f"<!-- /commands:{name} -->"


def update_commands(root: Path) -> list[Path]:
    """Rewrite each `<!-- commands:NAME -->` block of README.md and docs/*.md; the files that changed."""
    blocks = load_commands(root)
    changed = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = path.read_text()
        new = text
        for name in re.findall(r"<!-- commands:([\w-]+) -->", text):
            start, end = _command_markers(name)
            new = _replace_between(new, start, end, render_commands(blocks[name]))
        if _write(path, new):
            changed.append(path)
    return changed


# --- a README per role ---------------------------------------------------------------------------------------
ROLE_START = (
    "<!-- role-docs:start (generated by `make docs` from meta/argument_specs.yml and defaults/main.yml) -->"
)
ROLE_END = "<!-- role-docs:end -->"

# Where each role runs in gpulab: the hosts of its play, the stage playbook that runs it, and whether the play
# becomes root. The example play of each role's README is made from it.
ROLE_PLAYS: dict[str, tuple[str, str, bool]] = {
    "guest_base": ("vms", "playbooks/guests.yml", True),
    "hami": ("k3s_server[0]", "playbooks/hami.yml", True),
    "k3s_agent": ("k3s_agent", "playbooks/k3s.yml", True),
    "k3s_install": ("k3s_cluster", "playbooks/k3s.yml (through k3s_server and k3s_agent)", True),
    "k3s_server": ("k3s_server[0]", "playbooks/k3s.yml", True),
    "k3s_upgrade": ("k3s_cluster", "playbooks/upgrade.yml (entry points server, agent, gpu_node)", True),
    "monitoring": ("k3s_server[0]", "playbooks/monitoring.yml", True),
    "nvidia_container_toolkit": ("vms", "playbooks/guests.yml", True),
    "nvidia_driver": ("vms", "playbooks/guests.yml", True),
    "pve_host": ("proxmox", "playbooks/host.yml", False),
    "pve_vms": ("localhost", "playbooks/vms.yml", False),
    "router_dhcp": ("localhost", "playbooks/network.yml", False),
    "workloads": ("k3s_server[0]", "playbooks/workloads.yml", True),
}

# The roles whose example play takes one host at a time (serial: 1): a node drained and upgraded at once.
ROLE_SERIAL = frozenset({"k3s_upgrade"})

# Example values of the options a role requires (the example play sets them).
ROLE_EXAMPLES: dict[str, dict] = {
    "k3s_agent": {
        "k3s_agent_version": "v1.35.6+k3s1",
        "k3s_agent_token": "{{ vault_k3s_token }}",
        "k3s_agent_server_url": "https://192.168.100.53:6443",
    },
    "k3s_install": {"k3s_install_version": "v1.35.6+k3s1", "k3s_install_exec": "server"},
    "k3s_server": {"k3s_server_version": "v1.35.6+k3s1"},
    "k3s_upgrade": {"k3s_upgrade_version": "v1.35.6+k3s1"},
}


def _example_play(role: str, options: dict) -> str:
    hosts, _, become = ROLE_PLAYS[role]
    required = {
        n: ROLE_EXAMPLES.get(role, {}).get(n, "CHANGE-ME") for n, o in options.items() if o.get("required")
    }
    play: list[dict] = []
    if "gpulab_vms" in required:  # the plan preflight publishes: run preflight first
        required.pop("gpulab_vms")
        play.append({"ansible.builtin.import_playbook": "gpulab.homelab.preflight"})
    entry: dict = {"role": f"gpulab.homelab.{role}"}
    if required:
        entry["vars"] = required
    body: dict = {"name": f"Role {role}", "hosts": hosts}
    if role in ROLE_SERIAL:
        body["serial"] = 1
    if become:
        body["become"] = True
    body["roles"] = [entry]
    play.append(body)
    return yaml.dump(play, Dumper=_Indented, sort_keys=False, width=110).rstrip()


def render_role_readme(role_dir: Path) -> str:
    """The generated part of a role's README: what it does, its variables, its defaults, one example play."""
    role = role_dir.name
    specs = (yaml.safe_load((role_dir / "meta/argument_specs.yml").read_text()) or {})["argument_specs"]
    main = specs["main"]
    hosts, playbook, _ = ROLE_PLAYS[role]
    out = [f"# Role `gpulab.homelab.{role}`", "", f"{main.get('short_description', '').rstrip('.')}.", ""]
    for para in main.get("description") or []:
        out += [" ".join(str(para).split()), ""]
    out += [f"In gpulab it runs from `{playbook}` on `{hosts}`, which passes it the inventory's values.", ""]
    defaults_file = role_dir / "defaults/main.yml"
    defaults = (yaml.safe_load(defaults_file.read_text()) or {}) if defaults_file.exists() else {}
    for entry, spec in specs.items():
        options = spec.get("options") or {}
        title = (
            "Variables" if entry == "main" else f"Entry point `{entry}`: {spec.get('short_description', '')}"
        )
        out += [f"## {title}", ""]
        if entry != "main":
            out += [" ".join(" ".join(str(d).split()) for d in spec.get("description") or []), ""]
        if not options:
            out += ["No variables.", ""]
            continue
        out += ["| variable | type | required | default | meaning |", "|---|---|---|---|---|"]
        for name, opt in sorted(options.items()):
            default = defaults.get(name, opt.get("default"))
            kind = opt.get("type", "str") + (f" of {opt['elements']}" if opt.get("elements") else "")
            req = "yes" if opt.get("required") else ""
            out.append(
                f"| `{name}` | {kind} | {req} | {_cell(default)} | {_text(opt.get('description', ''))} |"
            )
        out.append("")
    if defaults_file.exists() and defaults:
        out += ["## Defaults", "", "`defaults/main.yml`, with its comments:", "", "```yaml"]
        out += [defaults_file.read_text().rstrip(), "```", ""]
    out += ["## Example play", "", "```yaml", _example_play(role, main.get("options") or {}), "```"]
    return "\n".join(out)


def update_role_readme(role_dir: Path) -> bool:
    """Write the generated part of roles/<role>/README.md; text outside the markers is kept."""
    path = role_dir / "README.md"
    block = f"{ROLE_START}\n{render_role_readme(role_dir)}\n{ROLE_END}"
    text = path.read_text() if path.exists() else ""
    if ROLE_START in text:
        new = _replace_between(text, ROLE_START, ROLE_END, render_role_readme(role_dir))
    else:
        new = block + "\n" + (f"\n{text}" if text else "")
    return _write(path, new)


def roles(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.glob("roles/*/meta/argument_specs.yml"))


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


# --- the data-flow picture of docs/architecture.md -------------------------------------------------------------
DATA_FLOW = "docs/data-flow.svg"

# (title, files) of each step, left to right: what a run reads and hands on.
FLOW = [
    ("inventory", ["inventory/<lab>/", "hosts.yml, group_vars,", "host_vars"]),
    ("lab definition", ["library/gpulab/labdef/", "catalogue.yml, checks", "gpulab plan"]),
    ("preflight facts", ["playbooks/preflight.yml", "plugins/action/preflight", "gpulab_vms, gpulab_router"]),
    ("roles", ["roles/<role>/", "tasks, defaults,", "meta/argument_specs.yml"]),
    ("modules", ["plugins/modules/", "plugins/action/", "module_utils, plugin_utils"]),
    ("engine", ["library/gpulab/", "pve/, routers/, k8s/", "tasks/, cards.py"]),
]
# What the engine and the roles talk to: your lab, or the simulated one beside it.
TARGETS = [
    ("your lab", ["Proxmox VE API (HTTPS, token)", "router (HTTP, SSH, REST)", "node and VMs over SSH"]),
    (
        "simulated lab: library/labsim/",
        ["PVE API from the official schema", "dnsmasq, Kea in namespaces", "sshd hosts, k3s/HAMi stand-ins"],
    ),
]


def _box(x: int, y: int, w: int, h: int, title: str, lines: list[str], fill: str) -> list[str]:
    out = [
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="#334155"/>',
        f'<text x="{x + w // 2}" y="{y + 22}" text-anchor="middle" font-weight="bold">{title}</text>',
    ]
    for i, line in enumerate(lines):
        out.append(
            f'<text x="{x + w // 2}" y="{y + 44 + 17 * i}" text-anchor="middle" font-size="12">'
            f"{line.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}</text>"
        )
    return out


def _arrow(x1: int, y1: int, x2: int, y2: int, label: str = "") -> list[str]:
    out = [f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#334155" marker-end="url(#arrow)"/>']
    if label:
        out.append(
            f'<text x="{(x1 + x2) // 2}" y="{(y1 + y2) // 2 - 6}" text-anchor="middle" font-size="11">{label}</text>'
        )
    return out


def render_data_flow() -> str:
    """An SVG of the data flow: the six steps in a row, the two targets below the engine and the modules."""
    w, h, gap, top = 170, 100, 30, 40
    width = len(FLOW) * w + (len(FLOW) - 1) * gap + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="360" viewBox="0 0 {width} 360" '
        'font-family="sans-serif" font-size="14" fill="#0f172a">',
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
        '<path d="M0,0 L10,4 L0,8 z" fill="#334155"/></marker></defs>',
        f'<rect width="{width}" height="360" fill="#ffffff"/>',
        '<text x="20" y="26" font-size="13">gpulab: what a run reads and hands on (docs/architecture.md)</text>',
    ]
    for i, (title, lines) in enumerate(FLOW):
        x = 20 + i * (w + gap)
        parts += _box(x, top, w, h, title, lines, "#e0f2fe" if i < 3 else "#dcfce7")
        if i:
            parts += _arrow(x - gap, top + h // 2, x - 2, top + h // 2)
    tw, ty = 2 * w + gap, 230
    for j, (title, lines) in enumerate(TARGETS):
        x = width - 20 - (2 - j) * tw - (1 - j) * gap
        parts += _box(x, ty, tw, h, title, lines, "#fef3c7" if j == 0 else "#ede9fe")
    engine_x = 20 + (len(FLOW) - 1) * (w + gap) + w // 2
    modules_x = 20 + (len(FLOW) - 2) * (w + gap) + w // 2
    first_target = width - 20 - 2 * tw - gap + tw // 2
    second_target = width - 20 - tw + tw // 2
    # both layers talk to the lab a run names; the simulated lab answers the same calls in its place
    parts += _arrow(modules_x, top + h, first_target - 40, ty - 2, "SSH (roles' tasks)")
    parts += _arrow(engine_x, top + h, first_target + 40, ty - 2, "PVE API, router")
    mid_y = ty + h // 2
    parts += [
        f'<line x1="{first_target + tw // 2}" y1="{mid_y}" x2="{second_target - tw // 2}" y2="{mid_y}" '
        'stroke="#334155" stroke-dasharray="4 3"/>',
        f'<text x="{(first_target + second_target) // 2}" y="{mid_y - 6}" text-anchor="middle" font-size="11">or</text>',
    ]
    parts += [
        f'<text x="20" y="{ty + 30}" font-size="12">Both targets answer the same calls:</text>',
        f'<text x="20" y="{ty + 48}" font-size="12">inventory/homelab is a real lab,</text>',
        f'<text x="20" y="{ty + 66}" font-size="12">inventory/demo the simulated one</text>',
        f'<text x="20" y="{ty + 84}" font-size="12">(`make demo`, the tests).</text>',
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def update_data_flow(root: Path) -> bool:
    return _write(root / DATA_FLOW, render_data_flow())


# --- the stage-order picture of docs/architecture.md -----------------------------------------------------------
STAGE_ORDER = "docs/stage-order.svg"
SITE = "playbooks/site.yml"


def site_stages(root: Path) -> list[dict]:
    """What site.yml runs, in order: each playbook it imports (its last, the lock's release, aside) as {title
    (the import's name), opt_in, hosts (the host patterns of its stage plays), does (what its plays say after
    " | ")}. Read from the playbooks themselves, so the picture follows them."""
    out = []
    for entry in yaml.safe_load((root / SITE).read_text()):
        path = root / "playbooks" / entry["ansible.builtin.import_playbook"]
        if path.name == "run_lock_release.yml":
            continue
        title, _, note = entry["name"].partition(" (")
        plays = [p for p in yaml.safe_load(path.read_text()) if "hosts" in p and " | " in p.get("name", "")]
        own = [p for p in plays if not p["name"].startswith(("Preflight |", "Run lock |"))] or plays
        hosts = list(dict.fromkeys(_where(p["hosts"]) for p in own))
        does = list(dict.fromkeys(p["name"].partition(" | ")[2] for p in own))
        out.append({"title": title, "opt_in": note.startswith("opt-in"), "hosts": hosts, "does": does})
    return out


def _where(pattern: str) -> str:
    """A play's host pattern as the picture says it (a templated one, "{{ 'none' if X else 'localhost' }}", as
    the hosts it runs on when it runs)."""
    pattern = str(pattern)
    templated = re.search(r"else '([^']+)'\s*}}$", pattern)
    if templated:
        pattern = templated.group(1)
    if pattern == "localhost":
        return "the controller"
    if pattern.startswith("proxmox"):
        return "each PVE node"
    if pattern == "vms":
        return "each VM"
    return "the k3s nodes" if "k3s" in pattern else pattern


def _wrapped(texts: list[str], width: int, lines: int) -> list[str]:
    words = "; ".join(texts).split()
    out: list[str] = []
    for word in words:
        if out and len(out[-1]) + 1 + len(word) <= width:
            out[-1] += " " + word
        else:
            out.append(word)
    return out[: lines - 1] + (
        [" ".join(out[lines - 1 :])[: width - 3] + "..."] if len(out) > lines else out[lines - 1 : lines]
    )


def render_stage_order(root: Path) -> str:
    """An SVG of site.yml's stages in the order it runs them, five a row, each with where it runs and what its
    plays do; the opt-in stages dashed."""
    stages = site_stages(root)
    per_row, w, h, gap_x, gap_y, top = 5, 220, 166, 26, 40, 40
    rows = -(-len(stages) // per_row)
    width = per_row * w + (per_row - 1) * gap_x + 40
    height = top + rows * h + (rows - 1) * gap_y + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="14" fill="#0f172a">',
        '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" refY="4" orient="auto">'
        '<path d="M0,0 L10,4 L0,8 z" fill="#334155"/></marker></defs>',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="20" y="26" font-size="13">gpulab: the stages site.yml runs, in order ({SITE}; dashed: opt-in, '
        "--tags)</text>",
    ]
    for i, stage in enumerate(stages):
        row, col = divmod(i, per_row)
        x, y = 20 + col * (w + gap_x), top + row * (h + gap_y)
        lines = [*_wrapped(["on " + ", ".join(stage["hosts"])], 30, 2), *_wrapped(stage["does"], 30, 5)]
        box = _box(x, y, w, h, stage["title"], lines, "#f1f5f9" if stage["opt_in"] else "#e0f2fe")
        if stage["opt_in"]:
            box[0] = box[0].replace("/>", ' stroke-dasharray="6 4"/>')
        parts += box
        if col:
            parts += _arrow(x - gap_x, y + h // 2, x - 2, y + h // 2)
        elif row:  # from the end of the row above to the start of this one
            parts += _arrow(20 + (per_row - 1) * (w + gap_x) + w // 2, y - gap_y, x + w // 2, y - 2)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def update_stage_order(root: Path) -> bool:
    return _write(root / STAGE_ORDER, render_stage_order(root))


# pve_vm's argument spec: its option table gpulab.pve.vmoptions (which also maps each option to PVE's keys) with
# the PVE connection options, written into the module file as a Python literal so that Ansible and ansible-test's
# validate-modules read the module's real arguments without the engine. `make docs` writes it (then `ruff format`
# lays it out); tests/unit/test_module_docs.py checks the file's spec is the table's. The other controller modules'
# specs are plain data kept by hand in their files, the one place they are declared, in the same layout: an
# option's suboptions that take more than a line are named above the spec (`<OPTION>_OPTIONS = dict(...)`), so
# that the spec itself is one option a line.
VM_SPEC_START = "# generated from gpulab.pve.vmoptions by `make docs`: edit its OPTIONS, not these lines\n"
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


def render_vm_argument_spec() -> str:
    """The generated lines of pve_vm: ARGUMENT_SPEC (the table's options, then the connection's) and RULES
    (AnsibleModule's keyword arguments between options), one option a line (`ruff format` splits long ones)."""
    from gpulab.pve import vmoptions

    # the connection options and their rules: plugins/module_utils/pve.py, once for every PVE module
    code = _spec_code(VM_SPEC_START, "ARGUMENT_SPEC", vmoptions.argument_spec(), "    **pve.CONNECTION,\n")
    return _formatted(code + "RULES = pve.CONNECTION_RULES\n" + SPEC_END, "pve_vm")


class _Name:
    """Stands for a module-level name while the spec is rendered: written as the name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _spec_code(start: str, name: str, spec: dict, spread: str = "") -> str:
    """`start`, then `name = dict(...)` of the argument spec `spec`, one option a line, `spread` last; an
    option's suboptions are declared before it as `<OPTION>_OPTIONS = dict(...)` and named in its line."""
    named, options = [], []
    for option, entry in spec.items():
        if "options" in entry:
            sub = _Name(f"{option.upper()}_OPTIONS")
            named.append(_spec_code("", sub.name, entry["options"]))
            entry = {**entry, "options": sub}
        options.append(f"    {option}={_literal(entry)},\n")
    return "".join([start, *named, f"{name} = dict(\n", *options, spread, ")\n"])


def _generated_block(text: str, start: str, where: str) -> str:
    """The generated lines of the file `where` (its `text`): from the line `start` to SPEC_END."""
    if start not in text:
        raise ValueError(f"{where} has no line {start.strip()!r}")
    return start + text.split(start, 1)[1].split(SPEC_END, 1)[0] + SPEC_END


CONNECTION_MODULE = "plugins/module_utils/pve.py"
CONNECTION_START = (
    "# generated from gpulab.pve.connection by `make docs`: edit its OPTIONS, not these lines\n"
)


def render_connection_spec() -> str:
    """The generated lines of plugins/module_utils/pve.py: the PVE connection options every PVE module spreads
    into its ARGUMENT_SPEC, and their rules (AnsibleModule's keyword arguments)."""
    from gpulab.pve import connection

    rules = {k: [list(group) for group in v] for k, v in connection.MODULE_KWARGS.items()}
    code = _spec_code(CONNECTION_START, "CONNECTION", connection.argument_spec(_Fallback()))
    return _formatted(f"{code}CONNECTION_RULES = {_literal(rules)}\n{SPEC_END}", "../module_utils/pve")


def connection_spec_block(text: str) -> str:
    return _generated_block(text, CONNECTION_START, CONNECTION_MODULE)


def update_connection_spec(root: Path) -> bool:
    return _rewrite_block(root / CONNECTION_MODULE, connection_spec_block, render_connection_spec)


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


def vm_argument_spec_block(text: str) -> str:
    return _generated_block(text, VM_SPEC_START, VM_MODULE)


def update_vm_argument_spec(root: Path) -> bool:
    return _rewrite_block(root / VM_MODULE, vm_argument_spec_block, render_vm_argument_spec)


def main(root: Path) -> None:
    said = {True: "updated", False: "up to date"}
    print(f"{VARIABLES} {said[update_variables(root)]}")
    for path in update_commands(root):
        print(f"{path.relative_to(root)}: command blocks updated")
    for role_dir in roles(root):
        if update_role_readme(role_dir):
            print(f"{role_dir.relative_to(root)}/README.md updated")
    print(f"{DATA_FLOW} {said[update_data_flow(root)]}")
    print(f"{STAGE_ORDER} {said[update_stage_order(root)]}")
    print(f"{VM_MODULE} options {said[update_vm_module(root)]}")
    print(f"{ROUTER_MODULE} options {said[update_router_module(root)]}")
    print(f"{CONNECTION_MODULE} connection options {said[update_connection_spec(root)]}")
    print(f"{VM_MODULE} argument spec {said[update_vm_argument_spec(root)]}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
