"""Which VMs are gpulab's: the PVE tag `gpulab` goes on a VM in its create call only (an adopted VM never gets it),
and pve_vm's state=absent with owner_tag destroys only a tagged VM, or one named with destroy_untagged,
after a vzdump backup when asked (a failed backup destroys nothing)."""

from __future__ import annotations

from unit.pve.conftest import run_module, small_vm_args

from gpulab.vmspec import OWNER_TAG


def owned(lab, **over):
    """small_vm_args as stage vms sends a VM: the owner tag among the create-only options."""
    return small_vm_args(lab, tags=[OWNER_TAG], create_only=["tags"], **over)


def tags(lab, vmid=100):
    return lab.client().get(f"nodes/pve/qemu/{vmid}/config").get("tags")


def make_by_hand(lab, vmid=101, name="mine", **config):
    client = lab.client()
    client.wait_task("pve", client.post("nodes/pve/qemu", vmid=vmid, name=name, memory=512, **config), 30)


def test_a_created_vm_carries_the_tag_and_an_adopted_one_never_gets_it(lab):
    res = run_module("pve_vm", owned(lab))
    assert res["created"] and tags(lab) == OWNER_TAG
    make_by_hand(lab, tags="photos")
    adopted = run_module("pve_vm", owned(lab, vmid=101, name="mine", memory=512))
    assert not adopted.get("failed"), adopted
    assert "tags" not in adopted["set"] and tags(lab, 101) == "photos"
    again = run_module("pve_vm", owned(lab, vmid=101, name="mine", memory=512))
    assert again["changed"] is False and tags(lab, 101) == "photos"


def test_absent_with_owner_tag_keeps_a_vm_gpulab_did_not_create(lab):
    make_by_hand(lab)
    mark = lab.mark()
    res = run_module("pve_vm", owned(lab, vmid=101, name="mine", state="absent", owner_tag=OWNER_TAG))
    assert res["changed"] is False and res["status"] == "stopped", res
    assert "does not carry the tag 'gpulab'" in res["kept"] and "gpulab_teardown_adopted=mine" in res["kept"]
    assert lab.writes(mark) == []
    named = owned(lab, vmid=101, name="mine", state="absent", owner_tag=OWNER_TAG, destroy_untagged=True)
    assert run_module("pve_vm", named, check=True)["actions"] == ["destroy"]
    assert run_module("pve_vm", named)["changed"] and lab.client().get("cluster/resources", type="vm") == []


def test_a_backup_is_taken_before_the_destroy_and_outlives_it(lab):
    run_module("pve_vm", owned(lab, state="started"))
    gone = owned(lab, state="absent", owner_tag=OWNER_TAG, backup_storage="local")
    assert run_module("pve_vm", gone, check=True)["actions"] == ["backup", "destroy"]
    mark = lab.mark()
    res = run_module("pve_vm", gone)
    assert res["changed"] and res["actions"] == ["backup", "destroy"], res
    assert res["backup"].startswith("/var/lib/vz/dump/vzdump-qemu-100-") and res["backup"].endswith(
        ".vma.zst"
    )
    writes = [f"{w['method']} {w['path'].split('/api2/json')[1]}" for w in lab.writes(mark)]
    assert writes == [
        "POST /nodes/pve/vzdump",
        "POST /nodes/pve/qemu/100/status/stop",
        "DELETE /nodes/pve/qemu/100",
    ]
    content = lab.client().get("nodes/pve/storage/local/content", content="backup")
    assert [v["volid"].rsplit("/", 1)[-1] for v in content] == [res["backup"].rsplit("/", 1)[-1]]


def test_a_failed_backup_destroys_nothing(lab):
    run_module("pve_vm", owned(lab))
    res = run_module("pve_vm", owned(lab, state="absent", owner_tag=OWNER_TAG, backup_storage="local-zfs"))
    assert res["failed"] and "the VM was NOT destroyed" in res["msg"], res
    assert "can't use storage 'local-zfs' for backups - wrong content type" in res["msg"]
    assert [v["vmid"] for v in lab.client().get("cluster/resources", type="vm")] == [100]
