"""The commands the docs tell the user to type, read from their one source (library/gpulab/data/commands.yml,
which `make docs` writes into README.md and docs/*.md), for the tests that check or run them."""

from __future__ import annotations

from pathlib import Path

from gpulab import docs

ROOT = Path(__file__).resolve().parents[1]


def commands(block: str | None = None) -> list[str]:
    """Every command of one block (or of all blocks), without prompt or comment."""
    blocks = docs.load_commands(ROOT)
    chosen = [blocks[block]] if block else list(blocks.values())
    return [c["run"] for b in chosen for c in b["commands"]]


def root_commands(tool: str) -> list[str]:
    """The commands the docs have root type on the node (prompt `#`) that start with `tool`."""
    blocks = docs.load_commands(ROOT).values()
    return [
        c["run"]
        for b in blocks
        if b.get("prompt") == "#"
        for c in b["commands"]
        if c["run"].startswith(f"{tool} ")
    ]
