"""A stand-in for OpenWrt's `uci` command line, for testing the OpenWrt SSH backend without a router.

    python -m labsim.routers.openwrt_uci [-q] [-X] [-c CONFDIR] COMMAND ...

Covers what the backend uses, with uci's output formats and exit codes: `show CONFIG`
(`config.section=type`, `config.section.option='value'`, lists as `'a' 'b'`; anonymous sections
as `@type[n]`, or their `cfgXXXXXX` names with -X), `get`, `set` (section or option), `add_list`,
`del_list`, `delete`, `changes`, `revert`, `commit`. Changes are staged apart from the committed
file (like /tmp/.uci) until `commit`; `show`/`get` see them. Errors print `uci: Entry not found`
or `uci: Invalid argument` on stderr and exit 1. CONFDIR defaults to $GPULAB_UCI_DIR.
The committed files use UCI's text format (`config host 'name'`, `option mac '...'`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path


class UciError(Exception):
    pass


def parse(text: str) -> list[dict]:
    sections: list[dict] = []
    for n, line in enumerate(text.splitlines()):
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "config":
            name = words[2] if len(words) > 2 else f"cfg{(len(sections) * 0x1F3B + 0x10000) & 0xFFFFFF:06x}"
            sections.append({".type": words[1], ".name": name, ".anonymous": len(words) <= 2, "opts": {}})
        elif words[0] in ("option", "list") and sections and len(words) >= 3:
            opts = sections[-1]["opts"]
            if words[0] == "list":
                opts.setdefault(words[1], [])
                if not isinstance(opts[words[1]], list):
                    opts[words[1]] = [opts[words[1]]]
                opts[words[1]].append(words[2])
            else:
                opts[words[1]] = words[2]
        else:
            raise UciError(f"parse error at line {n + 1}")
    return sections


def render(sections: list[dict]) -> str:
    out = []
    for s in sections:
        out.append(f"config {s['.type']}" + ("" if s[".anonymous"] else f" '{s['.name']}'"))
        for k, v in s["opts"].items():
            for item in v if isinstance(v, list) else [v]:
                out.append(f"\t{'list' if isinstance(v, list) else 'option'} {k} '{item}'")
        out.append("")
    return "\n".join(out)


class Uci:
    def __init__(self, confdir: Path):
        self.dir = confdir
        self.stage = confdir / ".uci"

    def load(self, config: str, staged=True) -> list[dict]:
        sp = self.stage / config
        if staged and sp.exists():
            return json.loads(sp.read_text())
        f = self.dir / config
        if not f.exists():
            raise UciError("Entry not found")
        return parse(f.read_text())

    def save(self, config: str, sections: list[dict]) -> None:
        self.stage.mkdir(exist_ok=True)
        (self.stage / config).write_text(json.dumps(sections))

    @staticmethod
    def find(sections, ref: str) -> dict:
        m = re.fullmatch(r"@(\w+)\[(-?\d+)\]", ref)
        if m:
            typed = [s for s in sections if s[".type"] == m.group(1)]
            try:
                return typed[int(m.group(2))]
            except IndexError:
                raise UciError("Entry not found") from None
        for s in sections:
            if s[".name"] == ref:
                return s
        raise UciError("Entry not found")

    def split(self, path: str):
        parts = path.split(".", 2)
        if len(parts) < 2 or not all(parts):
            raise UciError("Invalid argument")
        return parts[0], parts[1], parts[2] if len(parts) == 3 else None

    def show(self, config: str, real_names: bool) -> str:
        sections = self.load(config)
        lines, counts = [], {}
        for s in sections:
            n = counts.get(s[".type"], 0)
            counts[s[".type"]] = n + 1
            name = s[".name"] if (real_names or not s[".anonymous"]) else f"@{s['.type']}[{n}]"
            lines.append(f"{config}.{name}={s['.type']}")
            for k, v in s["opts"].items():
                vals = v if isinstance(v, list) else [v]
                lines.append(f"{config}.{name}.{k}=" + " ".join(f"'{x}'" for x in vals))
        return "\n".join(lines)

    def run(self, args: list[str]) -> str:
        cmd, rest = args[0], args[1:]
        if cmd == "show":
            return self.show(rest[0], "-X" in self.flags)
        if cmd in ("changes", "revert", "commit"):
            config = rest[0]
            staged = self.stage / config
            if cmd == "changes":
                if not staged.exists():
                    return ""
                return "\n".join(
                    line
                    for line in self.show(config, True).splitlines()
                    if line not in self._committed_lines(config)
                )
            if cmd == "commit" and staged.exists():
                (self.dir / config).write_text(render(json.loads(staged.read_text())))
            staged.unlink(missing_ok=True)
            return ""
        if not rest:
            raise UciError("Invalid argument")
        path, _, value = rest[0].partition("=")
        config, ref, opt = self.split(path)
        sections = self.load(config)
        if cmd == "get":
            s = self.find(sections, ref)
            if opt is None:
                return s[".type"]
            if opt not in s["opts"]:
                raise UciError("Entry not found")
            v = s["opts"][opt]
            return " ".join(v) if isinstance(v, list) else v
        if cmd == "set":
            if not value:
                raise UciError("Invalid argument")
            if opt is None:
                if not re.fullmatch(r"[A-Za-z0-9_]+", ref):
                    raise UciError("Invalid argument")
                try:
                    self.find(sections, ref)[".type"] = value
                except UciError:
                    sections.append({".type": value, ".name": ref, ".anonymous": False, "opts": {}})
            else:
                self.find(sections, ref)["opts"][opt] = value
        elif cmd in ("add_list", "del_list"):
            s = self.find(sections, ref)
            cur = s["opts"].get(opt, [])
            cur = cur if isinstance(cur, list) else [cur]
            cur = [*cur, value] if cmd == "add_list" else [x for x in cur if x != value]
            s["opts"][opt] = cur
        elif cmd == "delete":
            s = self.find(sections, ref)
            if opt is None:
                sections.remove(s)
            elif s["opts"].pop(opt, None) is None:
                raise UciError("Entry not found")
        else:
            raise UciError("Invalid argument")
        self.save(config, sections)
        return ""

    def _committed_lines(self, config: str) -> set[str]:
        staged = self.stage / config
        data = staged.read_text()
        staged.unlink()
        try:
            return set(self.show(config, True).splitlines())
        finally:
            staged.write_text(data)


def main(argv: list[str]) -> int:
    flags, confdir = [], os.environ.get("GPULAB_UCI_DIR", "/etc/config")
    while argv and argv[0].startswith("-"):
        if argv[0] == "-c":
            confdir, argv = argv[1], argv[2:]
        else:
            flags.append(argv[0])
            argv = argv[1:]
    if not argv:
        print("Usage: uci [<options>] <command> [<arguments>]", file=sys.stderr)
        return 1
    uci = Uci(Path(confdir))
    uci.flags = flags
    try:
        out = uci.run(argv)
    except UciError as e:
        if "-q" not in flags:
            print(f"uci: {e}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
