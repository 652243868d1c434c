"""kernel_cmdline: the merge (examples and properties), GRUB quoting against bash, the module run."""

import os
import pathlib
import shlex
import stat
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import load_module, run_module

k = load_module("kernel_cmdline")

REF_BLACKLIST = ["nova_core", "nova_drm", "nova", "nouveau"]
REF = {"present": ["nomodeset"], "blacklist": REF_BLACKLIST}
INSTALLER_LINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs \n"
REFERENCE_LINE = (
    "root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau\n"
)


def wanted(present=(), absent=(), blacklist=(), blacklist_absent=()):
    return {
        "present": list(present),
        "absent": list(absent),
        "blacklist": list(blacklist),
        "blacklist_absent": list(blacklist_absent),
    }


# --- examples ---------------------------------------------------------------------------------------------


def test_installer_line_becomes_reference_line():
    text, before, after, changes = k.edit_cmdline_file(INSTALLER_LINE, **wanted(**REF))
    assert text == REFERENCE_LINE
    assert before == INSTALLER_LINE.rstrip("\n") and after == REFERENCE_LINE.rstrip("\n")
    assert changes == ["added nomodeset", "added modprobe.blacklist=nova_core,nova_drm,nova,nouveau"]
    assert k.edit_cmdline_file(text, **wanted(**REF)) == (text, after, after, [])


def test_merges_into_existing_blacklist_and_keeps_other_lines():
    text = "root=ZFS=rpool/ROOT/pve-1 modprobe.blacklist=nvidiafb,nouveau boot=zfs quiet\n# second line\n"
    out, _b, after, _c = k.edit_cmdline_file(text, **wanted(**REF))
    assert (
        after
        == "root=ZFS=rpool/ROOT/pve-1 modprobe.blacklist=nvidiafb,nouveau,nova_core,nova_drm,nova boot=zfs quiet nomodeset"
    )
    assert out.endswith("\n# second line\n")
    assert after.count("modprobe.blacklist=") == 1


def test_blacklist_spread_over_two_lists_and_dash_spelling_counts():
    line = 'root=x modprobe.blacklist=nova-core,nova_drm modprobe.blacklist="nova,nouveau" nomodeset'
    assert k.edit_words(line.split(), **wanted(**REF)) == (line.split(), [])


def test_removal_is_symmetric():
    words, changes = k.edit_words(
        REFERENCE_LINE.split(), **wanted(absent=["nomodeset"], blacklist_absent=REF_BLACKLIST)
    )
    assert words == ["root=ZFS=rpool/ROOT/pve-1", "boot=zfs"]
    assert "removed nomodeset" in changes
    words, _ = k.edit_words(
        ["root=x", "modprobe.blacklist=nvidiafb,nouveau"], **wanted(blacklist_absent=["nouveau"])
    )
    assert words == ["root=x", "modprobe.blacklist=nvidiafb"]


def test_value_replaced_in_place_and_duplicates_dropped():
    words, changes = k.edit_words(["a", "iommu=soft", "b", "iommu=pt", "c"], **wanted(present=["iommu=pt"]))
    assert words == ["a", "iommu=pt", "b", "c"]
    assert changes == ["replaced iommu=soft with iommu=pt", "removed duplicate iommu=pt"]


def test_absent_with_value_removes_only_that_value():
    words, _ = k.edit_words(["a", "intel_iommu=on", "intel_iommu=off"], **wanted(absent=["intel_iommu=off"]))
    assert words == ["a", "intel_iommu=on"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"present": ["a b"]}, "not a plain name"),
        ({"present": ['x="y"']}, "not a plain name"),
        ({"present": ["modprobe.blacklist=a"]}, "blacklist and blacklist_absent"),
        ({"present": ["nomodeset"], "absent": ["nomodeset"]}, "both present and absent"),
        ({"blacklist": ["nouveau"], "blacklist_absent": ["nouveau"]}, "both blacklisted"),
        ({"blacklist": ["bad,name"]}, "not valid"),
    ],
)
def test_conflicting_or_unsafe_options_are_refused(args, message):
    with pytest.raises(k.CmdlineError, match=message):
        k.validate(**wanted(**args))


def test_root_parameter_is_protected():
    with pytest.raises(k.CmdlineError, match="root="):
        k.edit_cmdline_file("root=ZFS=rpool boot=zfs\n", **wanted(absent=["root"]))


def test_pending_reboot_reads_the_running_line():
    running = "initrd=\\EFI\\proxmox\\6.17.2-1-pve\\initrd.img-6.17.2-1-pve " + REFERENCE_LINE
    assert k.pending_reboot(running, **wanted(**REF)) == []
    reasons = k.pending_reboot("root=x modprobe.blacklist=nouveau", **wanted(**REF))
    assert reasons[0] == "nomodeset is not on the running command line"
    assert "nova_core is not in modprobe.blacklist= of the running command line" in reasons
    assert k.pending_reboot("root=x nomodeset", **wanted(absent=["nomodeset"])) == [
        "nomodeset is still on the running command line"
    ]


# --- GRUB ---------------------------------------------------------------------------------------------------

GRUB_DEFAULT = (
    "# If you change this file, run 'update-grub' afterwards to update\n"
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
    'GRUB_DISTRIBUTOR="Proxmox VE"\n'
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    'GRUB_CMDLINE_LINUX=""\n'
)


def shell_value(text, var="GRUB_CMDLINE_LINUX_DEFAULT"):
    """What the shell (as grub-mkconfig sources the file) makes of the variable."""
    proc = subprocess.run(
        ["bash", "-c", f'set -e; X=XX; source /dev/stdin; printf %s "${var}"'],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_grub_reference_edit():
    out, before, _after, _ = k.edit_grub(GRUB_DEFAULT, **wanted(**REF))
    assert before == "quiet"
    assert (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"\n'
        in out
    )
    assert (
        out.replace(
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"',
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
        )
        == GRUB_DEFAULT
    )
    assert k.edit_grub(out, **wanted(**REF))[0] == out


@pytest.mark.parametrize(
    "assignment",
    [
        "GRUB_CMDLINE_LINUX_DEFAULT='quiet splash'",
        "GRUB_CMDLINE_LINUX_DEFAULT=quiet",
        'export GRUB_CMDLINE_LINUX_DEFAULT="quiet $X"  # keep me',
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet dyndbg=\\"file a.c +p\\" a\\\\b"',
        "GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"' splash'\\ x",
        "GRUB_CMDLINE_LINUX_DEFAULT='it'\\''s \"odd\" $HOME `x`'",
    ],
)
def test_grub_quoting_keeps_shell_meaning(assignment):
    text = GRUB_DEFAULT + assignment + "\n"
    old = shell_value(text)
    out, _b, _a, changes = k.edit_grub(text, **wanted(**REF))
    assert changes
    new = shell_value(out)
    assert new == old + " nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"
    assert "# keep me" in out or "# keep me" not in assignment
    # Only the effective (last) assignment changed.
    assert out.splitlines()[:-1] == text.splitlines()[:-1]


def test_grub_without_assignment_appends_one():
    out, before, _a, _c = k.edit_grub("GRUB_DEFAULT=0", **wanted(present=["nomodeset"]))
    assert before == ""
    assert out == 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="nomodeset"\n'


def test_grub_multiline_value_is_refused():
    with pytest.raises(k.CmdlineError, match="spanning lines"):
        k.edit_grub('GRUB_CMDLINE_LINUX_DEFAULT="quiet\nsplash"\n', **wanted(**REF))


# --- properties ---------------------------------------------------------------------------------------------

NAMES = st.sampled_from(
    ["quiet", "splash", "nomodeset", "iommu", "intel_iommu", "boot", "root", "acpi", "x.y"]
)
MODS = st.sampled_from(["nouveau", "nova_core", "nova-core", "nova", "nova_drm", "nvidiafb", "snd_hda_intel"])
VALUES = st.sampled_from(["on", "off", "pt", "zfs", "ZFS=rpool/ROOT/pve-1", "1", '"a b"', ""])


@st.composite
def words_strategy(draw):
    out = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["flag", "param", "blacklist"]))
        if kind == "flag":
            out.append(draw(NAMES))
        elif kind == "param":
            out.append(f"{draw(NAMES)}={draw(VALUES)}")
        else:
            mods = draw(st.lists(MODS, min_size=1, max_size=4))
            out.append("modprobe.blacklist=" + ",".join(mods))
    return out


@st.composite
def wanted_strategy(draw):
    present = draw(
        st.lists(
            st.one_of(NAMES, st.builds("{}={}".format, NAMES, st.sampled_from(["on", "pt", "1"]))),
            max_size=3,
            unique_by=k.word_name,
        )
    )
    names = {k.word_name(p) for p in present}
    absent = [a for a in draw(st.lists(NAMES, max_size=2, unique=True)) if a not in names]
    bl = draw(st.lists(MODS, max_size=4, unique_by=k._mod))
    bl_absent = [
        m
        for m in draw(st.lists(MODS, max_size=2, unique_by=k._mod))
        if k._mod(m) not in {k._mod(b) for b in bl}
    ]
    return wanted(present, absent, bl, bl_absent)


def managed(word, w):
    name = k.word_name(word)
    return (
        name == "modprobe.blacklist" or name in {k.word_name(p) for p in w["present"]} or name in w["absent"]
    )


@settings(max_examples=300, deadline=None)
@given(words=words_strategy(), w=wanted_strategy())
def test_merge_properties(words, w):
    out, _changes = k.edit_words(words, **w)
    # 1. idempotent
    assert k.edit_words(out, **w) == (out, [])
    # 2. every other parameter kept exactly, in its order
    assert [x for x in out if not managed(x, w)] == [x for x in words if not managed(x, w)]
    # 3. each present parameter exactly once, with its value; absent ones gone
    for p in w["present"]:
        assert [k._unquote_word(x) for x in out if k.word_name(x) == k.word_name(p)] == [p]
    for a in w["absent"]:
        assert all(k.word_name(x) != a for x in out)
    # 4. blacklist: wanted modules listed, removed ones not; no new list when one existed
    listed = [
        k._mod(m) for x in out if k.word_name(x) == "modprobe.blacklist" for m in k.blacklist_modules(x)
    ]
    assert all(k._mod(m) in listed for m in w["blacklist"])
    assert all(k._mod(m) not in listed for m in w["blacklist_absent"])
    before_lists = sum(k.word_name(x) == "modprobe.blacklist" for x in words)
    after_lists = sum(k.word_name(x) == "modprobe.blacklist" for x in out)
    assert after_lists <= max(before_lists, 1)
    # 5. the running line equal to the result needs no reboot
    assert k.pending_reboot(" ".join(out), **w) == []


@settings(max_examples=100, deadline=None)
@given(words=words_strategy(), w=wanted_strategy(), order=st.randoms())
def test_merge_does_not_depend_on_parameter_order(words, w, order):
    shuffled = list(words)
    order.shuffle(shuffled)
    a, _ = k.edit_words(words, **w)
    b, _ = k.edit_words(shuffled, **w)
    assert sorted(x for x in a if not managed(x, w)) == sorted(x for x in b if not managed(x, w))
    for p in w["present"]:
        assert (p in a) == (p in b)


SHELL_STYLES = st.sampled_from(["double", "single", "escaped"])


def shell_quote(value, style):
    if style == "single":
        return shlex.quote(value) if value else "''"
    if style == "escaped":
        return "".join("\\" + c if not c.isalnum() and c not in "=,./_-" else c for c in value) or '""'
    return '"' + "".join("\\" + c if c in '$`"\\' else c for c in value) + '"'


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=words_strategy(), w=wanted_strategy(), style=SHELL_STYLES)
def test_grub_properties_against_bash(words, w, style):
    value = " ".join(words)
    text = GRUB_DEFAULT.replace(
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"', "GRUB_CMDLINE_LINUX_DEFAULT=" + shell_quote(value, style)
    )
    assert shell_value(text) == value
    out, _b, _a, _c = k.edit_grub(text, **w)
    expected, _ = k.edit_words(k.split_words(value), **w)
    assert k.split_words(shell_value(out)) == expected
    assert shell_value(out, "GRUB_DISTRIBUTOR") == "Proxmox VE"
    assert k.edit_grub(out, **w)[0] == out


# --- the module as Ansible runs it -----------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path):
    """A node's files: systemd-boot cmdline as the installer writes it, GRUB defaults, running cmdline."""
    (tmp_path / "cmdline").write_text(INSTALLER_LINE)
    (tmp_path / "grub").write_text(GRUB_DEFAULT)
    (tmp_path / "proc_cmdline").write_text("initrd=\\EFI\\proxmox\\x\\initrd.img-x " + INSTALLER_LINE)
    (tmp_path / "bin").mkdir()
    return tmp_path


def args_for(node, **extra):
    return {
        "cmdline_file": str(node / "cmdline"),
        "grub_file": str(node / "grub"),
        "boot_uuids_file": str(node / "uuids"),
        "efi_dir": str(node / "efi"),
        "grub_cfg": str(node / "grub.cfg"),
        "proc_cmdline": str(node / "proc_cmdline"),
        **REF,
        **extra,
    }


def fake_tool(node, output, rc=0):
    tool = node / "bin" / "proxmox-boot-tool"
    tool.write_text(
        f"#!/bin/sh\necho \"$*\" >> {node}/calls\nprintf '%s\\n' {shlex.quote(output)}\nexit {rc}\n"
    )
    tool.chmod(0o755)
    return {"PATH": f"{node / 'bin'}:{os.environ['PATH']}"}


def esp_registered(node, efi=True):
    """The node as a ZFS install leaves it: its ESP registered with proxmox-boot-tool, booted with UEFI."""
    (node / "uuids").write_text("9A3B-1C2D\n")
    if efi:
        (node / "efi").mkdir()


def test_module_check_mode_and_diff_change_nothing(node):
    esp_registered(node)
    result = run_module("kernel_cmdline", args_for(node), check_mode=True, diff=True)
    assert result["changed"] is True and result["boot_loader"] == "systemd-boot"
    assert result["diff"]["before"] == INSTALLER_LINE and result["diff"]["after"] == REFERENCE_LINE
    assert (node / "cmdline").read_text() == INSTALLER_LINE
    assert sorted(p.name for p in node.iterdir()) == [
        "bin",
        "cmdline",
        "efi",
        "grub",
        "proc_cmdline",
        "uuids",
    ]


def test_module_writes_backup_and_is_idempotent(node):
    esp_registered(node)
    os.chmod(node / "cmdline", 0o640)
    first = run_module("kernel_cmdline", args_for(node))
    assert first["changed"] is True and first["refresh_command"] == ["proxmox-boot-tool", "refresh"]
    assert (
        first["reboot_needed"] is True and "nomodeset is not on the running command line" in first["pending"]
    )
    assert (node / "cmdline").read_text() == REFERENCE_LINE
    assert stat.S_IMODE(os.stat(node / "cmdline").st_mode) == 0o640
    assert pathlib.Path(first["backup_file"]).read_text() == INSTALLER_LINE
    second = run_module("kernel_cmdline", args_for(node))
    assert (
        second["changed"] is False and second["refresh_needed"] is False and second["reboot_needed"] is True
    )
    (node / "proc_cmdline").write_text("initrd=\\EFI\\x " + REFERENCE_LINE)
    third = run_module("kernel_cmdline", args_for(node))
    assert third["changed"] is False and third["reboot_needed"] is False and third["pending"] == []
    assert (node / "grub").read_text() == GRUB_DEFAULT


def test_module_grub_when_no_kernel_cmdline(node):
    (node / "cmdline").unlink()
    result = run_module("kernel_cmdline", args_for(node))
    assert result["boot_loader"] == "grub" and result["refresh_command"] == ["update-grub"]
    assert (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"'
        in (node / "grub").read_text()
    )


def test_module_grub_on_esp_from_proxmox_boot_tool(node):
    (node / "uuids").write_text("9A3B-1C2D\n")
    env = fake_tool(
        node,
        "System currently booted with legacy bios\n9A3B-1C2D is configured with: grub (versions: 6.17.2-1-pve)",
    )
    result = run_module("kernel_cmdline", args_for(node), env=env)
    assert result["boot_loader"] == "grub" and result["refresh_command"] == ["proxmox-boot-tool", "refresh"]
    assert "configured with grub only" in result["detected_by"]
    assert (node / "cmdline").read_text() == INSTALLER_LINE
    assert (node / "calls").read_text() == "status\n"


def test_module_systemd_boot_from_proxmox_boot_tool(node):
    esp_registered(node)
    env = fake_tool(node, "9A3B-1C2D is configured with: uefi (versions: 6.14.11-4-pve, 6.17.2-1-pve)")
    result = run_module("kernel_cmdline", args_for(node), env=env)
    assert result["boot_loader"] == "systemd-boot" and "configured with uefi" in result["detected_by"]
    assert (node / "cmdline").read_text() == REFERENCE_LINE


def test_module_forced_grub_and_dropin_warning(node):
    (node / "grub.d").mkdir()
    (node / "grub.d" / "override.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="splash"\n')
    result = run_module("kernel_cmdline", args_for(node, boot_loader="grub"))
    assert result["boot_loader"] == "grub" and result["changed"] is True
    assert "override.cfg also sets GRUB_CMDLINE_LINUX_DEFAULT" in str(result["warnings"])


def test_module_refuses_with_clear_message(node):
    result = run_module("kernel_cmdline", args_for(node, absent=["nomodeset"]))
    assert result["failed"] is True and "both present and absent" in result["msg"]
    assert result["msg"].startswith("Editing the kernel command line: ")


def test_unbalanced_quote_is_refused():
    with pytest.raises(k.CmdlineError, match="unbalanced double quote"):
        k.edit_cmdline_file('root=x dyndbg="file a.c\n', **wanted(**REF))
    with pytest.raises(k.CmdlineError, match="unbalanced double quote"):
        k.edit_grub("GRUB_CMDLINE_LINUX_DEFAULT='quiet \"x'\n", **wanted(**REF))


# Any first line at all: printable text with quotes, '=', ',' and runs of spaces.
ANY_LINE = st.lists(
    st.sampled_from([*'abcnomdesta_.-=,"/ 0123', "  ", "\t", "nomodeset", "modprobe.blacklist="]), max_size=40
).map("".join)


@settings(max_examples=300, deadline=None)
@given(line=ANY_LINE, w=wanted_strategy(), rest=st.sampled_from(["", "second\n", "\n"]))
def test_any_existing_line(line, w, rest):
    text = f"root=ZFS=rpool/ROOT/pve-1 {line}\n{rest}"
    try:
        out, before, after, _changes = k.edit_cmdline_file(text, **w)
    except k.CmdlineError as exc:
        touches_root = "root" in w["absent"] or any(k.word_name(p) == "root" for p in w["present"])
        assert ("unbalanced double quote" in str(exc) and line.count('"') % 2 == 1) or (
            "no root= parameter" in str(exc) and touches_root
        )
        return
    assert before == text.split("\n", 1)[0]
    assert out.split("\n", 1)[1] == rest  # the other lines are kept byte for byte
    words = k.split_words(after, strict=True)
    old = k.split_words(before)
    assert [x for x in words if not managed(x, w)] == [x for x in old if not managed(x, w)]
    assert k.edit_cmdline_file(out, **w)[0] == out
    assert k.pending_reboot(after, **w) == []
    if out == text:
        assert k.edit_words(old, **w)[1] == []


# --- which boot loader the node boots (issue 43) -----------------------------------------------------------


def test_stray_kernel_cmdline_on_a_grub_node_is_refused_before_any_write(node):
    """/etc/kernel/cmdline left by a guide on a GRUB install (no ESP registered, `proxmox-boot-tool status`
    exits 2): the module refuses, names the files and the fix, and writes neither file."""
    (node / "grub.cfg").write_text("# generated by grub-mkconfig\n")
    (node / "efi").mkdir()
    env = fake_tool(node, "E: /etc/kernel/proxmox-boot-uuids does not exist.", rc=2)
    result = run_module("kernel_cmdline", args_for(node), env=env)
    assert result["failed"] is True
    msg = result["msg"]
    assert "the boot loader signals disagree" in msg
    assert f"{node / 'cmdline'} exists" in msg and f"({node / 'uuids'} does not exist" in msg
    assert f"the node boots GRUB ({node / 'grub.cfg'} exists" in msg and "on a UEFI boot" in msg
    assert f"remove the stray {node / 'cmdline'}" in msg and "proxmox-boot-tool init <ESP partition>" in msg
    assert (node / "cmdline").read_text() == INSTALLER_LINE and (node / "grub").read_text() == GRUB_DEFAULT
    assert sorted(p.name for p in node.iterdir()) == [
        "bin",
        "cmdline",
        "efi",
        "grub",
        "grub.cfg",
        "proc_cmdline",
    ]


def test_stray_kernel_cmdline_is_left_alone_when_the_owner_names_grub(node):
    result = run_module("kernel_cmdline", args_for(node, boot_loader="grub"))
    assert result["boot_loader"] == "grub" and result["refresh_command"] == ["update-grub"]
    assert (node / "cmdline").read_text() == INSTALLER_LINE
    assert f"{node / 'uuids'}: no ESP registered" in result["signals"]


def test_registered_esp_without_an_answer_follows_the_firmware(node):
    """An ESP in the list but `proxmox-boot-tool status` tells nothing: UEFI means systemd-boot, legacy BIOS GRUB
    on the ESP (what `proxmox-boot-tool init` installs on each)."""
    esp_registered(node)
    env = fake_tool(node, "WARN: /dev/disk/by-uuid/9A3B-1C2D does not exist - clean it! - skipping")
    result = run_module("kernel_cmdline", args_for(node), env=env, check_mode=True)
    assert result["boot_loader"] == "systemd-boot" and "UEFI boot" in result["detected_by"]
    (node / "efi").rmdir()
    result = run_module("kernel_cmdline", args_for(node), env=env, check_mode=True)
    assert result["boot_loader"] == "grub" and "legacy BIOS" in result["detected_by"]
    assert result["refresh_command"] == ["proxmox-boot-tool", "refresh"]
