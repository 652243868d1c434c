"""Filters of stage host: the card checks of `gpulab doctor` (gpulab.doctor), on the text its read printed.

`read.stdout | doctor` is the report as data (node findings, per card slot its findings, reset methods,
largest BAR, and the report's text); `read.stdout | doctor_problems(pve_gpus, vms)` lists what stops stage
host for the node's inventory cards (gpulab.doctor.stage_host_problems); `read.stdout | doctor_vm_cpu(cpu,
slots)` is a VM's cpu option with the guest address width its large-BAR cards need, and why (gpulab.doctor.vm_cpu;
stage vms). `gpulab_pci.display_adapters | nomodeset(slots, setting)` is whether stage host puts nomodeset on
the kernel command line, and why (gpulab.doctor.nomodeset_decision). `'' | doctor_script` is the read
itself (one read-only shell script), so the role and the command run the same one.
"""

from __future__ import annotations

from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import doctor
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    doctor = MissingEngine(err)


def doctor_report(text):
    return doctor.as_dict(doctor.analyse(text or ""))


def doctor_problems(text, gpus, vms):
    return doctor.stage_host_problems(doctor.analyse(text or ""), list(gpus or []), list(vms or []))


def doctor_vm_cpu(text, cpu, slots):
    if not text:
        return {"cpu": cpu, "why": ""}
    return doctor.vm_cpu(doctor.analyse(text), str(cpu), list(slots or []))


def nomodeset(adapters, slots, setting="auto"):
    return doctor.nomodeset_decision(list(adapters or []), [str(s) for s in slots or []], setting)


def doctor_script(_unused=""):
    return doctor.SCRIPT


class FilterModule:
    def filters(self):
        return {
            "doctor": doctor_report,
            "doctor_problems": doctor_problems,
            "doctor_script": doctor_script,
            "doctor_vm_cpu": doctor_vm_cpu,
            "nomodeset": nomodeset,
        }
