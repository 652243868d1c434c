"""The k3s stand-in's embedded etcd members on a fake network and clock, stepped by hand (no root, no processes):
shared by the etcd tests (test_k3s_etcd.py) and the upstream record's etcd rows (test_upstream_k3s.py)."""

import copy

from labsim.net.k3s import cluster as k3s_cluster
from labsim.net.k3s import etcd as k3s_etcd


class Net:
    """Members by peer address; a member that is down does not answer (OSError), as a stopped server."""

    def __init__(self, tmp_path):
        self.tmp, self.now, self.members, self.down = tmp_path, 1000.0, {}, set()

    def clock(self):
        return self.now

    def send(self, peer, path, body=None):
        name = peer.removeprefix("http://")
        if name in self.down or name not in self.members:
            raise OSError(f"connection refused: {peer}")
        etcd = self.members[name]
        if path == "/gpulab/etcd/status":
            return 200, copy.deepcopy(etcd.status())
        if path == "/gpulab/etcd/append":
            return etcd.append(copy.deepcopy(body))
        raise AssertionError(path)

    def server(self, name):
        cluster = k3s_cluster.Cluster(str(self.tmp / name / "state.json"))
        etcd = k3s_etcd.Etcd(
            name, f"http://{name}", cluster, self.send, self.clock, str(self.tmp / name / "etcd.json")
        )
        cluster.etcd = etcd
        self.members[name] = etcd
        return etcd

    def join(self, leader, name):
        etcd = self.server(name)
        etcd.joined(leader.add_member(name, etcd.peer))
        return etcd

    def rounds(self, n=1, seconds=k3s_etcd.ETCD_TICK_S):
        """n rounds of every member that is up, `seconds` apart."""
        for _ in range(n):
            self.now += seconds
            for name, etcd in self.members.items():
                if name not in self.down:
                    etcd.tick()

    def write(self, etcd, key, value):
        """A change made on the leader (the API writes only there)."""
        assert etcd.is_leader()
        with etcd.cluster.lock:
            etcd.cluster.state[key] = value
            etcd.cluster.save()

    def leaders(self):
        return {n: e.leader for n, e in self.members.items() if n not in self.down}


def three_members(tmp_path):
    """A Net of vm-1 (--cluster-init) and vm-2, vm-3 joined, after one round: vm-1 leads."""
    net = Net(tmp_path)
    first = net.server("vm-1")
    first.initialize()
    net.join(first, "vm-2")
    net.join(first, "vm-3")
    net.rounds()
    return net
