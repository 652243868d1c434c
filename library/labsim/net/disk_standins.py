#!/usr/bin/python3
"""Stand-ins for the disk tools of an ISO-installed lab guest: its boot disk, partitions and LVM root.

A lab VM host has no block devices of its own, so an Ubuntu guest installed from the ISO gets its
disk as two small files, read and changed by these stand-ins (installed as
``/usr/local/lib/gpulab/disk.py``, one wrapper per command, each call logged like
:mod:`labsim.net.command_standins`):

* the virtual hardware, ``/run/gpulab-sim/hw/disks.json`` (``{"sda": bytes, "sr0": bytes or null}``):
  written from outside by the lab at each start and after each resize through the API, so the disk
  follows the VM config's ``scsi0`` size (a resize makes the disk bigger and leaves the partition table,
  the PV and the LV as they were, as on a real guest);
* what is on the disk, ``/var/lib/gpulab-sim/disk/layout.json`` (on the guest's own disk, so it survives
  reboots): the GPT partitions the Ubuntu installer made (BIOS boot or ESP, ``/boot``, the LVM PV),
  the PV's size, volume group ``ubuntu-vg`` and logical volume ``ubuntu-lv`` with its ext4 ``/``.

Commands: ``lsblk``, ``findmnt`` (for ``/``, ``/boot`` and ``/boot/efi``; anything else goes to the real
one), ``pvs``/``vgs``/``lvs``, ``pvresize``, ``lvextend``/``lvresize`` (``-r`` runs the resize2fs
stand-in), ``resize2fs`` and ``growpart``, with the real tools' options that matter and their wording
(Ubuntu 24.04's util-linux 2.39.3, lvm2 2.03.16, e2fsprogs 1.47.0, cloud-guest-utils 0.33; the upstream file of
each behaviour is in library/labsim/UPSTREAM.md). As growpart 0.33 does, a partition that holds an LVM PV has
its PV resized right after it grew, and a partition that could grow by less than 1 MiB (growpart's fudge) is
NOCHANGE. Shrinking is refused.

Standard library only; ``GPULAB_DISK_HW`` and ``GPULAB_DISK_LAYOUT`` name other files (tests).
"""

import json
import math
import os
import sys
import time

# the guest's stand-in log (command_standins.LOG); a test run on this machine points it elsewhere
LOG = os.environ.get("GPULAB_STANDINS_LOG") or "/var/log/gpulab-standins.log"
HW = os.environ.get("GPULAB_DISK_HW", "/run/gpulab-sim/hw/disks.json")
LAYOUT = os.environ.get("GPULAB_DISK_LAYOUT", "/var/lib/gpulab-sim/disk/layout.json")
SECTOR = 512
MiB = 2**20
GiB = 2**30
EXTENT = 4 * MiB
PE_START = MiB
GPT_TAIL = 33  # the backup GPT's 32 entry sectors and header: the last usable sector is total - 34
FUDGE = MiB // SECTOR  # growpart's GROWPART_FUDGE (1 MiB), in sectors
VG, LV = "ubuntu-vg", "ubuntu-lv"
DM_NAME = "ubuntu--vg-ubuntu--lv"
LV_DEV = f"/dev/mapper/{DM_NAME}"


class Fail(Exception):
    """A refusal: its message (on stderr, or on stdout where the tool prints it there) and exit code."""

    def __init__(self, message, rc=5, stream="stderr"):
        super().__init__(message)
        self.rc, self.stream = rc, stream


# --- the installation (what the Ubuntu installer's guided LVM layout leaves) ------------------------------


def root_lv_bytes(vg_bytes):
    """The installer's root LV size: all of a small VG, 10 GiB up to 20 GiB, then half, at most 100 GiB."""
    if vg_bytes < 10 * GiB:
        return vg_bytes
    if vg_bytes < 20 * GiB:
        return 10 * GiB
    return min(vg_bytes // 2, 100 * GiB)


def install_layout(disk_bytes, efi):
    """The layout an Ubuntu 24.04 ISO install with guided LVM writes on a disk of ``disk_bytes``."""
    total = disk_bytes // SECTOR
    if efi:
        parts = [
            {"number": 1, "start": 2048, "sectors": 2201600, "fstype": "vfat", "mount": "/boot/efi",
             "type": "EFI System"},
            {"number": 2, "start": 2203648, "sectors": 4194304, "fstype": "ext4", "mount": "/boot"},
        ]  # fmt: skip
    else:
        parts = [
            {"number": 1, "start": 2048, "sectors": 2048, "fstype": None, "mount": None, "type": "BIOS boot"},
            {"number": 2, "start": 4096, "sectors": 4194304, "fstype": "ext4", "mount": "/boot"},
        ]
    start = parts[-1]["start"] + parts[-1]["sectors"]
    sectors = (total - GPT_TAIL - 1 - start) // 2048 * 2048  # aligned to 1 MiB, as the installer does
    parts.append({"number": 3, "start": start, "sectors": sectors, "fstype": "LVM2_member", "mount": None})
    pv_bytes = sectors * SECTOR
    pe_count = (pv_bytes - PE_START) // EXTENT
    lv_extents = root_lv_bytes(pe_count * EXTENT) // EXTENT
    return {
        "disk": "sda",
        "installed_bytes": disk_bytes,
        "partitions": parts,
        "pv": {"device": "/dev/sda3", "bytes": pv_bytes},
        "vg": {"name": VG, "extent_bytes": EXTENT},
        "lvs": [{"name": LV, "extents": lv_extents, "fs_bytes": lv_extents * EXTENT, "mount": "/"}],
    }


# --- state ------------------------------------------------------------------------------------------------


def load_layout():
    with open(LAYOUT) as f:
        return json.load(f)


def save_layout(layout):
    tmp = LAYOUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(layout, f, indent=1, sort_keys=True)
    os.replace(tmp, LAYOUT)


def hardware():
    try:
        with open(HW) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def disk_bytes(layout):
    return int(hardware().get("sda") or layout["installed_bytes"])


def pe_count(layout):
    return (int(layout["pv"]["bytes"]) - PE_START) // int(layout["vg"]["extent_bytes"])


def free_extents(layout):
    return pe_count(layout) - sum(int(lv["extents"]) for lv in layout["lvs"])


def partition(layout, number):
    return next((p for p in layout["partitions"] if p["number"] == number), None)


def find_lv(layout, spec):
    """The LV a command names: vg/lv, /dev/vg/lv, /dev/mapper/vg-lv (dashes doubled)."""
    for lv in layout["lvs"]:
        dm = f"{VG.replace('-', '--')}-{lv['name'].replace('-', '--')}"
        if spec in (f"{VG}/{lv['name']}", f"/dev/{VG}/{lv['name']}", f"/dev/mapper/{dm}", f"/dev/dm-{0}"):
            return lv
    return None


# --- size formatting --------------------------------------------------------------------------------------


def lvm_size(value, units="r", suffix=True):
    """A size as lvm prints it: ``<29.00g`` (the default rounded units), ``29692.00m``, ``62277025792B``."""
    if units in ("b", "B"):
        return f"{value}B" if suffix else str(value)
    if units in ("s", "S"):
        return f"{value // SECTOR}S" if suffix else str(value // SECTOR)
    if units in ("r", "R", "h", "H"):
        base = 1000 if units in ("R", "H") else 1024
        letters = "bkmgtpe"
        i = 0
        v = float(value)
        while v >= base and i < len(letters) - 1:
            v /= base
            i += 1
        shown = round(v, 2)
        mark = ""
        if units in ("r", "R") and abs(shown - v) > 1e-9:
            mark = "<" if shown > v else ">"
        letter = letters[i] if units in ("r", "h") else letters[i].upper()
        text = f"{mark}{shown:.2f}"
        return text + (letter if letter != "b" else "B") if suffix else text
    base = 1024 if units.islower() else 1000
    power = "kmgtpe".index(units.lower()) + 1
    text = f"{value / base**power:.2f}"
    return text + units if suffix else text


def lvm_long_size(value):
    """``<29.00 GiB`` as lvextend's messages say it."""
    text = lvm_size(value, "r")
    unit = {"k": "KiB", "m": "MiB", "g": "GiB", "t": "TiB", "B": "B"}[text[-1]]
    return f"{text[:-1]} {unit}"


def human(value):
    """lsblk's SIZE: one decimal at most, in the largest unit that keeps it at 1 or more (``58G``, ``28.5G``)."""
    v = float(value)
    for unit in "BKMGTP":
        if v < 1024 or unit == "P":
            text = f"{v:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit if unit != 'B' else 'B'}"
        v /= 1024
    return str(value)


# --- lsblk ------------------------------------------------------------------------------------------------


def block_devices(layout):
    """The guest's block devices as lsblk sees them (a tree)."""
    lv = layout["lvs"][0]
    lv_dev = {
        "name": DM_NAME, "kname": "dm-0", "path": LV_DEV, "maj:min": "252:0", "rm": False,
        "size": int(lv["extents"]) * EXTENT, "ro": False, "type": "lvm", "mountpoint": lv["mount"],
        "fstype": "ext4", "pttype": None, "partn": None, "children": [],
    }  # fmt: skip
    parts = []
    for p in layout["partitions"]:
        parts.append({
            "name": f"sda{p['number']}", "kname": f"sda{p['number']}", "path": f"/dev/sda{p['number']}",
            "maj:min": f"8:{p['number']}", "rm": False, "size": p["sectors"] * SECTOR, "ro": False,
            "type": "part", "mountpoint": p.get("mount"), "fstype": p.get("fstype"), "pttype": "gpt",
            "partn": p["number"], "children": [lv_dev] if p["fstype"] == "LVM2_member" else [],
        })  # fmt: skip
    disks = [
        {
            "name": "sda", "kname": "sda", "path": "/dev/sda", "maj:min": "8:0", "rm": False,
            "size": disk_bytes(layout), "ro": False, "type": "disk", "mountpoint": None, "fstype": None,
            "pttype": "gpt", "partn": None, "children": parts,
        }
    ]  # fmt: skip
    sr0 = hardware().get("sr0", 0)
    if sr0 is not None:
        disks.append({
            "name": "sr0", "kname": "sr0", "path": "/dev/sr0", "maj:min": "11:0", "rm": True,
            "size": int(sr0 or 0), "ro": False, "type": "rom", "mountpoint": None,
            "fstype": "iso9660" if sr0 else None, "pttype": None, "partn": None, "children": [],
        })  # fmt: skip
    for d in disks + parts + [lv_dev]:
        pk = {"sda": None, "sr0": None, DM_NAME: "sda3"}.get(d["name"], "sda")
        d["pkname"] = pk
    return disks


LSBLK_DEFAULT = ["NAME", "MAJ:MIN", "RM", "SIZE", "RO", "TYPE", "MOUNTPOINTS"]
LSBLK_COLUMNS = ("NAME", "KNAME", "PATH", "MAJ:MIN", "RM", "SIZE", "RO", "TYPE", "MOUNTPOINT", "MOUNTPOINTS",
                 "FSTYPE", "PKNAME", "PTTYPE", "PARTN")  # fmt: skip


# lsblk's flags the stand-in honours: each spelling -> the option it turns on
LSBLK_FLAGS = {
    **dict.fromkeys(("-b", "--bytes"), "bytes"),
    **dict.fromkeys(("-J", "--json"), "json"),
    **dict.fromkeys(("-n", "--noheadings"), "noheadings"),
    **dict.fromkeys(("-l", "--list", "-r", "--raw"), "list"),
    **dict.fromkeys(("-P", "--pairs"), "pairs"),
    **dict.fromkeys(("-p", "--paths"), "paths"),
    **dict.fromkeys(("-d", "--nodeps"), "nodeps"),
}


def cmd_lsblk(argv):
    opts = dict.fromkeys(set(LSBLK_FLAGS.values()), False)
    columns = list(LSBLK_DEFAULT)
    devices = []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in LSBLK_FLAGS:
            opts[LSBLK_FLAGS[a]] = True
        elif a in ("-a", "--all", "-e", "--exclude", "-i", "--ascii") or a.startswith("--exclude="):
            if a in ("-e", "--exclude"):
                args.pop(0)
        elif a in ("-o", "--output") or a.startswith("--output="):
            spec = a.split("=", 1)[1] if "=" in a else args.pop(0)
            extra = spec.startswith("+")
            cols = [c.strip().upper() for c in spec.lstrip("+").split(",") if c.strip()]
            columns = (columns + cols) if extra else cols
        elif a.startswith("-o"):
            columns = [c.strip().upper() for c in a[2:].split(",") if c.strip()]
        elif a.startswith("-"):
            raise Fail(f"lsblk: unrecognized option '{a}'\nTry 'lsblk --help' for more information.", 1)
        else:
            devices.append(a)
    for c in columns:
        if c not in LSBLK_COLUMNS:
            raise Fail(f"lsblk: unknown column: {c}", 1)
    tree = block_devices(load_layout())
    if devices:
        chosen = []
        for dev in devices:
            found = _find_dev(tree, dev)
            if found is None:
                raise Fail(f"lsblk: {dev}: not a block device", 32)
            chosen.append(found)
        tree = chosen
    if opts["nodeps"]:
        tree = [{**d, "children": []} for d in tree]

    def value(d, col):
        key = col.lower()
        if col == "SIZE":
            return d["size"] if opts["bytes"] else human(d["size"])
        if col == "NAME":
            return d["path"] if opts["paths"] else d["name"]
        if col == "PKNAME":
            return (f"/dev/{d['pkname']}" if opts["paths"] else d["pkname"]) if d["pkname"] else None
        if col == "MOUNTPOINTS":
            return [d["mountpoint"]]
        return d[key]

    if opts["json"]:

        def node(d):
            out = {c.lower(): value(d, c) for c in columns}
            if d["children"] and not opts["list"]:
                out["children"] = [node(c) for c in d["children"]]
            return out

        flat = _flatten(tree) if opts["list"] else tree
        print(json.dumps({"blockdevices": [node(d) for d in flat]}, indent=3))
        return 0
    rows = []
    for d, prefix in _walk(tree, flat=opts["list"]):
        cells = []
        for c in columns:
            v = value(d, c)
            if isinstance(v, list):
                v = "\n".join(x for x in v if x) if v and v[0] else ""
            elif isinstance(v, bool):
                v = "1" if v else "0"
            elif v is None:
                v = ""
            cells.append(str(v))
        if "NAME" in columns and not opts["pairs"]:
            i = columns.index("NAME")
            cells[i] = prefix + cells[i]
        rows.append(cells)
    if opts["pairs"]:
        for cells in rows:
            print(" ".join(f'{c}="{v}"' for c, v in zip(columns, cells, strict=True)))
        return 0
    _print_table(columns, rows, opts["noheadings"], right={"SIZE", "MAJ:MIN", "RM", "RO", "PARTN"})
    return 0


def _find_dev(tree, dev):
    for d in _flatten(tree):
        if dev in (d["path"], d["name"], f"/dev/{d['name']}"):
            return d
    return None


def _flatten(tree):
    out = []
    for d in tree:
        out.append(d)
        out += _flatten(d["children"])
    return out


def _walk(tree, flat=False, lead=""):
    for i, d in enumerate(tree):
        last = i == len(tree) - 1
        prefix = ""
        if not flat and d["type"] not in ("disk", "rom"):
            prefix = lead + ("└─" if last else "├─")
        yield d, prefix
        if d["children"]:
            child_lead = (
                "" if flat else (lead + ("  " if last else "│ ") if d["type"] not in ("disk", "rom") else "")
            )
            yield from _walk(d["children"], flat, child_lead)


def _print_table(columns, rows, noheadings, right=()):
    table = rows if noheadings else [columns, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for r in table:
        cells = []
        for i, c in enumerate(columns):
            cells.append(r[i].rjust(widths[i]) if c in right else r[i].ljust(widths[i]))
        print(" ".join(cells).rstrip())


# --- findmnt ----------------------------------------------------------------------------------------------


def mounts(layout):
    lv = layout["lvs"][0]
    out = [
        {"target": "/", "source": LV_DEV, "fstype": "ext4", "options": "rw,relatime", "size": lv["fs_bytes"]}
    ]
    for p in layout["partitions"]:
        if p.get("mount"):
            out.append({"target": p["mount"], "source": f"/dev/sda{p['number']}", "fstype": p["fstype"],
                        "options": "rw,relatime", "size": p["sectors"] * SECTOR})  # fmt: skip
    return out


def cmd_findmnt(argv):
    args = list(argv)
    columns, target, json_out, noheadings, positional = (
        ["TARGET", "SOURCE", "FSTYPE", "OPTIONS"],
        None,
        False,
        False,
        [],
    )
    bytes_out = False
    while args:
        a = args.pop(0)
        if a in ("-n", "--noheadings"):
            noheadings = True
        elif a in ("-J", "--json"):
            json_out = True
        elif a in ("-b", "--bytes"):
            bytes_out = True
        elif a in ("-o", "--output"):
            columns = [c.strip().upper() for c in args.pop(0).split(",")]
        elif a.startswith("--output="):
            columns = [c.strip().upper() for c in a.split("=", 1)[1].split(",")]
        elif a in ("-T", "--target"):
            target = args.pop(0)
        elif a.startswith("--target="):
            target = a.split("=", 1)[1]
        elif a in ("-f", "--first-only", "-v", "--nofsroot", "-e", "--evaluate", "-r", "--raw"):
            pass
        elif a.startswith("-"):
            return _real_findmnt(argv)
        else:
            positional.append(a)
    table = mounts(load_layout())
    if target is not None:
        path = os.path.realpath(target)
        found = max((m for m in table if path == m["target"] or path.startswith(m["target"].rstrip("/") + "/")),
                    key=lambda m: len(m["target"]))  # fmt: skip
        real = _real_target(path)
        if real not in (None, "/", found["target"]):
            return _real_findmnt(argv)
    elif positional:
        found = next((m for m in table if positional[0] in (m["target"], m["source"])), None)
        if found is None:
            return _real_findmnt(argv)
    else:
        return _real_findmnt(argv)

    def value(col):
        if col in ("SIZE", "FSSIZE"):
            return found["size"] if bytes_out else human(found["size"])
        return found.get(col.lower(), "")

    if json_out:
        print(json.dumps({"filesystems": [{c.lower(): value(c) for c in columns}]}, indent=3))
        return 0
    _print_table(columns, [[str(value(c)) for c in columns]], noheadings)
    return 0


REAL_FINDMNT = "/usr/bin/findmnt"


def _real_target(path):
    import subprocess

    res = subprocess.run(
        [REAL_FINDMNT, "-n", "-o", "TARGET", "-T", path], capture_output=True, text=True, check=False
    )
    return res.stdout.strip() or None


def _real_findmnt(argv):
    os.execv(REAL_FINDMNT, [REAL_FINDMNT, *argv])
    return 1


# --- lvm reports ------------------------------------------------------------------------------------------

PV_HEAD = {"pv_name": "PV", "vg_name": "VG", "pv_fmt": "Fmt", "pv_attr": "Attr", "pv_size": "PSize",
           "pv_free": "PFree", "dev_size": "DevSize", "pe_start": "1st PE", "pv_pe_count": "PE",
           "pv_pe_alloc_count": "Alloc", "pv_uuid": "PV UUID"}  # fmt: skip
VG_HEAD = {"vg_name": "VG", "pv_count": "#PV", "lv_count": "#LV", "snap_count": "#SN", "vg_attr": "Attr",
           "vg_size": "VSize", "vg_free": "VFree", "vg_extent_size": "Ext", "vg_extent_count": "#Ext",
           "vg_free_count": "Free", "vg_uuid": "VG UUID"}  # fmt: skip
LV_HEAD = {"lv_name": "LV", "lv_attr": "Attr", "lv_size": "LSize", "pool_lv": "Pool", "origin": "Origin",
           "data_percent": "Data%", "metadata_percent": "Meta%", "move_pv": "Move", "mirror_log": "Log",
           "copy_percent": "Cpy%Sync", "convert_lv": "Convert", "lv_path": "Path", "lv_dm_path": "DMPath",
           "lv_uuid": "LV UUID", "devices": "Devices", "seg_count": "#Seg"}  # fmt: skip
DEFAULTS = {
    "pvs": ["pv_name", "vg_name", "pv_fmt", "pv_attr", "pv_size", "pv_free"],
    "vgs": ["vg_name", "pv_count", "lv_count", "snap_count", "vg_attr", "vg_size", "vg_free"],
    "lvs": ["lv_name", "vg_name", "lv_attr", "lv_size", "pool_lv", "origin", "data_percent", "metadata_percent",
            "move_pv", "mirror_log", "copy_percent", "convert_lv"],
}  # fmt: skip
SIZE_FIELDS = {
    "pv_size",
    "pv_free",
    "dev_size",
    "pe_start",
    "vg_size",
    "vg_free",
    "vg_extent_size",
    "lv_size",
}


def _rows(layout, kind):
    ext = int(layout["vg"]["extent_bytes"])
    pes = pe_count(layout)
    free = free_extents(layout)
    p3 = partition(layout, 3)
    vg = {"vg_name": VG, "pv_count": 1, "lv_count": len(layout["lvs"]), "snap_count": 0, "vg_attr": "wz--n-",
          "vg_size": pes * ext, "vg_free": free * ext, "vg_extent_size": ext, "vg_extent_count": pes,
          "vg_free_count": free, "vg_uuid": "gpulab-lab-vg-uuid"}  # fmt: skip
    pv = {"pv_name": layout["pv"]["device"], "pv_fmt": "lvm2", "pv_attr": "a--", "pv_size": pes * ext,
          "pv_free": free * ext, "dev_size": p3["sectors"] * SECTOR, "pe_start": PE_START, "pv_pe_count": pes,
          "pv_pe_alloc_count": pes - free, "pv_uuid": "gpulab-lab-pv-uuid"}  # fmt: skip
    if kind == "vgs":
        return [vg]
    if kind == "pvs":
        return [{**vg, **pv}]
    rows = []
    for lv in layout["lvs"]:
        rows.append({**vg, **pv, "lv_name": lv["name"], "lv_attr": "-wi-ao----", "lv_size": int(lv["extents"]) * ext,
                     "pool_lv": "", "origin": "", "data_percent": "", "metadata_percent": "", "move_pv": "",
                     "mirror_log": "", "copy_percent": "", "convert_lv": "", "lv_path": f"/dev/{VG}/{lv['name']}",
                     "lv_dm_path": f"/dev/mapper/{VG.replace('-', '--')}-{lv['name'].replace('-', '--')}",
                     "lv_uuid": "gpulab-lab-lv-uuid", "devices": f"{layout['pv']['device']}(0)", "seg_count": 1})  # fmt: skip
    return rows


def _field(name, kind):
    heads = {**PV_HEAD, **VG_HEAD, **LV_HEAD}
    name = name.strip().lower()
    prefix = {"pvs": "pv_", "vgs": "vg_", "lvs": "lv_"}[kind]
    for candidate in (name, prefix + name):
        if candidate in heads:
            return candidate
    raise Fail(f"  Unrecognised field: {name}", 5)


def cmd_report(kind, argv):
    args = list(argv)
    fields = list(DEFAULTS[kind])
    units, suffix, noheadings, sep, report_json, names = "r", True, False, None, False, []
    while args:
        a = args.pop(0)
        if a in ("-o", "--options"):
            spec = args.pop(0)
            cols = [_field(c, kind) for c in spec.lstrip("+").split(",") if c.strip()]
            fields = fields + cols if spec.startswith("+") else cols
        elif a == "--units":
            units = args.pop(0)
        elif a == "--nosuffix":
            suffix = False
        elif a == "--noheadings":
            noheadings = True
        elif a == "--separator":
            sep = args.pop(0)
        elif a == "--reportformat":
            report_json = args.pop(0).startswith("json")
        elif a in ("--config", "-S", "--select", "-O", "--sort"):
            args.pop(0)
        elif a.startswith("-"):
            continue  # -a, --all, -q, -v, --readonly, --nolocking, --binary, --aligned, --unbuffered ...
        else:
            names.append(a)
    layout = load_layout()
    rows = _rows(layout, kind)
    for n in names:
        if kind == "vgs" and n != VG:
            raise Fail(f'  Volume group "{n}" not found\n  Cannot process volume group {n}', 5)
        if kind == "pvs" and n != layout["pv"]["device"]:
            raise Fail(f'  Failed to find physical volume "{n}".', 5)
        if kind == "lvs" and n != VG and find_lv(layout, n) is None:
            raise Fail(f'  Failed to find logical volume "{n.removeprefix("/dev/")}"', 5)

    def fmt(f, row):
        v = row[f]
        if f in SIZE_FIELDS:
            return lvm_size(int(v), units, suffix)
        return str(v)

    if report_json:
        key = {"pvs": "pv", "vgs": "vg", "lvs": "lv"}[kind]
        print(json.dumps({"report": [{key: [{f: fmt(f, r) for f in fields} for r in rows]}]}, indent=2))
        return 0
    heads = {**PV_HEAD, **VG_HEAD, **LV_HEAD}
    table = [[fmt(f, r) for f in fields] for r in rows]
    if sep is not None:
        if not noheadings:
            print("  " + sep.join(heads[f] for f in fields))
        for cells in table:
            print("  " + sep.join(cells))
        return 0
    full = table if noheadings else [[heads[f] for f in fields], *table]
    widths = [max(len(r[i]) for r in full) for i in range(len(fields))]
    for r in full:
        cells = [r[i].rjust(widths[i]) if fields[i] in SIZE_FIELDS or fields[i].endswith("count") else r[i].ljust(widths[i])
                 for i in range(len(fields))]  # fmt: skip
        print("  " + " ".join(cells).rstrip())
    return 0


# --- changes ----------------------------------------------------------------------------------------------


def cmd_growpart(argv):
    args = [a for a in argv if a not in ("-N", "--dry-run", "-v", "--verbose")]
    dry = "-N" in argv or "--dry-run" in argv
    while args and args[0] in ("-u", "--update"):
        args = args[2:]
    args = [a for a in args if not a.startswith("--update=")]
    if len(args) != 2:
        raise Fail(
            "growpart disk partition\n   rewrite partition table so that partition takes up all the space it can",
            2,
        )
    disk, number = args
    layout = load_layout()
    # growpart's fail() echoes its FAILED: line on stdout
    if disk != f"/dev/{layout['disk']}":
        raise Fail(f"FAILED: {disk}: does not exist", 2, "stdout")
    if not number.isdigit():
        raise Fail("FAILED: partition-number must be a number", 2, "stdout")
    part = partition(layout, int(number))
    if part is None:
        raise Fail(f"FAILED: failed to get start and end for {disk}{number} in {disk}", 2, "stdout")
    if part is not layout["partitions"][-1]:
        print(f"NOCHANGE: partition {number} is size {part['sectors']}. it cannot be grown")
        return 1
    total = disk_bytes(layout) // SECTOR
    new = total - GPT_TAIL - part["start"]
    old = part["sectors"]
    if new == old:
        print(f"NOCHANGE: partition {number} is size {old}. it cannot be grown")
        return 1
    if new - old < FUDGE:
        print(f"NOCHANGE: partition {number} could only be grown by {new - old} [fudge={FUDGE}]")
        return 1
    word = "CHANGE" if dry else "CHANGED"
    # growpart's ends are the last sector of the partition (start + size - 1)
    print(f"{word}: partition={number} start={part['start']} old: size={old} end={part['start'] + old - 1} "
          f"new: size={new} end={part['start'] + new - 1}")  # fmt: skip
    if not dry:
        part["sectors"] = new
        if layout["pv"]["device"] == f"{disk}{number}":
            # growpart's maybe_lvm_resize: the partition is an LVM PV, so `lvm pvresize` follows (quietly)
            layout["pv"]["bytes"] = new * SECTOR
        save_layout(layout)
    return 0


def cmd_pvresize(argv):
    args = [a for a in argv if not a.startswith("-")]
    layout = load_layout()
    if not args:
        raise Fail("  Please supply physical volume(s)", 3)
    if args[0] != layout["pv"]["device"]:
        raise Fail(
            f'  Failed to find physical volume "{args[0]}".\n  0 physical volume(s) resized or updated / 1 physical volume(s) not resized',
            5,
        )
    if "--setphysicalvolumesize" in argv:
        raise Fail("  gpulab lab stand-in: --setphysicalvolumesize is not simulated", 5)
    if "-t" not in argv and "--test" not in argv:
        layout["pv"]["bytes"] = partition(layout, 3)["sectors"] * SECTOR
        save_layout(layout)
    else:
        print(
            "  TEST MODE: Metadata will NOT be updated and volumes will not be (de)activated.",
            file=sys.stderr,
        )
    print(f'  Physical volume "{args[0]}" changed')
    print("  1 physical volume(s) resized or updated / 0 physical volume(s) not resized")
    return 0


def _parse_amount(text, lv_extents, free, vg_extents, ext, extents_flag):
    """(+?, extents) from -l/-L arguments (``+100%FREE``, ``+10G``, ``100%VG``, ``14847``)."""
    plus = text.startswith("+")
    body = text.lstrip("+")
    if "%" in body:
        pct, _, what = body.partition("%")
        base = {
            "FREE": free,
            "VG": vg_extents,
            "LV": lv_extents,
            "PVS": vg_extents,
            "ORIGIN": lv_extents,
        }.get(what.upper())
        if base is None:
            raise Fail(f"  Specified %{what} is unknown.", 3)
        # lvm2's percent_of_extents rounds up; without '+' the share is the new size itself (for %FREE too,
        # so `-l 100%FREE` asks for as many extents as are free, not for all of them added)
        return plus, math.ceil(base * float(pct) / 100)
    if extents_flag:
        return plus, int(body)
    unit = body[-1].lower() if body[-1].isalpha() else "m"
    number = float(body[:-1] if body[-1].isalpha() else body)
    factor = {"b": 1, "s": SECTOR, "k": 1024, "m": MiB, "g": GiB, "t": 2**40}[unit]
    return plus, math.ceil(number * factor / ext)


def cmd_lvextend(argv, name="lvextend"):
    args = list(argv)
    amount, extents_flag, resizefs, test, target = None, False, False, False, None
    while args:
        a = args.pop(0)
        if a in ("-l", "--extents"):
            amount, extents_flag = args.pop(0), True
        elif a.startswith("--extents="):
            amount, extents_flag = a.split("=", 1)[1], True
        elif a.startswith("-l") and len(a) > 2:
            amount, extents_flag = a[2:], True
        elif a in ("-L", "--size"):
            amount = args.pop(0)
        elif a.startswith("--size="):
            amount = a.split("=", 1)[1]
        elif a.startswith("-L") and len(a) > 2:
            amount = a[2:]
        elif a in ("-r", "--resizefs"):
            resizefs = True
        elif a in ("-t", "--test"):
            test = True
        elif a.startswith("-"):
            continue  # -n/--nofsck, -f/--force, -y, -q, -v, --yes
        elif target is None:
            target = a
    if amount is None:
        raise Fail(
            f"  Please specify either size or extents but not both.\n  Run `{name} --help' for more information.",
            3,
        )
    if target is None:
        raise Fail("  Please provide the logical volume name.", 3)
    layout = load_layout()
    lv = find_lv(layout, target)
    if lv is None:
        raise Fail(f'  Failed to find logical volume "{target.removeprefix("/dev/")}"', 5)
    ext = int(layout["vg"]["extent_bytes"])
    old = int(lv["extents"])
    plus, n = _parse_amount(amount, old, free_extents(layout), pe_count(layout), ext, extents_flag)
    if amount.startswith("-"):
        raise Fail("  gpulab lab stand-in: shrinking a logical volume is not simulated", 5)
    new = old + n if plus else n
    if new == old and not resizefs:
        raise Fail(f"  New size ({new} extents) matches existing size ({old} extents).", 5)
    if new < old:
        if name == "lvextend":
            raise Fail(f"  New size given ({new} extents) not larger than existing size ({old} extents)", 5)
        raise Fail("  gpulab lab stand-in: shrinking a logical volume is not simulated", 5)
    if new - old > free_extents(layout):
        raise Fail(
            f"  Insufficient free space: {new - old} extents needed, but only {free_extents(layout)} available",
            5,
        )
    full = f"{VG}/{lv['name']}"
    if test:
        print(
            "  TEST MODE: Metadata will NOT be updated and volumes will not be (de)activated.",
            file=sys.stderr,
        )
    if new == old:  # with --resizefs lvm2 2.03.16 goes on with a zero extension and resizes the filesystem
        print(f"  Size of logical volume {full} unchanged from {lvm_long_size(old * ext)} ({old} extents).")
    else:
        print(f"  Size of logical volume {full} changed from {lvm_long_size(old * ext)} ({old} extents) to "
              f"{lvm_long_size(new * ext)} ({new} extents).")  # fmt: skip
    if test:
        return 0
    lv["extents"] = new
    save_layout(layout)
    print(f"  Logical volume {full} successfully resized.")
    sys.stdout.flush()
    if resizefs:
        return cmd_resize2fs([LV_DEV])
    return 0


def cmd_lvresize(argv):
    return cmd_lvextend(argv, "lvresize")


def cmd_resize2fs(argv):
    args = [a for a in argv if not a.startswith("-")]
    print("resize2fs 1.47.0 (5-Feb-2023)", file=sys.stderr)
    if not args:
        raise Fail(
            "Usage: resize2fs [-d debug_flags] [-f] [-F] [-M] [-P] [-p] device [-b|-s|new_size] [-S RAID-stride] [-z undo_file]",
            1,
        )
    layout = load_layout()
    dev = args[0]
    lv = find_lv(layout, dev)
    if lv is None:
        part = next((p for p in layout["partitions"] if f"/dev/sda{p['number']}" == dev), None)
        if part is None or part["fstype"] != "ext4":
            raise Fail(
                f"resize2fs: No such file or directory while trying to open {dev}\nCouldn't find valid filesystem superblock.",
                1,
            )
        blocks = part["sectors"] * SECTOR // 4096
        print(f"The filesystem is already {blocks} (4k) blocks long.  Nothing to do!\n", file=sys.stderr)
        return 0
    size = int(lv["extents"]) * int(layout["vg"]["extent_bytes"])
    old_blocks, new_blocks = int(lv["fs_bytes"]) // 4096, size // 4096
    if new_blocks == old_blocks:
        print(f"The filesystem is already {new_blocks} (4k) blocks long.  Nothing to do!\n", file=sys.stderr)
        return 0
    if new_blocks < old_blocks:
        raise Fail("resize2fs: On-line shrinking not supported", 1)

    def desc(blocks):
        return math.ceil(math.ceil(blocks / 32768) / 64)

    print(f"Filesystem at {dev} is mounted on /; on-line resizing required")
    print(f"old_desc_blocks = {desc(old_blocks)}, new_desc_blocks = {desc(new_blocks)}")
    lv["fs_bytes"] = size
    save_layout(layout)
    print(f"The filesystem on {dev} is now {new_blocks} (4k) blocks long.\n")
    return 0


COMMANDS = {
    "lsblk": cmd_lsblk,
    "findmnt": cmd_findmnt,
    "pvs": lambda a: cmd_report("pvs", a),
    "vgs": lambda a: cmd_report("vgs", a),
    "lvs": lambda a: cmd_report("lvs", a),
    "growpart": cmd_growpart,
    "pvresize": cmd_pvresize,
    "lvextend": cmd_lvextend,
    "lvresize": cmd_lvresize,
    "resize2fs": cmd_resize2fs,
}
#: where each stand-in goes in the guest: lsblk and findmnt ahead of the image's own in PATH
PATHS = {
    "lsblk": "/usr/local/bin/lsblk",
    "findmnt": "/usr/local/bin/findmnt",
    "growpart": "/usr/bin/growpart",
    "pvs": "/usr/sbin/pvs",
    "vgs": "/usr/sbin/vgs",
    "lvs": "/usr/sbin/lvs",
    "pvresize": "/usr/sbin/pvresize",
    "lvextend": "/usr/sbin/lvextend",
    "lvresize": "/usr/sbin/lvresize",
    "resize2fs": "/usr/sbin/resize2fs",
}
#: the root commands that change the disk (LVM and resize2fs need root, as on a real guest)
ROOT_ONLY = {"growpart", "pvresize", "lvextend", "lvresize", "resize2fs", "pvs", "vgs", "lvs"}


def log_call(cmd, argv, rc):
    try:
        os.makedirs(os.path.dirname(LOG), exist_ok=True)
        with open(LOG, "a") as f:
            f.write(json.dumps({"time": time.time(), "command": cmd, "argv": argv, "rc": rc}) + "\n")
    except OSError:
        pass


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd in ROOT_ONLY and os.geteuid() != 0 and not os.environ.get("GPULAB_DISK_LAYOUT"):
        if cmd in ("pvs", "vgs", "lvs"):
            print("  WARNING: Running as a non-root user. Functionality may be unavailable.", file=sys.stderr)
            print("  /run/lock/lvm/P_global:aux: open failed: Permission denied", file=sys.stderr)
            return 5
        if cmd == "growpart":
            print(f"FAILED: failed to get a lock on {args[0] if args else '/dev/sda'}", file=sys.stderr)
            return 2
        print("  WARNING: Running as a non-root user. Functionality may be unavailable.", file=sys.stderr)
        return 5
    try:
        rc = COMMANDS[cmd](args)
    except Fail as exc:
        print(str(exc), file=sys.stdout if exc.stream == "stdout" else sys.stderr)
        rc = exc.rc
    log_call(cmd, args, rc)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
