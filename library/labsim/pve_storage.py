"""The PVE API simulator's storage room: a node's storages and their volumes (kept per node and storage: no
storage is shared), ``/nodes/{node}/storage/...`` and download-url with the fixture's ``downloads`` table for
the internet (as labsim.internet has it now), ``query-url-metadata``. A storage the fixture marks ``disable``
is listed with ``enabled`` and ``active`` 0 and refused by download-url, as pve-storage does.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any

from labsim import wget_log
from labsim.fixture import download_digest
from labsim.pve_common import ApiError
from labsim.pve_tasks import TaskFailed


class StorageHandlers:
    """Storages, volumes and downloads.

    Mixed into labsim.pve_api.PveApiSim; it uses the sim's ``state``, ``lock``, ``tasks``, ``timings``,
    ``downloads`` and ``_node``."""

    state: Any
    downloads: dict[str, dict]
    internet: Any
    timings: dict[str, Any]

    def _storage(self, node: str, storeid: str) -> dict:
        for s in self._node(node)["storages"]:
            if s["name"] == storeid:
                return s
        raise ApiError(500, f"storage '{storeid}' does not exist")

    def _volumes(self, node: str, storeid: str) -> list[dict]:
        """The volumes on one node's storage: the lab's storages are local to their node (none is shared),
        so `local` of one node is not `local` of another."""
        return self.state.data["volumes"].setdefault(f"{node}/{storeid}", [])

    def _set_volumes(self, node: str, storeid: str, volumes: list[dict]) -> None:
        self.state.data["volumes"][f"{node}/{storeid}"] = volumes

    def _node_storages(self, node: str) -> list[str]:
        """The storage ids of a node that hold volumes in the state."""
        prefix = f"{node}/"
        return [k[len(prefix) :] for k in self.state.data["volumes"] if k.startswith(prefix)]

    def _find_volume(self, node: str, volid: str) -> dict | None:
        storeid = volid.split(":", 1)[0]
        return next((v for v in self._volumes(node, storeid) if v["volid"] == volid), None)

    def _storage_used(self, node: str, storeid: str) -> int:
        return sum(v["size"] for v in self._volumes(node, storeid))

    # ------------------------------------------------------------------------------------ endpoints
    def _storage_entry(self, node: str, s: dict) -> dict:
        if s.get("disable"):
            # pve-storage Storage.pm storage_info: a disabled storage is listed, never activated or measured
            entry = {"total": 0, "used": 0, "avail": 0, "active": 0, "enabled": 0}
            return {
                "storage": s["name"],
                "type": s["type"],
                "content": ",".join(s["content"]),
                "shared": 0,
                **entry,
            }
        used = self._storage_used(node, s["name"])
        total = int(s["total"])
        return {
            "storage": s["name"],
            "type": s["type"],
            "content": ",".join(s["content"]),
            "active": 1,
            "enabled": 1,
            "shared": 0,
            "total": total,
            "used": used,
            "avail": total - used,
            "used_fraction": used / total if total else 0,
        }

    def _check_enabled(self, storeid: str, s: dict) -> None:
        """pve-storage Storage.pm storage_check_enabled: a disabled storage is refused."""
        if s.get("disable"):
            raise ApiError(500, f"storage '{storeid}' is disabled")

    def h_get_nodes_node_storage(self, args, who):
        out = []
        for s in self._node(args["node"])["storages"]:
            if not who.has(f"/storage/{s['name']}", ["Datastore.Audit", "Datastore.AllocateSpace"], True):
                continue
            if "storage" in args and s["name"] != args["storage"]:
                continue
            # with a content filter, storage_info leaves out disabled storages; `enabled` does too
            if s.get("disable") and ("content" in args or args.get("enabled")):
                continue
            if "content" in args and not set(re.split(r"[,;\s]+", args["content"])) & set(s["content"]):
                continue
            out.append(self._storage_entry(args["node"], s))
        return out

    def h_get_nodes_node_storage_storage_status(self, args, who):
        s = self._storage(args["node"], args["storage"])
        return self._storage_entry(args["node"], s)

    def h_get_nodes_node_storage_storage_content(self, args, who):
        self._storage(args["node"], args["storage"])
        out = []
        for v in self._volumes(args["node"], args["storage"]):
            if "content" in args and v["content"] != args["content"]:
                continue
            if "vmid" in args and v.get("vmid") != args["vmid"]:
                continue
            item = {k: v[k] for k in ("volid", "format", "size", "content", "ctime") if k in v}
            if v.get("vmid"):
                item["vmid"] = v["vmid"]
            out.append(item)
        return sorted(out, key=lambda i: i["volid"])

    def h_get_nodes_node_query_url_metadata(self, args, who):
        entry = self.internet.lookup(args["url"])
        if entry is None:
            host = re.sub(r"^https?://([^/:]+).*$", r"\1", args["url"])
            raise ApiError(
                500, f"invalid server response: '500 Can't connect to {host}:443 (Name or service not known)'"
            )
        mimetype = (
            "application/x-iso9660-image" if entry.get("format") == "iso" else "application/octet-stream"
        )
        return {"filename": args["url"].rsplit("/", 1)[-1], "mimetype": mimetype, "size": int(entry["size"])}

    def h_post_nodes_node_storage_storage_download_url(self, args, who):
        node, storeid, content = args["node"], args["storage"], args["content"]
        s = self._storage(node, storeid)
        self._check_enabled(storeid, s)
        if s["type"] not in ("dir", "nfs", "cifs", "cephfs", "btrfs"):
            raise ApiError(500, f"can't upload to storage type '{s['type']}', not a file based storage!")
        if content not in s["content"]:
            raise ApiError(500, f"storage '{storeid}' is not configured for content-type '{content}'")
        filename = _normalise_filename(args["filename"])
        ext_ok = {
            "iso": re.search(r"\.(iso|img)$", filename, re.I),
            "import": re.search(r"\.(ova|qcow2|raw|vmdk)$", filename),
            "vztmpl": re.search(r"\.tar\.(gz|xz|zst|bz2)$", filename),
        }[content]
        if not ext_ok:
            message = "wrong file extension" if content == "iso" else "invalid filename or wrong extension"
            raise ApiError(400, "Parameter verification failed.", {"filename": message})
        volid = f"{storeid}:{content}/{filename}"
        base = s.get("path", "/var/lib/vz")
        subdir = {"iso": "template/iso", "vztmpl": "template/cache", "import": "import"}[content]
        fs_path = f"{base}/{subdir}/{filename}"
        algo = args.get("checksum-algorithm")
        expect = args.get("checksum", "").lower() if algo else None
        url = args["url"]

        def body(task):
            # pve-common PVE::Tools::download_file_from_url: the lines of library/labsim/wget_log.py
            task.log(f"downloading {url} to {fs_path}")
            existing = self._find_volume(node, volid)
            if existing is not None:
                if expect is None:
                    raise TaskFailed(f"refusing to override existing file '{fs_path}'")
                got = (
                    existing["digests"].get(algo) or hashlib.new(algo, existing["volid"].encode()).hexdigest()
                )
                if got.lower() != expect:
                    task.log("calculating checksum of existing file...")
                    raise TaskFailed(f"checksum mismatch: got '{got}' != expect '{expect}', aborting")
                task.log(
                    "calculating checksum of existing file...OK, got correct file already, no need to download"
                )
                return
            entry = self.internet.lookup(url)
            host = re.sub(r"^https?://([^/:]+).*$", r"\1", url)
            if entry is None:
                time.sleep(min(0.2, float(self.timings["download_max_s"])))
                raise TaskFailed(
                    f"download failed: 500 Can't connect to {host}:443 (Name or service not known)"
                )
            size = int(entry["size"])
            free = int(s["total"]) - self._storage_used(node, storeid)
            if size > free:
                raise TaskFailed(
                    f"not enough space on storage '{storeid}' ({free} bytes free, {size} needed)"
                )
            duration = min(size / float(self.timings["download_rate"]), float(self.timings["download_max_s"]))
            step = max(0.05, float(self.timings["download_progress_s"]))
            rate = size / duration if duration > 0 else float(self.timings["download_rate"])
            tmp = f"{fs_path}.tmp_dwnl.{os.getpid()}"
            mimetype = (
                "application/x-iso9660-image" if entry.get("format") == "iso" else "application/octet-stream"
            )
            for line in wget_log.header(url, host, size, mimetype, tmp):
                task.log(line)
            started = time.monotonic()
            written = 0
            while True:
                elapsed = time.monotonic() - started
                frac = 1.0 if duration <= 0 else min(1.0, elapsed / duration)
                for index in range(written, wget_log.rows_done(size, frac)):
                    task.log(wget_log.row(index, size, rate))
                written = max(written, wget_log.rows_done(size, frac))
                if frac >= 1.0:
                    break
                time.sleep(min(step, max(0.0, duration - elapsed)))
            task.log(wget_log.last_row(size, rate, duration))
            for line in wget_log.footer(tmp, size, rate):
                task.log(line)
            digests = {
                a: download_digest(entry, a) for a in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")
            }
            if expect is not None:
                if digests[algo] != expect:
                    task.log("calculating checksum...")
                    raise TaskFailed(f"checksum mismatch: got '{digests[algo]}' != expect '{expect}'")
                task.log("calculating checksum...OK, checksum verified")
            task.log("download of '" + url + "' to '" + fs_path + "' finished")
            with self.lock:
                self._volumes(node, storeid).append(
                    {
                        "volid": volid,
                        "content": content,
                        "format": "iso" if content == "iso" else filename.rsplit(".", 1)[-1],
                        "size": size,
                        "virtual_size": int(entry.get("virtual_size", size)),
                        "ctime": int(time.time()),
                        "digests": digests,
                    }
                )
                self.state.mark()

        return self.tasks.start(node, "download", filename, who.userid, body)


def _normalise_filename(name: str) -> str:
    name = re.split(r"[/\\]", name)[-1]
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", name)
