"""`gpulab doctor [root@]HOST`: what stands between each NVIDIA card of a Proxmox VE node and a VM, read-only.

:data:`SCRIPT` is one shell read over SSH (files only, nothing written; ``GPULAB_SYSFS_ROOT`` points it at a
fixture tree in tests, as gpulab.discover's walk): the kernel command line, ``/proc/interrupts`` (which chips
deliver the interrupts), the IOMMU groups, the CPU's and the IOMMU's address widths, the framebuffers
(``/proc/fb``, ``/proc/iomem``), the PVE packages' versions (``/var/lib/dpkg/status``) and, per NVIDIA
function, its ids, class, boot_vga, driver, IOMMU group with the other members, ``reset_method`` and its BARs
(``resource``). :func:`analyse` is pure: it turns that text into :class:`Report`, one :class:`Finding` per
check, each with its fix. ``blocks`` is what stops passthrough (exit 1); ``warn`` what a user meets after
passthrough "works"; ``ok`` what was checked and is fine.

Where each rule comes from:

- IOMMU and interrupt remapping: pve-docs qm-pci-passthrough.adoc (shared/reference/pve-host.md 2): the
  ``IR-`` irq chips (Linux arch/x86/kernel/apic/msi.c ``pci_msi_ir_controller`` "IR-PCI-MSI", under
  CONFIG_IRQ_REMAP) are what ``/proc/interrupts`` shows when remapping is on; without it vfio_iommu_type1
  refuses the device unless ``allow_unsafe_interrupts=1``.
- The group: "It is okay if the device is in an IOMMU group together with its functions ... or with its root
  port or PCI(e) bridge" (same page).
- The framebuffer: the firmware's boot framebuffer (efifb, simplefb, simpledrm: ``/proc/fb`` names them)
  keeps the boot GPU's BAR reserved (``BOOTFB`` in ``/proc/iomem``).
- Reset: Linux drivers/pci/pci.c ``reset_method`` (the methods the kernel can use, e.g. ``flr bus``; empty:
  none); the Blackwell reset hang after a VM stops: NVIDIA/open-gpu-kernel-modules#853 (RTX 5070 Ti) and the
  RTX 5090 / RTX PRO 6000 reports of issue 31.
- Address width: qemu-server 9.0.18 ("close #6378: expose guest-phys-bits ... where the CPU address width and
  the IOMMU address width are different") and 9.1.7 ("warn when a VM uses a qemu64- or kvm64-derived CPU model
  without the 'pdpe1gb' flag, as OVMF will then limit the guest to 40 phys-bits ... GPU passthrough using lots
  of vRAM"), proxmox/qemu-server debian/changelog @e6352be6 (9.2.6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpulab import cards as nvidia

SCRIPT = r"""R="${GPULAB_SYSFS_ROOT:-}"
echo "== cmdline"; cat "$R/proc/cmdline" 2>/dev/null
echo "== interrupts"
if [ -r "$R/proc/interrupts" ]; then
  printf 'ir %s msi %s\n' "$(grep -c ' IR-' "$R/proc/interrupts")" "$(grep -c 'PCI-MSI' "$R/proc/interrupts")"
fi
echo "== groups"; ls "$R/sys/kernel/iommu_groups" 2>/dev/null | wc -l
echo "== cpu"; grep -m1 '^address sizes' "$R/proc/cpuinfo" 2>/dev/null
echo "== iommu"
for c in "$R"/sys/class/iommu/*/intel-iommu/cap; do [ -r "$c" ] && printf 'intel %s\n' "$(cat "$c")"; done
echo "== fb"; cat "$R/proc/fb" 2>/dev/null
echo "== iomem"; grep -i -e bootfb -e efifb -e simple "$R/proc/iomem" 2>/dev/null
echo "== dpkg"
awk '/^Package: /{p=$2} /^Version: /{if (p=="qemu-server"||p=="pve-manager"||p=="proxmox-ve") print p, $2}' \
  "$R/var/lib/dpkg/status" 2>/dev/null
echo "== display"
for d in "$R"/sys/bus/pci/devices/*; do
  c=$(cat "$d/class" 2>/dev/null); case "$c" in 0x03*) ;; *) continue ;; esac
  drv=$(readlink "$d/driver" 2>/dev/null)
  printf 'display %s %s:%s %s %s %s\n' "${d##*/}" "$(cat "$d/vendor")" "$(cat "$d/device")" "$c" \
    "$(cat "$d/boot_vga" 2>/dev/null || echo -)" "${drv##*/}"
done
echo "== boot"
if [ -d "$R/etc" ]; then
  for f in etc/kernel/cmdline etc/kernel/proxmox-boot-uuids boot/grub/grub.cfg sys/firmware/efi; do
    [ -e "$R/$f" ] && printf 'boot /%s\n' "$f"
  done
  grep -c -E '^[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}$' "$R/etc/kernel/proxmox-boot-uuids" 2>/dev/null | sed 's/^/esps /'
fi
echo "== devices"
for d in "$R"/sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
  a=${d##*/}; g=$(readlink "$d/iommu_group" 2>/dev/null); g=${g##*/}; drv=$(readlink "$d/driver" 2>/dev/null)
  rm_=$(cat "$d/reset_method" 2>/dev/null | tr ' ' ','); [ -e "$d/reset_method" ] || rm_=-
  printf 'dev %s %s %s %s %s %s %s %s %s\n' "$a" "$(cat "$d/device")" "$(cat "$d/class")" \
    "$(cat "$d/boot_vga" 2>/dev/null || echo -)" "${drv##*/}" "${g:--}" "${rm_:-none}" \
    "$([ -e "$d/reset" ] && echo reset || echo noreset)" "$(cat "$d/subsystem_device" 2>/dev/null || echo -)"
  i=0
  if [ -r "$d/resource" ]; then
    while read -r s e f; do printf 'bar %s %s %s %s %s\n' "$a" "$i" "$s" "$e" "$f"; i=$((i+1)); done < "$d/resource"
  fi
  [ -n "$g" ] || continue
  for m in "$R"/sys/kernel/iommu_groups/"$g"/devices/*; do
    [ -e "$m" ] || continue
    printf 'member %s %s %s %s\n' "$a" "${m##*/}" "$(cat "$m/vendor" 2>/dev/null)" "$(cat "$m/class" 2>/dev/null)"
  done
done
"""

BLOCKS, WARN, OK = "blocks", "warn", "ok"
#: A BAR this large (resizable BAR, 48 GB+ cards) needs more guest address width than OVMF's 40-bit cap.
LARGE_BAR = 32 << 30
#: OVMF's limit for a qemu64/kvm64-derived CPU without pdpe1gb (qemu-server 9.1.7's warning).
OVMF_CAPPED_BITS = 40
#: The first qemu-server with the guest-phys-bits CPU option.
GUEST_PHYS_BITS_SINCE = (9, 0, 18)
#: Host drivers of an NVIDIA display function (the others are vfio-pci, or none).
HOST_DRIVERS = ("nouveau", "nvidia", "nova_core", "nova-core", "nvidiafb")
FRAMEBUFFERS = (("simpledrm", "simpledrm"), ("EFI VGA", "efifb"), ("efifb", "efifb"), ("simple", "simplefb"))


#: Each finding's fix, by what it is about.
FIXES = {
    "iommu": "turn on VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the BIOS; on Intel with a kernel older than 6.8 also "
    "add the kernel parameter intel_iommu=on",
    "unsafe": "turn on interrupt remapping (VT-d / x2APIC, AMD-Vi) in the BIOS and drop the parameter",
    "remapping": "turn on interrupt remapping in the BIOS (Intel: VT-d and x2APIC; AMD: IOMMU), or as a last resort "
    "`options vfio_iommu_type1 allow_unsafe_interrupts=1` in /etc/modprobe.d (unsafe)",
    "group": "put the card in a slot with its own group (a CPU-attached x16 slot), or turn on ACS in the BIOS; the "
    "pcie_acs_override kernel patch removes isolation",
    "driver": "stage host blacklists the host drivers and binds vfio-pci (one reboot): `ansible-playbook site.yml "
    "--tags host -e pve_host_reboot_allowed=true`",
    "framebuffer": "add the kernel parameter initcall_blacklist=sysfb_init (simpledrm/simplefb; video=efifb:off for "
    "efifb), refresh the boot loader and reboot; keep vm_onboot off (the host loses its screen)",
    "no-reset": "keep the VM's start at boot off and reboot the host between VM starts; a BIOS update may add FLR",
    "reset-bug": "keep vm_onboot off; after the VM stops, reboot the host before starting it again",
    "upgrade": "upgrade PVE (qemu-server 9.0.18 or newer: apt full-upgrade)",
    "cpu-host": "vm_cpu: host (its address width is the host CPU's); a qemu64/kvm64 CPU model needs +pdpe1gb, or "
    "OVMF caps the guest at 40 bits (qemu-server 9.1.7's warning)",
}


#: The modules of an NVIDIA display function (kept off by stage host's blacklist, whatever nomodeset says).
NVIDIA_MODULES = ("nouveau", "nvidia", "nova_core", "nova_drm", "nova", "nvidiafb", "nvidia_drm")
#: The DRM driver of another vendor's display adapter, for a read without the modules' aliases (the doctor's).
DRM_BY_VENDOR = {"8086": "i915", "1002": "amdgpu", "1a03": "ast", "102b": "mgag200"}


@dataclass(frozen=True)
class Finding:
    level: str  # blocks | warn | ok
    check: str
    text: str
    fix: str = ""

    def line(self) -> str:
        tag = {BLOCKS: "BLOCKS", WARN: "warn  ", OK: "ok    "}[self.level]
        return f"[{tag}] {self.check}: {self.text}" + (f" Fix: {self.fix}" if self.fix else "")


@dataclass
class CardReport:
    address: str  # the slot, 0000:02:00
    card: nvidia.Card
    driver: str
    reset_methods: list[str]
    largest_bar: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def resettable(self) -> bool:
        return bool(self.reset_methods) and not any(
            f.check == "reset" and f.level != OK for f in self.findings
        )


@dataclass
class Report:
    node: list[Finding]
    cards: list[CardReport]
    qemu_server: str | None
    cpu_bits: int | None = None  # /proc/cpuinfo's "address sizes ... bits physical"
    iommu_bits: int | None = None  # the narrowest IOMMU's address width (Intel's cap register)

    @property
    def blocked(self) -> bool:
        return any(f.level == BLOCKS for f in self.node) or any(
            f.level == BLOCKS for c in self.cards for f in c.findings
        )

    def text(self) -> str:
        lines = [f.line() for f in self.node]
        for c in self.cards:
            lines.append(f"Card {c.address}: {c.card.describe()}, open kernel modules {c.card.open}")
            lines += [f"  {f.line()}" for f in c.findings]
        if not self.cards:
            lines.append("No NVIDIA display card on this node.")
        lines.append(
            "Nothing blocks passthrough."
            if not self.blocked
            else "Passthrough is blocked: fix each BLOCKS line."
        )
        return "\n".join(lines)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("== "):
            current = line[3:].strip()
            out.setdefault(current, [])
        elif line.strip():
            out.setdefault(current, []).append(line.rstrip())
    return out


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def _iommu_bits(caps: list[str]) -> int | None:
    """The narrowest Intel IOMMU's guest address width: MGAW, bits 21:16 of the capability register, plus 1
    (Intel VT-d specification, 11.4.2)."""
    widths = []
    for line in caps:
        try:
            widths.append(((int(line.split()[1], 16) >> 16) & 0x3F) + 1)
        except (IndexError, ValueError):
            continue
    return min(widths) if widths else None


def display_adapters(lines: list[str]) -> list[dict]:
    """The read's `display` lines as pci_facts' display_adapters (modules guessed by vendor)."""
    out = []
    for line in lines:
        words = line.split()
        if words[0] != "display" or len(words) < 5:
            continue
        vendor, _sep, device = words[2].partition(":")
        vendor, device = vendor.removeprefix("0x"), device.removeprefix("0x")
        guess = "nouveau" if vendor == "10de" else DRM_BY_VENDOR.get(vendor)
        out.append(
            {
                "address": words[1],
                "vendor_device": f"{vendor}:{device}",
                "class": words[3],
                "boot_vga": words[4] == "1",
                "driver": words[5] if len(words) > 5 else None,
                "modules": [guess] if guess else [],
            }
        )
    return out


def _display_findings(lines: list[str], cmdline: str) -> list[Finding]:
    """What stage host does about nomodeset on its own (auto), and what forcing it would cost: the NVIDIA
    cards count as passed through (the doctor does not read the inventory)."""
    adapters = display_adapters(lines)
    if not adapters:
        return []
    nvidia_slots = [a["address"] for a in adapters if a["vendor_device"].startswith("10de:")]
    decision = nomodeset_decision(adapters, nvidia_slots)
    text = f"stage host {'adds' if decision['on'] else 'leaves out'} nomodeset: {decision['why']}"
    if decision["others"] and not decision["on"]:
        text += f"; pve_host_nomodeset: true would take the driver off {', '.join(decision['others'])}"
    out = [Finding(OK, "nomodeset", text)]
    running = any(w.split("=", 1)[0].startswith("nomodeset") for w in cmdline.split())
    idle = [
        a for a in adapters if not a["vendor_device"].startswith("10de:") and not a["driver"] and a["modules"]
    ]
    if running and idle:
        names = ", ".join(f"{a['address']} ({a['vendor_device']}, {a['modules'][0]})" for a in idle)
        why = f"nomodeset is on the running command line and keeps {names} off its driver (no /dev/dri)"
        fix = (
            "let stage host decide (pve_host_nomodeset: auto, the default) and run it, or take nomodeset off the "
            "kernel command line yourself, refresh the boot loader and reboot"
        )
        out.append(Finding(WARN, "nomodeset", why, fix))
    return out


def _boot_findings(lines: list[str]) -> list[Finding]:
    """The boot loader the node boots, and a leftover /etc/kernel/cmdline nothing reads (stage host refuses it)."""
    present = {line.split(None, 1)[1] for line in lines if line.startswith("boot ")}
    esps = next((int(line.split()[1]) for line in lines if line.startswith("esps ")), 0)
    if not lines:
        return []  # a read of a hardware view without the node's /etc (stage host's own read)
    efi = "UEFI" if "/sys/firmware/efi" in present else "legacy BIOS"
    if esps:
        return [Finding(OK, "boot loader", f"proxmox-boot-tool keeps {esps} ESP(s) ({efi} boot)")]
    if "/etc/kernel/cmdline" in present:
        why = (
            "/etc/kernel/cmdline exists but no ESP is registered with proxmox-boot-tool (/etc/kernel/proxmox-boot-uuids "
            f"{'lists none' if '/etc/kernel/proxmox-boot-uuids' in present else 'does not exist'}): the node boots GRUB "
            f"({efi} boot) and nothing reads that file; stage host stops before any write"
        )
        fix = (
            "remove the stray /etc/kernel/cmdline (GRUB takes its parameters from /etc/default/grub), or run "
            "`proxmox-boot-tool init <ESP partition>` if the node should boot systemd-boot"
        )
        return [Finding(WARN, "boot loader", why, fix)]
    return [Finding(OK, "boot loader", f"GRUB from /boot/grub/grub.cfg ({efi} boot, no ESP registered)")]


def analyse(text: str) -> Report:
    s = _sections(text)
    node: list[Finding] = []
    cmdline = " ".join(s.get("cmdline", []))
    groups = int((s.get("groups") or ["0"])[0].strip() or 0)
    if groups:
        node.append(Finding(OK, "IOMMU", f"on ({groups} IOMMU groups)"))
    else:
        node.append(Finding(BLOCKS, "IOMMU", "off: the kernel made no IOMMU groups", FIXES["iommu"]))
    ir = (s.get("interrupts") or [""])[0].split()
    if len(ir) == 4 and groups:
        if int(ir[1]) > 0:
            node.append(Finding(OK, "interrupt remapping", f"on ({ir[1]} interrupts through IR- chips)"))
        elif "allow_unsafe_interrupts=1" in cmdline:
            why = "off, and vfio_iommu_type1.allow_unsafe_interrupts=1 lets vfio use the card anyway"
            node.append(Finding(WARN, "interrupt remapping", why, FIXES["unsafe"]))
        else:
            why = "off (no IR- interrupt chip in /proc/interrupts): vfio refuses to give the card to a VM"
            node.append(Finding(BLOCKS, "interrupt remapping", why, FIXES["remapping"]))
    dpkg = dict(line.split(None, 1) for line in s.get("dpkg", []) if len(line.split()) == 2)
    qemu_server = dpkg.get("qemu-server")
    if qemu_server:
        node.append(
            Finding(OK, "PVE", f"qemu-server {qemu_server}, pve-manager {dpkg.get('pve-manager', '?')}")
        )
    cpu_bits = None
    m = re.search(r"(\d+) bits physical", " ".join(s.get("cpu", [])))
    if m:
        cpu_bits = int(m.group(1))
    iommu_bits = _iommu_bits(s.get("iommu", []))
    fb_holder = None
    for line in s.get("fb", []):
        for needle, name in FRAMEBUFFERS:
            if needle in line:
                fb_holder = fb_holder or name
    if fb_holder is None and any("bootfb" in x.lower() for x in s.get("iomem", [])):
        fb_holder = "BOOTFB (firmware framebuffer)"

    node += _display_findings(s.get("display", []), cmdline)
    node += _boot_findings(s.get("boot", []))
    devs: dict[str, list[str]] = {}
    bars: dict[str, list[int]] = {}
    members: dict[str, list[tuple[str, str, str]]] = {}
    for line in s.get("devices", []):
        words = line.split()
        if words[0] == "dev" and len(words) >= 10:
            devs[words[1]] = words[2:]
        elif words[0] == "bar" and len(words) == 6:
            start, end = int(words[3], 16), int(words[4], 16)
            bars.setdefault(words[1], []).append(end - start + 1 if end > start else 0)
        elif words[0] == "member" and len(words) == 5:
            members.setdefault(words[1], []).append((words[2], words[3], words[4]))
    cards: list[CardReport] = []
    for addr, (device, cls, boot_vga, driver, group, reset_method, reset, _sub) in sorted(devs.items()):
        if not cls.startswith("0x03"):
            continue  # the card's audio/USB functions go with it
        slot = addr.rsplit(".", 1)[0]
        card = nvidia.card(f"10de:{device.removeprefix('0x')}")
        methods = [] if reset_method in ("none", "-") else reset_method.split(",")
        if reset_method == "-" and reset == "reset":
            methods = ["unknown"]  # a kernel without reset_method: the reset file says one exists
        rep = CardReport(slot, card, driver or "none", methods, max(bars.get(addr, [0]) or [0]))
        cards.append(rep)
        f = rep.findings
        # the group
        others = [
            (m, v, c)
            for m, v, c in members.get(addr, [])
            if m.rsplit(".", 1)[0] != slot and not c.startswith("0x0604")
        ]
        if group == "-":
            pass  # IOMMU off: said once for the node
        elif others:
            names = ", ".join(f"{m} (class {c})" for m, _v, c in others)
            why = f"group {group} also holds {names}: all of it would go to the VM"
            f.append(Finding(BLOCKS, "IOMMU group", why, FIXES["group"]))
        else:
            f.append(Finding(OK, "IOMMU group", f"group {group} holds only the card's own functions"))
        # the driver now
        if driver in HOST_DRIVERS:
            f.append(Finding(WARN, "driver", f"{driver} holds it now", FIXES["driver"]))
        else:
            f.append(Finding(OK, "driver", f"{driver or 'none'} (no host driver holds it)"))
        # the boot display's framebuffer
        if boot_vga == "1" and fb_holder:
            why = (
                f"the host's boot display is this card and {fb_holder} holds its memory: the VM can fail with "
                "'BAR 1: can't reserve' or show no picture"
            )
            f.append(Finding(WARN, "framebuffer", why, FIXES["framebuffer"]))
        elif boot_vga == "1":
            f.append(
                Finding(OK, "framebuffer", "the host's boot display, and no framebuffer holds its memory")
            )
        # reset
        if not methods:
            why = "no reset method (reset_method empty): it works once, then fails after the VM restarts"
            f.append(Finding(WARN, "reset", why, FIXES["no-reset"]))
        elif card.architecture == "blackwell":
            why = (
                f"reset methods {' '.join(methods)}, but Blackwell cards are known to hang on the reset after a "
                "VM stops (NVIDIA/open-gpu-kernel-modules#853)"
            )
            f.append(Finding(WARN, "reset", why, FIXES["reset-bug"]))
        else:
            flr = "flr" in methods
            text = f"reset methods: {' '.join(methods)}" + (
                "" if flr else " (no FLR: a bus reset resets the slot)"
            )
            f.append(Finding(OK, "reset", text))
        # BARs and the guest's address width
        big = rep.largest_bar
        if big >= LARGE_BAR:
            need = (
                f"a BAR of {big >> 30} GiB needs a guest physical address width above {OVMF_CAPPED_BITS} bits"
            )
            if iommu_bits and cpu_bits and iommu_bits < cpu_bits:
                narrow = f"the IOMMU's address width ({iommu_bits} bits) is below the CPU's ({cpu_bits})"
                if qemu_server and _version(qemu_server) < GUEST_PHYS_BITS_SINCE:
                    why = f"{need}, and {narrow}: qemu-server {qemu_server} cannot set guest-phys-bits"
                    f.append(Finding(BLOCKS, "BAR size", why, FIXES["upgrade"]))
                else:
                    fix = (
                        f"stage vms gives the VM that gets this card guest-phys-bits={iommu_bits} in its cpu "
                        f"option (cpu host,guest-phys-bits={iommu_bits}); vm_guest_phys_bits sets another width"
                    )
                    f.append(Finding(WARN, "BAR size", f"{need}; {narrow}", fix))
            else:
                f.append(Finding(WARN, "BAR size", need, FIXES["cpu-host"]))
        elif big:
            f.append(Finding(OK, "BAR size", f"largest BAR {big >> 20} MiB fits OVMF's default window"))
    return Report(node, cards, qemu_server, cpu_bits, iommu_bits)


def _slot(value: str) -> str:
    slot = str(value).strip().lower()
    slot = "0000:" + slot if re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}", slot) else slot
    return slot.rsplit(".", 1)[0] if re.search(r"\.[0-7]$", slot) else slot


def nomodeset_setting(value: object) -> bool | str | None:
    """pve_host_nomodeset as stage host reads it: None for auto (unset too), True or False for the owner's choice,
    the value itself (a string) when it is none of these (preflight refuses it)."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == "auto":
        return None
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    return str(value)


def _name(adapter: dict) -> str:
    drivers = [adapter.get("driver")] if adapter.get("driver") else list(adapter.get("modules") or [])
    held = (
        f"{adapter.get('driver')} holds it"
        if adapter.get("driver")
        else f"driver {', '.join(drivers) or '?'}"
    )
    return f"{adapter.get('address')} ({adapter.get('vendor_device')}, {held})"


def nomodeset_decision(adapters: list[dict], slots: list[str], setting: object = "auto") -> dict:
    """Whether stage host puts `nomodeset` on the kernel command line, and why.

    ``adapters``: the node's display controllers (class 0x03xx) as {address, vendor_device, boot_vga, driver,
    modules} (pci_facts' display_adapters); ``slots``: the passed-through cards (pve_gpus[].pci);
    ``setting``: pve_host_nomodeset (auto, or the owner's true/false, which stays). `nomodeset` makes every
    DRM driver refuse to load (Linux drivers/video/nomodeset.c video_firmware_drivers_only(); i915's
    i915_check_nomodeset, amdgpu and xe alike), so on auto it is on only when a passed-through card is the
    boot display and no other display adapter could drive a screen; elsewhere blacklisting the NVIDIA
    drivers keeps them off the card. Returns {on, why, others}: ``others`` names the adapters that lose their
    driver under nomodeset."""
    wanted = {_slot(s) for s in slots}
    passed = [a for a in adapters if _slot(a.get("address", "")) in wanted]
    others = []
    for a in adapters:
        if _slot(a.get("address", "")) in wanted:
            continue
        usable = [d for d in [a.get("driver"), *(a.get("modules") or [])] if d and d not in NVIDIA_MODULES]
        if usable:
            others.append(_name(a))
    boot = [a for a in passed if a.get("boot_vga")]
    boot_elsewhere = [a.get("address") for a in adapters if a.get("boot_vga") and a not in passed]
    forced = nomodeset_setting(setting)
    lose = f"; {', '.join(others)} would lose its DRM driver under it (/dev/dri goes)" if others else ""
    if forced is True:
        return {"on": True, "why": f"pve_host_nomodeset is true (the owner's choice){lose}", "others": others}
    if forced is False:
        return {"on": False, "why": "pve_host_nomodeset is false (the owner's choice)", "others": others}
    if boot and not others:
        why = (
            f"the passed-through card {_slot(boot[0]['address'])} is the host's boot display and no other display "
            "adapter could drive a screen: nomodeset keeps every DRM driver off it, the firmware framebuffer stays"
        )
        return {"on": True, "why": why, "others": others}
    if boot:
        why = (
            f"the passed-through card {_slot(boot[0]['address'])} is the boot display, but {', '.join(others)} can "
            "drive the host's screen; nomodeset would take that driver away, so the NVIDIA drivers are only "
            "blacklisted"
        )
    else:
        shown = f" ({', '.join(boot_elsewhere)} is)" if boot_elsewhere else ""
        why = f"no passed-through card is the boot display{shown}: blacklisting the NVIDIA drivers is enough{lose}"
    return {"on": False, "why": why, "others": others}


def large_bar_cards(report: Report) -> list[str]:
    """The slots of the cards whose BAR needs the wide guest address width."""
    return [c.address for c in report.cards if c.largest_bar >= LARGE_BAR]


def guest_address_width(report: Report, slots: list[str]) -> tuple[int, str] | None:
    """The guest-phys-bits a VM that gets the cards at ``slots`` needs, and why; None when it needs none.

    A card whose BAR needs the wide guest address space (:data:`LARGE_BAR`) behind an IOMMU narrower than the
    CPU: the guest must not place the BAR above what the IOMMU can map, so its physical address width is the
    IOMMU's (qemu-server 9.0.18, "close #6378"). With an older qemu-server stage host has already stopped the
    run (the BAR size finding blocks)."""
    if not (report.iommu_bits and report.cpu_bits and report.iommu_bits < report.cpu_bits):
        return None
    if report.qemu_server and _version(report.qemu_server) < GUEST_PHYS_BITS_SINCE:
        return None
    wanted = {str(s).lower() for s in slots}
    big = [c for c in report.cards if c.address in wanted and c.largest_bar >= LARGE_BAR]
    if not big:
        return None
    cards = ", ".join(f"{c.card.describe()} at {c.address} (BAR {c.largest_bar >> 30} GiB)" for c in big)
    why = (
        f"{cards}: the node's IOMMU maps {report.iommu_bits} address bits and its CPU has {report.cpu_bits}, so "
        f"the guest's physical address width is {report.iommu_bits} (gpulab doctor's BAR size finding)"
    )
    return report.iommu_bits, why


def vm_cpu(report: Report, cpu: str, slots: list[str]) -> dict[str, str]:
    """The cpu option of a VM with the cards at ``slots`` (``cpu``: the resolved spec's) with the address width
    :func:`guest_address_width` requires, and why (empty: ``cpu`` as it is). A cpu option that already names
    guest-phys-bits (vm_guest_phys_bits) is the owner's choice and stays."""
    width = guest_address_width(report, slots)
    if width is None or "guest-phys-bits=" in cpu:
        return {"cpu": cpu, "why": ""}
    return {"cpu": f"{cpu},guest-phys-bits={width[0]}", "why": width[1]}


def as_dict(report: Report) -> dict:
    """The report as plain data (the filter's answer): node findings, and per card slot its findings."""

    def rows(findings: list[Finding]) -> list[dict]:
        return [{"level": f.level, "check": f.check, "text": f.text, "fix": f.fix} for f in findings]

    return {
        "blocked": report.blocked,
        "node": rows(report.node),
        "qemu_server": report.qemu_server,
        "cards": {
            c.address: {
                "name": c.card.describe(),
                "architecture": c.card.architecture,
                "driver": c.driver,
                "reset_methods": c.reset_methods,
                "resettable": c.resettable,
                "largest_bar": c.largest_bar,
                "findings": rows(c.findings),
            }
            for c in report.cards
        },
        "text": report.text(),
    }


def stage_host_problems(report: Report, gpus: list[dict], vms: list[dict]) -> list[str]:
    """What stops stage host for the inventory's cards of this node (`gpus`: its pve_gpus; `vms`: the resolved
    VMs, gpulab.vmspec, of this node): interrupt remapping off, a blocking finding of one of its cards other than
    the IOMMU group (checked by stage host itself), and a card that cannot be reset given to a VM that starts at
    boot (it would work once, then hang the VM's next start or the host)."""
    if not gpus:
        return []
    out = [
        f"{f.check}: {f.text}. Fix: {f.fix}" for f in report.node if f.level == BLOCKS and f.check != "IOMMU"
    ]
    by_slot = {c.address: c for c in report.cards}
    for gpu in gpus:
        rep = by_slot.get(str(gpu.get("pci", "")).lower())
        if rep is None:
            continue  # not on the node: stage host's own check says so
        out += [
            f"GPU {gpu.get('id')} ({rep.address}) {f.check}: {f.text}. Fix: {f.fix}"
            for f in rep.findings
            if f.level == BLOCKS and f.check != "IOMMU group"
        ]
        if rep.resettable:
            continue
        for vm in vms:
            if gpu.get("id") in (vm.get("gpus") or []) and (vm.get("spec") or {}).get("onboot"):
                why = next((f.text for f in rep.findings if f.check == "reset"), "no reset method")
                out.append(
                    f"GPU {gpu.get('id')} ({rep.address}, {rep.card.describe()}) cannot be reset reliably ({why}), "
                    f"and {vm.get('host')} starts at boot with it: after the first stop the card hangs the VM's next "
                    f"start. Fix: set vm_onboot: false on {vm.get('host')} and start it by hand after each host boot"
                )
    return out
