"""The PVE API simulator's nodes room: ``/version``, ``/nodes``, a node's status and PCI devices
(``hardware/pci``), and the cluster's view (``/cluster/resources``, ``/cluster/status``, ``/cluster/nextid``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from labsim.fixture import node_address
from labsim.pve_common import ApiError, GiB, vm_memory_mib


class NodeHandlers:
    """The nodes, their hardware and the cluster lists.

    Mixed into labsim.pve_api.PveApiSim; it uses the sim's ``nodes``, ``state``, ``fixture`` and ``_node``,
    the storage room's ``_storage_used`` and the qemu room's ``_vm_summary``."""

    nodes: dict[str, dict]
    state: Any
    fixture: dict[str, Any]

    def h_get_version(self, args, who):
        pve = self.fixture["pve"]
        return {"version": str(pve["version"]), "release": str(pve["release"]), "repoid": str(pve["repoid"])}

    def _node_mem(self, node: str) -> dict[str, int]:
        n = self._node(node)
        total = int(n["memory"]["total"])
        used = int(n["memory"].get("host_used", 0))
        for vm in self.state.data["vms"].values():
            if vm["node"] == node and vm["status"] == "running":
                used += vm_memory_mib(vm["config"]) * 2**20
        used = min(used, total)
        return {"total": total, "used": used, "free": total - used, "available": total - used}

    def h_get_nodes(self, args, who):
        out = []
        for name, n in self.nodes.items():
            mem = self._node_mem(name)
            out.append(
                {
                    "node": name,
                    "status": "online",
                    "cpu": 0.02,
                    "maxcpu": int(n["cpu"].get("threads", n["cpu"].get("cores", 1))),
                    "mem": mem["used"],
                    "maxmem": mem["total"],
                    "uptime": int(time.time() - self.state.data.setdefault("boot_time", int(time.time()))),
                    "level": "",
                    "ssl_fingerprint": self.fixture.get("_fingerprint", ""),
                    "id": f"node/{name}",
                    "type": "node",
                }
            )
        return out

    def h_get_nodes_node_status(self, args, who):
        n = self._node(args["node"])
        cpu = n["cpu"]
        boot = {"mode": n["boot"].get("mode", "efi")}
        if boot["mode"] == "efi":
            boot["secureboot"] = int(n["boot"].get("secureboot", 0))
        root_total = int(n.get("rootfs_total", 100 * GiB))
        return {
            "memory": self._node_mem(args["node"]),
            "cpu": 0.02,
            "cpuinfo": {
                "model": cpu.get("model", ""),
                "sockets": int(cpu.get("sockets", 1)),
                "cores": int(cpu.get("cores", 1)),
                "cpus": int(cpu.get("threads", cpu.get("cores", 1))),
            },
            "loadavg": ["0.12", "0.10", "0.08"],
            "rootfs": {
                "total": root_total,
                "used": 3 * GiB,
                "free": root_total - 3 * GiB,
                "avail": root_total - 3 * GiB,
            },
            "boot-info": boot,
            "current-kernel": {
                "sysname": "Linux",
                "release": n.get("kernel", ""),
                "version": "#1 SMP PREEMPT_DYNAMIC PMX",
                "machine": "x86_64",
            },
            "kversion": f"Linux {n.get('kernel', '')} #1 SMP PREEMPT_DYNAMIC PMX",
            "pveversion": f"pve-manager/{self.fixture['pve']['version']}/{self.fixture['pve']['repoid']}",
            "uptime": int(time.time() - self.state.data.setdefault("boot_time", int(time.time()))),
        }

    # -------------------------------------------------------------------------------------- cluster
    def h_get_cluster_resources(self, args, who):
        kind = args.get("type")
        out = []
        if kind in (None, "node"):
            for n in self.h_get_nodes(args, who):
                out.append({**n, "id": f"node/{n['node']}", "type": "node", "disk": 0, "maxdisk": 0})
        if kind in (None, "storage"):
            for name, n in self.nodes.items():
                for s in n["storages"]:
                    if not who.has(
                        f"/storage/{s['name']}", ["Datastore.Audit", "Datastore.AllocateSpace"], True
                    ):
                        continue
                    out.append(
                        {
                            "id": f"storage/{name}/{s['name']}",
                            "type": "storage",
                            "storage": s["name"],
                            "node": name,
                            "status": "available",
                            "plugintype": s["type"],
                            "content": ",".join(s["content"]),
                            "shared": 0,
                            "disk": self._storage_used(name, s["name"]),
                            "maxdisk": int(s["total"]),
                        }
                    )
        if kind in (None, "vm"):
            for vmid, vm in sorted(self.state.data["vms"].items(), key=lambda kv: int(kv[0])):
                if not who.has(f"/vms/{vmid}", ["VM.Audit"]):
                    continue
                entry = {"id": f"qemu/{vmid}", "type": "qemu", **self._vm_summary(int(vmid), vm)}
                out.append(entry)
        return out

    def h_get_cluster_status(self, args, who):
        """pvecm's view: a lone node answers only its own entry; nodes joined in a cluster (a fixture with
        several nodes, or a ``cluster`` name) add the cluster's entry first. The listener answers as the
        first node (``local``)."""
        names = list(self.nodes)
        cluster = self.fixture.get("cluster") or {}
        clustered = len(names) > 1 or bool(cluster.get("name"))
        out = []
        if clustered:
            out.append(
                {
                    "type": "cluster",
                    "id": "cluster",
                    "name": str(cluster.get("name") or "lab"),
                    "nodes": len(names),
                    "quorate": 1,
                    "version": len(names),
                }
            )
        for i, name in enumerate(names):
            out.append(
                {
                    "type": "node",
                    "id": f"node/{name}",
                    "name": name,
                    "ip": node_address(self.fixture, name),
                    "local": int(i == 0),
                    "nodeid": i + 1 if clustered else 0,
                    "online": 1,
                    "level": "",
                }
            )
        return out

    def h_get_cluster_nextid(self, args, who):
        vms = self.state.data["vms"]
        if "vmid" in args:
            if str(args["vmid"]) in vms:
                raise ApiError(
                    400, "Parameter verification failed.", {"vmid": f"VM {args['vmid']} already exists"}
                )
            return args["vmid"]
        vmid = 100
        while str(vmid) in vms:
            vmid += 1
        return str(vmid)  # PVE's quirk: the next id comes back as a JSON string

    # --------------------------------------------------------------------------------- hardware/pci
    def h_get_nodes_node_hardware_pci(self, args, who):
        blacklist = args.get("pci-class-blacklist", "05;06;0b")
        prefixes = [p for p in re.split(r"[,;\s]+", blacklist) if p]
        verbose = args.get("verbose", 1)
        out = []
        for dev in sorted(self._node(args["node"])["pci"], key=lambda d: d["id"]):
            cls = str(dev["class"])
            if any(cls.lower().startswith("0x" + p.lower()) for p in prefixes):
                continue
            item = {k: dev[k] for k in ("id", "class", "vendor", "device", "iommugroup") if k in dev}
            if dev.get("mdev"):
                item["mdev"] = 1
            if verbose:
                for k in (
                    "vendor_name",
                    "device_name",
                    "subsystem_vendor",
                    "subsystem_device",
                    "subsystem_vendor_name",
                    "subsystem_device_name",
                ):
                    if k in dev:
                        item[k] = dev[k]
            out.append(item)
        return out

    def _pci_functions(self, node: str, path: str) -> list[dict]:
        """The fixture's devices matched by a hostpci/mapping path (``02:00`` = all functions)."""
        full = path if re.match(r"^[0-9a-f]{4,}:", path) else "0000:" + path
        devs = self._node(node)["pci"]
        if "." in full.split(":")[-1]:
            return [d for d in devs if d["id"] == full]
        return [d for d in devs if d["id"].rsplit(".", 1)[0] == full]
