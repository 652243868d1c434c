"""Many clients at once: a playbook with forks=10 must not see simulator errors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def test_parallel_creates_and_listings_never_fail(lab):
    def worker(i: int) -> list[int]:
        api = lab.token_api()
        statuses = []
        upid = api.data(
            "POST",
            "/nodes/pve/qemu",
            vmid=600 + i,
            memory="512",
            scsi0="local-zfs:1",
            net0="virtio,bridge=vmbr0",
        )
        for _ in range(10):
            statuses.append(api.get("/cluster/resources").status_code)
            statuses.append(api.get("/nodes/pve/qemu").status_code)
        statuses.append(api.wait(upid)["exitstatus"] == "OK" and 200)
        return statuses

    with ThreadPoolExecutor(10) as pool:
        results = [s for r in pool.map(worker, range(10)) for s in r]
    assert set(results) == {200}
    api = lab.token_api()
    vms = {v["vmid"] for v in api.data("GET", "/nodes/pve/qemu")}
    assert set(range(600, 610)) <= vms
    disks = [v["volid"] for v in api.data("GET", "/nodes/pve/storage/local-zfs/content")]
    assert len(disks) == len(set(disks)), "no volume name handed out twice"
