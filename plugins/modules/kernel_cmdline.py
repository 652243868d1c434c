#!/usr/bin/python
"""Ansible module kernel_cmdline: kernel command-line parameters of a Proxmox node, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Add and remove kernel command-line parameters on a Proxmox VE node
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Edits the kernel command line the node boots with, in the file its boot loader reads.
  - systemd-boot (ZFS or btrfs root on UEFI, managed by C(proxmox-boot-tool)) reads the first line of
    C(/etc/kernel/cmdline); GRUB reads C(GRUB_CMDLINE_LINUX_DEFAULT) in C(/etc/default/grub).
  - With O(boot_loader=auto) the module finds out which one the node boots with (see O(boot_loader)).
  - Parameters in O(present) are added (or their value replaced), parameters in O(absent) removed; modules
    in O(blacklist) are merged into an existing C(modprobe.blacklist=) list rather than adding a second
    one, and modules in O(blacklist_absent) are taken out of it. Every other parameter (C(root=),
    C(boot=zfs), ...) is kept exactly, in its order; other lines of the files are not touched.
  - GRUB values keep their meaning for the shell (double, single or no quotes, escapes, C($VAR)
    references); a changed value is written back double-quoted.
  - Writes atomically and keeps a timestamped backup (O(backup)). Returns the command that refreshes the
    boot loader (RV(refresh_command)) and whether the running kernel (C(/proc/cmdline)) still lacks the
    wanted state, so a reboot is needed (RV(reboot_needed), RV(pending)). It never refreshes or reboots.
  - Runs on the managed host with the Python standard library only.
options:
  present:
    description:
      - Parameters that must be on the command line, C(name) or C(name=value), added at the end in this
        order. A parameter of the same name with another value is replaced in place; duplicates of that
        name are removed.
    type: list
    elements: str
    default: []
  absent:
    description:
      - Parameters to remove. C(name) removes the parameter with any value; C(name=value) only that value.
    type: list
    elements: str
    default: []
  blacklist:
    description:
      - Modules that C(modprobe.blacklist=) must list (merged into the first existing list, else a new
        C(modprobe.blacklist=) parameter after O(present)). C(-) and C(_) are the same character to kmod.
    type: list
    elements: str
    default: []
  blacklist_absent:
    description:
      - Modules to take out of every C(modprobe.blacklist=) list; an emptied list is removed.
    type: list
    elements: str
    default: []
  boot_loader:
    description:
      - C(systemd-boot) edits O(cmdline_file); C(grub) edits O(grub_file).
      - C(auto) decides from what the node boots. With ESPs registered in O(boot_uuids_file) (what
        C(proxmox-boot-tool init) writes), C(proxmox-boot-tool status) says how each is set up. One configured
        with C(uefi) means systemd-boot, C(grub) only means GRUB on the ESP (Secure Boot, legacy BIOS); when it
        tells nothing, a UEFI boot (O(efi_dir) exists) means systemd-boot and a legacy BIOS one GRUB, as
        C(proxmox-boot-tool init) installs them.
      - Without registered ESPs proxmox-boot-tool copies nothing to an ESP (its C(status) exits 2), so the node
        boots GRUB from O(grub_cfg), made from O(grub_file). If O(cmdline_file) exists all the same (guides tell
        users to create it), the signals disagree and the module refuses before writing anything, naming the
        files and the fix (remove the stray file, or C(proxmox-boot-tool init) the ESP).
    type: str
    choices: [auto, systemd-boot, grub]
    default: auto
  cmdline_file:
    description: The systemd-boot command line file (only its first line is used).
    type: path
    default: /etc/kernel/cmdline
  grub_file:
    description: The GRUB defaults file holding C(GRUB_CMDLINE_LINUX_DEFAULT).
    type: path
    default: /etc/default/grub
  boot_uuids_file:
    description: C(proxmox-boot-tool)'s list of ESPs; when it exists, GRUB is refreshed through C(proxmox-boot-tool).
    type: path
    default: /etc/kernel/proxmox-boot-uuids
  efi_dir:
    description: Exists when the node booted with UEFI (C(/sys/firmware/efi)); read by O(boot_loader=auto).
    type: path
    default: /sys/firmware/efi
  grub_cfg:
    description: The configuration GRUB boots from; named in RV(signals) and in the refusal.
    type: path
    default: /boot/grub/grub.cfg
  proc_cmdline:
    description: The running kernel command line, compared with the wanted state for RV(reboot_needed).
    type: path
    default: /proc/cmdline
  backup:
    description: Keep a timestamped copy of the file before changing it.
    type: bool
    default: true
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  diff_mode:
    support: full
notes:
  - Snippets in C(/etc/default/grub.d/) that set C(GRUB_CMDLINE_LINUX_DEFAULT) override the main file; the
    module warns about them.
"""

EXAMPLES = r"""
- name: Keep the host's drivers off the GPU
  gpulab.homelab.kernel_cmdline:
    present: [nomodeset]
    blacklist: [nova_core, nova_drm, nova, nouveau]
  register: cmdline

- name: Refresh the boot loader when the command line changed
  ansible.builtin.command: "{{ cmdline.refresh_command }}"
  when: cmdline.changed

- name: Turn nomodeset off again
  gpulab.homelab.kernel_cmdline:
    absent: [nomodeset]
"""

RETURN = r"""
boot_loader:
  description: The boot loader whose configuration was edited.
  returned: always
  type: str
  sample: systemd-boot
detected_by:
  description: How the boot loader was chosen.
  returned: always
  type: str
  sample: "proxmox-boot-tool status: ESP 9A3B-1C2D configured with uefi"
signals:
  description: What the boot loader was decided from (O(boot_loader=auto)), one line each.
  returned: always
  type: list
  elements: str
  sample: ["/etc/kernel/proxmox-boot-uuids: ESP 9A3B-1C2D", "UEFI boot (/sys/firmware/efi exists)"]
file:
  description: The file edited.
  returned: always
  type: str
  sample: /etc/kernel/cmdline
before:
  description: The command line (systemd-boot) or the value of GRUB_CMDLINE_LINUX_DEFAULT (GRUB) before.
  returned: always
  type: str
  sample: "root=ZFS=rpool/ROOT/pve-1 boot=zfs "
after:
  description: The same after the change (or as it would be, in check mode).
  returned: always
  type: str
  sample: root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau
changes:
  description: One line per parameter added, replaced or removed.
  returned: always
  type: list
  elements: str
  sample: ["added nomodeset", "added modprobe.blacklist=nova_core,nova_drm,nova,nouveau"]
refresh_command:
  description: The command that makes the boot loader use the file (argv list).
  returned: always
  type: list
  elements: str
  sample: [proxmox-boot-tool, refresh]
refresh_needed:
  description: True when the file changed, so the boot loader must be refreshed.
  returned: always
  type: bool
reboot_needed:
  description: True when the running kernel's command line lacks the wanted parameters or still has removed ones.
  returned: always
  type: bool
pending:
  description: Why a reboot is needed, one line per parameter.
  returned: always
  type: list
  elements: str
  sample: ["nomodeset is not on the running command line"]
backup_file:
  description: The backup copy, when one was made.
  returned: changed and backup is true
  type: str
"""

import os  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_PARAM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(=[^\s\"'\\$`]*)?$")
_MODULE = re.compile(r"^[A-Za-z0-9_\-]+$")
_GRUB_LINE = re.compile(r"^(?P<lead>\s*(?:export\s+)?GRUB_CMDLINE_LINUX_DEFAULT=)(?P<rest>.*)$")
BLACKLIST = "modprobe.blacklist"


class CmdlineError(Exception):
    """A file the module cannot edit safely, or conflicting options."""


# --- words -----------------------------------------------------------------------------------------------


def split_words(text: str, escaped: bool = False, strict: bool = False) -> list[str]:
    """Split a command line into its words.

    Spaces inside kernel double quotes do not split (kernel `next_arg`). With `escaped`, `text` is the
    inside of a shell double-quoted string: a kernel quote is written `\\"` and every backslash pair is one
    unit. With `strict`, a quote left open (the kernel would read the rest of the line as one value) is
    refused, because words added after it would not be parameters of their own.
    """
    words: list[str] = []
    current: list[str] = []
    quoted = False
    i = 0
    while i < len(text):
        ch = text[i]
        if escaped and ch == "\\" and i + 1 < len(text):
            pair = text[i : i + 2]
            current.append(pair)
            if pair == '\\"':
                quoted = not quoted
            i += 2
            continue
        if not escaped and ch == '"':
            quoted = not quoted
        if ch.isspace() and not quoted:
            if current:
                words.append("".join(current))
                current = []
        else:
            current.append(ch)
        i += 1
    if current:
        words.append("".join(current))
    if strict and quoted:
        raise CmdlineError(f"unbalanced double quote in {text.strip()!r}; correct the line by hand first")
    return words


def _unquote(value: str) -> str:
    for q in ('\\"', '"'):
        if len(value) >= 2 * len(q) and value.startswith(q) and value.endswith(q):
            return value[len(q) : -len(q)]
    return value


def word_name(word: str) -> str:
    return word.split("=", 1)[0]


def _mod(name: str) -> str:
    return name.replace("-", "_")


def blacklist_modules(word: str) -> list[str]:
    value = _unquote(word.split("=", 1)[1]) if "=" in word else ""
    return [m for m in value.split(",") if m]


# --- the edit --------------------------------------------------------------------------------------------


def validate(present, absent, blacklist, blacklist_absent) -> None:
    for param in list(present) + list(absent):
        if not _PARAM.match(param):
            raise CmdlineError(
                f"parameter {param!r} is not a plain name or name=value (no spaces, quotes, $ or backslashes)"
            )
        if word_name(param) == BLACKLIST:
            raise CmdlineError(f"manage {BLACKLIST}= through the blacklist and blacklist_absent options")
    names_present = {word_name(p) for p in present}
    for param in absent:
        if param in present or ("=" not in param and param in names_present):
            raise CmdlineError(f"parameter {param!r} is asked to be both present and absent")
    for module in list(blacklist) + list(blacklist_absent):
        if not _MODULE.match(module):
            raise CmdlineError(f"module name {module!r} is not valid")
    both = {_mod(m) for m in blacklist} & {_mod(m) for m in blacklist_absent}
    if both:
        raise CmdlineError(f"modules {', '.join(sorted(both))} are asked to be both blacklisted and not")


def edit_words(words, present=(), absent=(), blacklist=(), blacklist_absent=()):
    """Apply the wanted state to a list of words; returns (new words, list of changes)."""
    out = list(words)
    changes: list[str] = []

    for param in absent:
        kept = []
        for word in out:
            hit = word_name(word) == param if "=" not in param else _unquote_word(word) == param
            if hit:
                changes.append(f"removed {word}")
            else:
                kept.append(word)
        out = kept

    appended: list[str] = []
    for param in present:
        name = word_name(param)
        idx = [i for i, w in enumerate(out) if word_name(w) == name]
        if len(idx) == 1 and _unquote_word(out[idx[0]]) == param:
            continue
        if not idx:
            appended.append(param)
            changes.append(f"added {param}")
            continue
        first = idx[0]
        if _unquote_word(out[first]) != param:
            changes.append(f"replaced {out[first]} with {param}")
        for i in idx[1:]:
            changes.append(f"removed duplicate {out[i]}")
        out[first] = param
        out = [w for i, w in enumerate(out) if i not in idx[1:]]

    gone = {_mod(m) for m in blacklist_absent}
    if gone:
        kept = []
        for word in out:
            if word_name(word) != BLACKLIST:
                kept.append(word)
                continue
            mods = blacklist_modules(word)
            left = [m for m in mods if _mod(m) not in gone]
            if left == mods:
                kept.append(word)
                continue
            for m in mods:
                if _mod(m) in gone:
                    changes.append(f"removed {m} from {BLACKLIST}")
            if left:
                kept.append(f"{BLACKLIST}={','.join(left)}")
        out = kept

    listed = {_mod(m) for w in out if word_name(w) == BLACKLIST for m in blacklist_modules(w)}
    missing = []
    for m in blacklist:
        if _mod(m) not in listed and _mod(m) not in {_mod(x) for x in missing}:
            missing.append(m)
    if missing:
        idx = [i for i, w in enumerate(out) if word_name(w) == BLACKLIST]
        if idx:
            merged = blacklist_modules(out[idx[0]]) + missing
            out[idx[0]] = f"{BLACKLIST}={','.join(merged)}"
            changes.append(f"added {','.join(missing)} to {BLACKLIST}")
        else:
            appended.append(f"{BLACKLIST}={','.join(missing)}")
            changes.append(f"added {BLACKLIST}={','.join(missing)}")
    return out + appended, changes


def _unquote_word(word: str) -> str:
    if "=" not in word:
        return _unquote(word)
    name, value = word.split("=", 1)
    return f"{name}={_unquote(value)}"


def pending_reboot(running: str, present=(), absent=(), blacklist=(), blacklist_absent=()) -> list[str]:
    """Why the running command line differs from the wanted state (empty: no reboot needed for it)."""
    words = [_unquote_word(w) for w in split_words(running)]
    reasons = []
    for param in present:
        same = [w for w in words if word_name(w) == word_name(param)]
        if not same or same[-1] != param:
            reasons.append(f"{param} is not on the running command line")
    for param in absent:
        hit = [w for w in words if (word_name(w) == param if "=" not in param else w == param)]
        if hit:
            reasons.append(f"{hit[0]} is still on the running command line")
    running_bl = {_mod(m) for w in words if word_name(w) == BLACKLIST for m in blacklist_modules(w)}
    for m in blacklist:
        if _mod(m) not in running_bl:
            reasons.append(f"{m} is not in {BLACKLIST}= of the running command line")
    for m in blacklist_absent:
        if _mod(m) in running_bl:
            reasons.append(f"{m} is still in {BLACKLIST}= of the running command line")
    return reasons


# --- GRUB shell values -----------------------------------------------------------------------------------

_DQ_SPECIAL = '$`"\\'


def parse_shell_word(rest: str) -> tuple[str, str]:
    """Read the shell word at the start of `rest`.

    Returns (R, suffix) where R is the word re-expressed as the inside of a double-quoted string with the
    same meaning for the shell, and suffix the rest of the line (comment, `;`, ...), kept verbatim.
    """
    out: list[str] = []
    i = 0
    n = len(rest)
    while i < n:
        ch = rest[i]
        if ch == '"':
            j = i + 1
            while j < n and rest[j] != '"':
                j += 2 if rest[j] == "\\" else 1
            if j >= n:
                raise CmdlineError("unterminated double quote (a value spanning lines is not supported)")
            out.append(rest[i + 1 : j])
            i = j + 1
        elif ch == "'":
            j = rest.find("'", i + 1)
            if j < 0:
                raise CmdlineError("unterminated single quote (a value spanning lines is not supported)")
            out.extend("\\" + c if c in _DQ_SPECIAL else c for c in rest[i + 1 : j])
            i = j + 1
        elif ch == "\\":
            if i + 1 >= n:
                raise CmdlineError("line continuation in the value is not supported")
            nxt = rest[i + 1]
            out.append("\\" + nxt if nxt in _DQ_SPECIAL else nxt)
            i += 2
        elif ch.isspace() or ch in ";&|":
            break
        else:
            out.append(ch)
            i += 1
    return "".join(out), rest[i:]


def find_grub_value(lines: list[str]) -> tuple[int | None, str, str, str]:
    """The effective (last) GRUB_CMDLINE_LINUX_DEFAULT assignment: (line index, lead, R, suffix)."""
    found: tuple[int | None, str, str, str] = (None, "GRUB_CMDLINE_LINUX_DEFAULT=", "", "")
    for idx, line in enumerate(lines):
        m = _GRUB_LINE.match(line.rstrip("\n"))
        if m:
            value, suffix = parse_shell_word(m.group("rest"))
            found = (idx, m.group("lead"), value, suffix)
    return found


def edit_grub(text: str, **wanted) -> tuple[str, str, str, list[str]]:
    """Edit GRUB_CMDLINE_LINUX_DEFAULT in the text of /etc/default/grub: (new text, before, after, changes)."""
    lines = text.splitlines(keepends=True)
    idx, lead, value, suffix = find_grub_value(lines)
    words = split_words(value, escaped=True, strict=True)
    new_words, changes = edit_words(words, **wanted)
    if not changes:
        return text, value, value, changes
    new_value = " ".join(new_words)
    line = f'{lead}"{new_value}"{suffix}\n'
    if idx is None:
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(line)
    else:
        lines[idx] = line
    return "".join(lines), value, new_value, changes


def edit_cmdline_file(text: str, **wanted) -> tuple[str, str, str, list[str]]:
    """Edit the first line of /etc/kernel/cmdline: (new text, before, after, changes)."""
    first, _nl, rest = text.partition("\n")
    new_words, changes = edit_words(split_words(first, strict=True), **wanted)
    if not changes:
        return text, first, first, changes
    after = " ".join(new_words)
    if "root=" not in after:
        raise CmdlineError("the command line would have no root= parameter, which proxmox-boot-tool refuses")
    return after + "\n" + rest, first, after, changes


# --- the module ------------------------------------------------------------------------------------------


_VFAT_UUID = re.compile(r"^[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}$")


def registered_esps(path: str) -> list[str]:
    """The ESPs proxmox-boot-tool keeps in sync: the VFAT UUIDs of its list (one a line; what `init` adds)."""
    return [line.strip() for line in _read(path).splitlines() if _VFAT_UUID.match(line.strip())]


def detect(module, params) -> tuple[str, str, list[str]]:
    """(boot loader, why, the signals read). Raises CmdlineError when the signals disagree.

    proxmox-kernel-helper's proxmox-boot-tool (jiangcuo/proxmox-kernel-helper@7007b33 src/bin/proxmox-boot-tool):
    `status` exits 2 when /etc/kernel/proxmox-boot-uuids does not exist, else prints "<uuid> is configured
    with: uefi (...)" for an ESP with systemd-boot's loader.conf and "grub (...)" for one with a grub/ folder;
    `init` installs systemd-boot on a UEFI boot (/sys/firmware/efi) and GRUB otherwise; only ESPs of the list
    get the kernels and the first line of /etc/kernel/cmdline (zz-proxmox-boot)."""
    cmdline_file, uuids_file = params["cmdline_file"], params["boot_uuids_file"]
    efi = os.path.isdir(params["efi_dir"])
    esps = registered_esps(uuids_file)
    signals = [
        f"{uuids_file}: " + (f"ESP {', '.join(esps)}" if esps else "no ESP registered"),
        f"{'UEFI' if efi else 'legacy BIOS'} boot ({params['efi_dir']} {'exists' if efi else 'does not exist'})",
        f"{cmdline_file} {'exists' if os.path.exists(cmdline_file) else 'does not exist'}",
        f"{params['grub_cfg']} {'exists' if os.path.exists(params['grub_cfg']) else 'does not exist'}",
    ]
    if params["boot_loader"] != "auto":
        return params["boot_loader"], "boot_loader option", signals
    if esps:
        tool = module.get_bin_path("proxmox-boot-tool")
        rc, out = (module.run_command([tool, "status"])[:2]) if tool else (None, "")
        kinds = re.findall(r"^(\S+) is configured with: (.*)$", out, re.MULTILINE) if rc == 0 else []
        signals.append(
            "proxmox-boot-tool status: "
            + ("not installed" if tool is None else f"exit {rc}" + "".join(f"; {u} {k}" for u, k in kinds))
        )
        if any("uefi" in k for _u, k in kinds):
            uuid = next(u for u, k in kinds if "uefi" in k)
            return "systemd-boot", f"proxmox-boot-tool status: ESP {uuid} configured with uefi", signals
        if kinds:
            return "grub", f"proxmox-boot-tool status: ESP {kinds[0][0]} configured with grub only", signals
        if efi and os.path.exists(cmdline_file):
            why = f"ESP {esps[0]} registered, UEFI boot and {cmdline_file} exists (proxmox-boot-tool init: systemd-boot)"
            return "systemd-boot", why, signals
        why = f"ESP {esps[0]} registered on a legacy BIOS boot (proxmox-boot-tool init: GRUB on the ESP)"
        return "grub", why, signals
    if not os.path.exists(cmdline_file):
        return "grub", f"{cmdline_file} does not exist and no ESP is registered (GRUB install)", signals
    raise CmdlineError(
        f"the boot loader signals disagree: {cmdline_file} exists (systemd-boot's command line), but no ESP is "
        f"registered with proxmox-boot-tool ({uuids_file} "
        + ("does not exist" if not os.path.exists(uuids_file) else "lists none")
        + ", so `proxmox-boot-tool status` fails and nothing copies that file into a boot entry); the node boots "
        f"GRUB ({params['grub_cfg']}"
        + (" exists" if os.path.exists(params["grub_cfg"]) else "")
        + f", made from {params['grub_file']}) on a {'UEFI' if efi else 'legacy BIOS'} boot. An edit of "
        f"{cmdline_file} would change nothing the node boots with. Fix: if the node boots GRUB (ext4/xfs "
        f"install), remove the stray {cmdline_file} (its parameters belong in GRUB_CMDLINE_LINUX_DEFAULT of "
        f"{params['grub_file']}), or set pve_host_boot_loader: grub; if it should boot systemd-boot from an ESP, "
        "run `proxmox-boot-tool init <ESP partition>` so proxmox-boot-tool registers and refreshes it"
    )


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def _write(module, path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".gpulab-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    if os.path.exists(path):
        st = os.stat(path)
        os.chmod(tmp, st.st_mode & 0o7777)
        os.chown(tmp, st.st_uid, st.st_gid)
    else:
        os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def run(module) -> dict:
    p = module.params
    wanted = {k: p[k] for k in ("present", "absent", "blacklist", "blacklist_absent")}
    validate(**wanted)
    loader, detected_by, signals = detect(module, p)
    path = p["cmdline_file"] if loader == "systemd-boot" else p["grub_file"]
    if loader == "systemd-boot" and not os.path.exists(path):
        raise CmdlineError(f"{path} does not exist; systemd-boot hosts keep their command line there")
    text = _read(path)
    editor = edit_cmdline_file if loader == "systemd-boot" else edit_grub
    new_text, before, after, changes = editor(text, **wanted)
    changed = new_text != text

    if loader == "systemd-boot" or registered_esps(p["boot_uuids_file"]):
        refresh = ["proxmox-boot-tool", "refresh"]
    else:
        refresh = ["update-grub"]

    warnings = []
    if loader == "grub":
        dropins = os.path.join(os.path.dirname(p["grub_file"]), "grub.d")
        if os.path.isdir(dropins):
            for name in sorted(os.listdir(dropins)):
                if name.endswith(".cfg") and "GRUB_CMDLINE_LINUX_DEFAULT=" in _read(
                    os.path.join(dropins, name)
                ):
                    warnings.append(f"{os.path.join(dropins, name)} also sets GRUB_CMDLINE_LINUX_DEFAULT")

    running = None
    try:
        with open(p["proc_cmdline"], encoding="utf-8") as handle:
            running = handle.read()
    except OSError as exc:
        pending = [f"cannot read the running command line {p['proc_cmdline']}: {exc.strerror}"]
    if running is not None:
        pending = pending_reboot(running, **wanted)

    result = {
        "changed": changed,
        "boot_loader": loader,
        "detected_by": detected_by,
        "signals": signals,
        "file": path,
        "before": before,
        "after": after,
        "changes": changes,
        "refresh_command": refresh,
        "refresh_needed": changed,
        "reboot_needed": bool(pending),
        "pending": pending,
    }
    for w in warnings:
        module.warn(w)
    if changed and module._diff:
        result["diff"] = {"before": text, "after": new_text, "before_header": path, "after_header": path}
    if changed and not module.check_mode:
        if p["backup"] and os.path.exists(path):
            result["backup_file"] = module.backup_local(path)
        _write(module, path, new_text)
    return result


ARGUMENT_SPEC = {
    "present": {"type": "list", "elements": "str", "default": []},
    "absent": {"type": "list", "elements": "str", "default": []},
    "blacklist": {"type": "list", "elements": "str", "default": []},
    "blacklist_absent": {"type": "list", "elements": "str", "default": []},
    "boot_loader": {"type": "str", "default": "auto", "choices": ["auto", "systemd-boot", "grub"]},
    "cmdline_file": {"type": "path", "default": "/etc/kernel/cmdline"},
    "grub_file": {"type": "path", "default": "/etc/default/grub"},
    "boot_uuids_file": {"type": "path", "default": "/etc/kernel/proxmox-boot-uuids"},
    "efi_dir": {"type": "path", "default": "/sys/firmware/efi"},
    "grub_cfg": {"type": "path", "default": "/boot/grub/grub.cfg"},
    "proc_cmdline": {"type": "path", "default": "/proc/cmdline"},
    "backup": {"type": "bool", "default": True},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except CmdlineError as exc:
        module.fail_json(msg=f"Editing the kernel command line: {exc}")
    except OSError as exc:
        module.fail_json(msg=f"Editing the kernel command line: {exc.filename}: {exc.strerror}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
