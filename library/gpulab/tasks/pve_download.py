"""pve_download: a file (ISO, disk image) downloaded by PVE itself, checked against its checksum."""

from __future__ import annotations

from gpulab.pve import connection, download
from gpulab.tasks import Run, Task

NOT_DOWNLOAD = ("upid", "poll_interval")  # the options that are not arguments of download.ensure_download


def run(task: Task) -> dict:
    p = task.params
    name = download.normalise_filename(p["filename"])
    volid = f"{p['storage']}:{p['content']}/{name}"
    result = {
        "volid": volid,
        "present_before": False,
        "transferred": False,
        "upid": p["upid"] or "",
        "done": True,
        "progress": None,
        "log": [],
        "msg": "",
    }
    what = f"Downloading {p['url']} to {volid} on node {p['node']}"
    with Run(task, what, download.DownloadError, result=result) as run:
        client = run.connect()
        if p["upid"]:
            state = download.task_status(client, p["node"], p["upid"])
            result.update(
                done=state["done"],
                progress=state["progress"],
                log=state["log"],
                bytes=state["bytes"],
                total=state["total"],
                rate=state["rate"],
            )
            if state["done"] and not state["ok"]:
                raise download.DownloadError(f"PVE could not download {volid}: {state['exitstatus']}")
            result["transferred"] = state["done"] and not state["reused"]
            result["msg"] = f"{volid}: {'done' if state['done'] else 'downloading'}" + (
                f", {state['progress']:.0f}%" if state["progress"] is not None else ""
            )
        else:
            # every option of the module (plugins/modules/pve_download.py) but the connection's, upid and
            # poll_interval is an argument of the engine's download
            own = {k: v for k, v in p.items() if k not in connection.OPTIONS and k not in NOT_DOWNLOAD}
            res = download.ensure_download(client, check_mode=task.check_mode, **own)
            result.update(
                changed=res.changed,
                present_before=res.present_before,
                transferred=res.transferred,
                upid=res.upid,
                done=p["wait"] or not res.upid,
                progress=res.progress,
                log=res.log,
                msg=res.msg,
            )
            if task.diff:
                result["diff"] = {
                    "before": f"{volid}: {'present' if res.present_before else 'absent'}\n",
                    "after": f"{volid}: present (checksum {p['checksum_algorithm']} {p['checksum'] or 'not given'})\n",
                }
    return run.done()
