#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module files: several directories, files and line sets on the managed host in one call.

Why a batch module and not ansible.builtin.copy/template/file/lineinfile: it stays only while it saves the demo's
no-op re-run more than 1.5 s (the threshold). Measured with scripts/benchmark.py on inventory/demo (2 CPUs,
2026-12-06, both trees back to back on one machine): the roles' tasks written with the builtins took 12.8 s of
the no-op re-run, with this module 3.8 s, so the builtins cost 9.0 s (the whole re-run: 51.0 s against 41.6 s).
Most of it is round trips: copy and template take two module calls for a file that is already right (a stat,
then file for its owner and mode), and pve_host's eight kernel-module lines are eight lineinfile calls, where
this module takes one call for all of a task's entries. Measure again before replacing it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: files
short_description: Several directories, files and line sets on the managed host in one call
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Brings each entry of O(files) to its wanted state, in order, in one module call (one SSH round trip
    where a chain of C(file), C(copy), C(template) and C(lineinfile) tasks takes one or two per file).
  - An entry is a directory (created with its parents), a whole file (O(files[].content), or
    O(files[].secret_content) for a secret that never appears in the output), a set of lines kept in a file
    that other programs own too (O(files[].lines), O(files[].absent_lines)), a file that must not exist,
    or a file another task makes (a download), whose owner, group and mode alone are kept here and whose
    absence is reported (RV(missing_paths)), so that the other task need run only then.
  - Owner, group and mode are set where given. Files are written atomically (a temporary file in the same
    folder, then renamed over the old one).
  - With C(--check) nothing is written and the result says what would change; with C(--diff) each changed
    file shows its old and new text (a secret file shows only that it changed).
  - Runs on the managed host with the Python standard library only.
options:
  files:
    description:
      - The entries, brought to their state in this order (a directory before the files in it).
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the directory or file.
        type: str
        required: true
      state:
        description:
          - V(directory) creates the directory and its missing parents.
          - V(file) writes O(files[].content) or O(files[].secret_content), or edits the lines of
            O(files[].lines) and O(files[].absent_lines); the folder it is in must exist.
          - V(absent) removes the file (never a directory).
          - V(present) is a file that another task makes (a download, say). Only its owner, group and mode
            are set here; when it is missing it is listed in RV(missing_paths), not created.
        type: str
        choices: [directory, file, absent, present]
        default: file
      content:
        description: The whole text of the file.
        type: str
      secret_content:
        description: The whole text of a file that holds a secret; neither it nor a diff of it is ever returned.
        type: str
      lines:
        description:
          - Lines the file must hold, each once, in a file that may hold other lines too (kept as they are).
          - The last line matching O(files[].lines[].regexp) (default, the line itself) is replaced by
            O(files[].lines[].line); when no line matches, the line is added at the end. A missing file is created.
        type: list
        elements: dict
        suboptions:
          line:
            description: The line, without its newline.
            type: str
            required: true
          regexp:
            description: Python regular expression (searched) that finds the line to replace.
            type: str
      absent_lines:
        description: Python regular expressions (searched); every line matching one of them is removed.
        type: list
        elements: str
      owner:
        description: Owner (name or id) of the directory or file.
        type: str
      group:
        description: Group (name or id) of the directory or file.
        type: str
      mode:
        description: Permissions, as an octal string such as V('0644').
        type: str
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    description: Nothing is written; the result says what would change.
  diff_mode:
    support: full
    description: The old and new text of each changed file (not of a secret file).
notes:
  - Regular expressions of O(files[].lines) and O(files[].absent_lines) are matched against each line
    without its newline.
"""

EXAMPLES = r"""
- name: The k3s configuration folder, its token and config.yaml
  gpulab.homelab.files:
    files:
      - {path: /etc/rancher/k3s, state: directory, owner: root, group: root, mode: "0755"}
      - path: /etc/rancher/k3s/agent-token
        secret_content: "{{ k3s_agent_token }}\n"
        owner: root
        group: root
        mode: "0600"
      - path: /etc/rancher/k3s/config.yaml
        content: "{{ lookup('ansible.builtin.template', 'config.yaml.j2') }}"
        owner: root
        group: root
        mode: "0600"
  register: k3s_files

- name: Blacklist lines in a file PVE ships, vfio modules at boot
  gpulab.homelab.files:
    files:
      - path: /etc/modprobe.d/pve-blacklist.conf
        lines:
          - {line: blacklist nouveau, regexp: '^\s*blacklist\s+nouveau\s*$'}
        absent_lines: ['^\s*blacklist\s+nova\s*$']
        mode: "0644"
      - path: /etc/modules
        lines: [{line: vfio}, {line: vfio_pci}]
"""

RETURN = r"""
changed_paths:
  description: The paths that changed (or would change in check mode), in the order of O(files).
  returned: always
  type: list
  elements: str
  sample: [/etc/rancher/k3s/config.yaml]
missing_paths:
  description: The entries of state V(present) that do not exist, in the order of O(files).
  returned: always
  type: list
  elements: str
  sample: [/etc/apt/keyrings/nvidia-container-toolkit.asc]
"""

# Ansible modules keep their imports below the documentation blocks.
import os  # noqa: E402
import re  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

LINE_SPEC = {"line": {"type": "str", "required": True}, "regexp": {"type": "str"}}
ENTRY_SPEC = {
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["directory", "file", "absent", "present"], "default": "file"},
    "content": {"type": "str"},
    "secret_content": {"type": "str", "no_log": True},
    "lines": {"type": "list", "elements": "dict", "options": LINE_SPEC},
    "absent_lines": {"type": "list", "elements": "str"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
    "mode": {"type": "str"},
}
ARGUMENT_SPEC = {"files": {"type": "list", "elements": "dict", "required": True, "options": ENTRY_SPEC}}
TEXT_KEYS = ("content", "secret_content", "lines", "absent_lines")


class EntryError(ValueError):
    """An entry that cannot be brought to its state; the message names it."""


def check_entry(entry):
    """Refuse an entry whose options contradict each other."""
    path, state = entry["path"], entry["state"]
    if not os.path.isabs(path):
        raise EntryError(f"{path}: the path must be absolute")
    given = [k for k in TEXT_KEYS if entry[k] is not None]
    if state != "file" and given:
        raise EntryError(f"{path}: state {state} takes none of {', '.join(given)}")
    if state == "file":
        whole = [k for k in given if k in ("content", "secret_content")]
        if len(whole) > 1 or (whole and len(given) > 1):
            raise EntryError(f"{path}: give content, secret_content, or lines/absent_lines, not several")
        if not given:
            raise EntryError(f"{path}: state file needs content, secret_content, lines or absent_lines")
    if entry["mode"] is not None and not re.fullmatch(r"0?[0-7]{3,4}", entry["mode"]):
        raise EntryError(f"{path}: mode {entry['mode']!r} is not an octal string such as '0644'")


def edit_lines(text, lines, absent):
    """The text with every line of `lines` present (see the option) and every `absent` match removed.

    The text comes back as it was when no line changes; otherwise one newline ends each line."""
    rows = text.splitlines()
    kept = list(rows)
    for pattern in absent:
        regex = re.compile(pattern)
        rows = [row for row in rows if not regex.search(row)]
    for want in lines:
        regex = re.compile(want["regexp"]) if want["regexp"] is not None else None
        found = [i for i, row in enumerate(rows) if (regex.search(row) if regex else row == want["line"])]
        if found:
            rows[found[-1]] = want["line"]
        else:
            rows.append(want["line"])
    if rows == kept:
        return text
    return "".join(row + "\n" for row in rows)


def read_text(path):
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise EntryError(f"{path}: is a directory, not a file") from None
    except UnicodeDecodeError:
        raise EntryError(f"{path}: is not UTF-8 text") from None


def write_text(path, text, mode):
    """Write atomically: a temporary file in the same folder, with the final mode and the old file's owner
    before it is renamed over the old one (a secret is never readable by others, not even for a moment)."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise EntryError(f"{path}: the folder {folder} does not exist (add it as a directory entry first)")
    old = os.stat(path) if os.path.exists(path) else None
    if mode is not None:
        mode = int(mode, 8)
    elif old is not None:
        mode = stat.S_IMODE(old.st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpulab-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if old is not None and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
            os.chown(tmp, old.st_uid, old.st_gid)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def file_args(entry):
    return {
        "path": entry["path"],
        "mode": entry["mode"],
        "owner": entry["owner"],
        "group": entry["group"],
        "secontext": None,
        "attributes": None,
    }


def _keep_attributes(module, entry, diffs):
    """Owner, group and mode of an existing path set as given; True (with a diff) when any changed."""
    path = entry["path"]
    diff = {"before_header": path, "after_header": path, "before": {}, "after": {}}
    changed = module.set_fs_attributes_if_different(file_args(entry), False, diff)
    if changed:
        diffs.append(diff)
    return changed


def apply_entry(module, entry, diffs, missing):
    """Bring one entry to its state; whether it changed (or would)."""
    path, state, check = entry["path"], entry["state"], module.check_mode
    if state == "present":
        if not os.path.isfile(path):
            if os.path.exists(path):
                raise EntryError(f"{path}: exists and is not a file")
            missing.append(path)
            return False
        return _keep_attributes(module, entry, diffs)
    if state == "absent":
        if os.path.isdir(path) and not os.path.islink(path):
            raise EntryError(f"{path}: is a directory; this module removes files only")
        if not os.path.lexists(path):
            return False
        diffs.append(
            {
                "before_header": path,
                "after_header": path,
                "before": {"state": "file"},
                "after": {"state": "absent"},
            }
        )
        if not check:
            os.unlink(path)
        return True

    if state == "directory":
        if os.path.exists(path) and not os.path.isdir(path):
            raise EntryError(f"{path}: exists and is not a directory")
        if not os.path.isdir(path):
            diffs.append(
                {"before_header": path, "after_header": path, "before": {}, "after": {"state": "directory"}}
            )
            if check:
                return True
            os.makedirs(path)
            module.set_fs_attributes_if_different(file_args(entry), True)
            return True
        return _keep_attributes(module, entry, diffs)

    before = read_text(path)
    secret = entry["secret_content"] is not None
    if entry["content"] is not None or secret:
        after = entry["secret_content"] if secret else entry["content"]
    elif before is None and not entry["lines"]:
        return False  # only lines to remove, from a file that is not there
    else:
        after = edit_lines(before or "", entry["lines"] or [], entry["absent_lines"] or [])
    changed = before != after
    if changed:
        shown = ("(secret, not shown)\n", "(secret, changed)\n") if secret else (before or "", after)
        diffs.append({"before_header": path, "after_header": path, "before": shown[0], "after": shown[1]})
        if check:
            return True
        write_text(path, after, entry["mode"])
    diff = {"before_header": path, "after_header": path, "before": {}, "after": {}}
    if module.set_fs_attributes_if_different(file_args(entry), False, diff):
        if diff["before"] or diff["after"]:
            diffs.append(diff)
        return True
    return changed


def run_module():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    changed_paths, diffs, missing = [], [], []
    try:
        for entry in module.params["files"]:
            check_entry(entry)
        for entry in module.params["files"]:
            if apply_entry(module, entry, diffs, missing):
                changed_paths.append(entry["path"])
    except (EntryError, re.error, OSError) as exc:
        module.fail_json(
            msg=str(exc), changed=bool(changed_paths), changed_paths=changed_paths, missing_paths=missing
        )
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths, "missing_paths": missing}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
