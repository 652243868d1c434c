#!/usr/bin/env python3
"""Make gpulab's table of NVIDIA cards: each PCI device id's chip, architecture and open-kernel-module support.

Two inputs, both pinned:

- ``pci.ids`` of pciutils/pciids: every NVIDIA device id with its chip code name (``GA102 [GeForce RTX 3090]``);
  the chip's letters name the architecture (GM Maxwell, GP Pascal, GV Volta, TU Turing, GA Ampere, AD Ada,
  GH Hopper, GB Blackwell: NVIDIA's chip naming). Only display/3D chips of those families are kept (their
  audio, USB and bridge functions are not cards).
- ``README.md`` of NVIDIA/open-gpu-kernel-modules at a 580 tag, section "Compatible GPUs": the device ids the
  open kernel modules support ("any Turing or later GPU").

Support per device (``open``): ``required`` for Blackwell and Grace Hopper (GH200), where NVIDIA supports only
the open modules; ``recommended`` for a listed device (the open modules are NVIDIA's default since 560);
``unsupported`` for Maxwell, Pascal and Volta (580 is their last branch, proprietary modules only); ``unlisted``
for a Turing-or-newer id the README does not list (gpulab then keeps the proprietary modules).

    git -C <pciids mirror> show c1c12547:pci.ids > /tmp/pci.ids
    git -C <open-gpu-kernel-modules mirror> show 580.142:README.md > /tmp/ogkm-README.md
    scripts/nvidia_gpu_table.py --pci-ids /tmp/pci.ids --open-readme /tmp/ogkm-README.md \
        --pci-ids-commit c1c12547d626ebf05fd0223144ad87fab5e95d06 \
        --open-tag 580.142 --open-commit 1a5075f82128be3603d4a4657c7b689234306778 \
        --out library/gpulab/data/nvidia-gpus.json

The output is deterministic (sorted keys), so the same inputs give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ARCHITECTURES = {
    "GM": "maxwell",
    "GP": "pascal",
    "GV": "volta",
    "TU": "turing",
    "GA": "ampere",
    "AD": "ada",
    "GH": "hopper",
    "GB": "blackwell",
}
PROPRIETARY_ONLY = ("maxwell", "pascal", "volta")
_CHIP = re.compile(r"^(?P<chip>(?P<family>GM|GP|GV|TU|GA|AD|GH|GB)\d+[A-Z]*)\b")
_NOT_A_CARD = re.compile(r"Audio|USB|UCSI|Serial Bus|[Bb]ridge|NVSwitch|NVLink", re.IGNORECASE)
_README_ROW = re.compile(
    r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<ids>[0-9A-F]{4}(?: [0-9A-F]{4} [0-9A-F]{4})?)\s*\|$"
)


def nvidia_devices(pci_ids: str) -> dict[str, str]:
    """{device id (4 lower-case hex): name} of vendor 10de in pci.ids."""
    out: dict[str, str] = {}
    inside = False
    for line in pci_ids.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            inside = line.startswith("10de ")
            continue
        if inside and not line.startswith("\t\t"):
            dev, _, name = line.strip().partition(" ")
            out[dev.lower()] = name.strip()
    return out


def open_listed(readme: str) -> dict[str, str]:
    """{device id: product name} of the README's "Compatible GPUs" table (first product name per id)."""
    section = readme.split("## Compatible GPUs", 1)
    if len(section) != 2:
        raise SystemExit("the README has no 'Compatible GPUs' section")
    out: dict[str, str] = {}
    for line in section[1].splitlines():
        m = _README_ROW.match(line.strip())
        if m:
            out.setdefault(m.group("ids").split()[0].lower(), m.group("name"))
    return out


def table(pci_ids: str, readme: str) -> dict[str, dict[str, str]]:
    devices = nvidia_devices(pci_ids)
    listed = open_listed(readme)
    out: dict[str, dict[str, str]] = {}
    for dev, name in devices.items():
        m = _CHIP.match(name)
        if not m or _NOT_A_CARD.search(name):
            continue
        arch = ARCHITECTURES[m.group("family")]
        if arch in PROPRIETARY_ONLY:
            support = "unsupported"
        elif arch == "blackwell" or "GH200" in name:
            support = "required"
        elif dev in listed:
            support = "recommended"
        else:
            support = "unlisted"
        out[dev] = {"name": name, "chip": m.group("chip"), "architecture": arch, "open": support}
    missing = sorted(set(listed) - set(out))
    if missing:  # a card the open modules list that pci.ids does not name with its chip: say so, keep going
        print(
            f"note: {len(missing)} open-listed ids without a chip name in pci.ids: {' '.join(missing)}",
            file=sys.stderr,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pci-ids", required=True, type=Path)
    p.add_argument("--open-readme", required=True, type=Path)
    p.add_argument("--pci-ids-commit", required=True)
    p.add_argument("--open-tag", required=True)
    p.add_argument("--open-commit", required=True)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    devices = table(a.pci_ids.read_text(encoding="utf-8"), a.open_readme.read_text(encoding="utf-8"))
    doc = {
        "provenance": {
            "made_by": "scripts/nvidia_gpu_table.py",
            "pci_ids": {
                "url": "https://github.com/pciutils/pciids/blob/master/pci.ids",
                "commit": a.pci_ids_commit,
                "licence": "pci.ids is GPL-2.0-or-later or BSD-3-Clause; only ids, chip and product names are kept",
            },
            "open_kernel_modules": {
                "url": f"https://github.com/NVIDIA/open-gpu-kernel-modules/blob/{a.open_tag}/README.md#compatible-gpus",
                "tag": a.open_tag,
                "commit": a.open_commit,
                "licence": "MIT (the repository); only the device ids of its Compatible GPUs table are used",
            },
            "rules": "architecture from the chip letters; open: required (Blackwell, GH200), recommended (listed), "
            "unsupported (Maxwell, Pascal, Volta), unlisted (Turing or newer, not listed)",
        },
        "devices": devices,
    }
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    counts: dict[str, int] = {}
    for d in devices.values():
        counts[d["architecture"]] = counts.get(d["architecture"], 0) + 1
    print(
        f"wrote {a.out}: {len(devices)} devices " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
