"""What README tells the user to type, read back for the tests that check or run it."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def root_commands(tool: str) -> list[str]:
    """The `# <tool> ...` commands (root's prompt on the node) of README's console blocks, prompt and trailing
    comment removed, continued lines (a backslash before the line's end, as the shell reads it) joined."""
    blocks = [b.replace("\\\n", "") for b in re.findall(r"```console\n(.*?)```", README.read_text(), re.S)]
    return [
        ln[2:].split("  #")[0].strip() for b in blocks for ln in b.splitlines() if ln.startswith(f"# {tool} ")
    ]
