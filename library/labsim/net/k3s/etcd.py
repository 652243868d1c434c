"""k3s' embedded etcd on the stand-in (class ``Etcd``), a server's join and the servers' manifests.

With ``cluster-init: true`` the server runs embedded etcd, a cluster of one member; a server whose
config.yaml names ``server`` (the registration address) and the token joins it as a member (class
``Etcd``: members, leader, term and revision, replicated data, quorum, leader election). Every server
answers the API; without a quorum (two of three servers down) the API answers ``etcdserver: request timed
out`` and kubectl fails. Server nodes carry ``node-role.kubernetes.io/etcd``. Each server's manifests
folder is applied, the first server's object winning where two place the same one (``etcd_addons``).
"""

import json
import os
import sys
import threading
import time

from . import tls
from .common import http_send

ETCD_META = "/var/lib/rancher/k3s/server/db/etcd/gpulab-member.json"
ETCD_TICK_S = 1
# etcd's election timeout (and its leader's CheckQuorum): a follower that has not heard its leader for this long
# starts an election; a leader that has not reached a quorum of members for this long steps down
ELECTION_S = 3
NO_QUORUM = "etcdserver: request timed out"


class Etcd:
    """k3s' embedded etcd, as far as the lab relies on it.

    A server started with ``cluster-init`` makes a one-member cluster; a server whose config.yaml names
    ``server`` (the registration address) and the cluster token joins through that address and is added as a
    member (``/gpulab/etcd/join``; a wrong token is 401 and a server without etcd refuses, as k3s does). The
    members' list and term live in ``ETCD_META``; every member keeps a copy of the data (``STATE``).

    One member leads: only it writes, every change is a new ``revision`` sent to the others
    (``/gpulab/etcd/append``, also every ``ETCD_TICK_S`` as raft's heartbeat). A follower answers the API by
    asking its leader; without a leader (no quorum: fewer than ``len(members) // 2 + 1`` members answer) the
    API answers ``etcdserver: request timed out`` and kubectl fails. A follower that has not heard its leader
    for ``ELECTION_S`` holds an election among the members that answer, if they are a quorum: the one with
    the newest revision (the first to have joined among equals) takes the next term, as raft elects a member
    whose log is up to date. A leader that reaches no quorum for ``ELECTION_S`` steps down (CheckQuorum).
    No partitions are modelled: a member either answers everyone or is down. Each round the leader also
    gives the nodes with the etcd role their ``EtcdIsVoter`` state (``mark_voters``), as k3s' member
    controller does on the leader. ``/gpulab/etcd/status`` shows a
    member's view (name, leader, term, revision, members), for the tests.

    ``send(peer, path, body)`` and ``clock`` are the network and the time, so the tests can step it.
    """

    def __init__(self, name, peer, cluster, send=http_send, clock=time.time, meta=ETCD_META):
        self.name, self.peer, self.cluster = name, peer, cluster
        self.send, self.clock, self.meta = send, clock, meta
        self.lock = threading.RLock()
        self.wake = threading.Event()
        try:
            with open(meta) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = {}
        self.members = saved.get("members", [])
        self.term = saved.get("term", 0)
        self.leader = None
        self.leader_seen = self.quorum_seen = 0.0

    def persist(self):
        os.makedirs(os.path.dirname(self.meta), exist_ok=True)
        with open(self.meta + ".tmp", "w") as f:
            json.dump({"name": self.name, "members": self.members, "term": self.term}, f)
        os.replace(self.meta + ".tmp", self.meta)

    def quorum(self):
        return len(self.members) // 2 + 1

    def revision(self):
        return self.cluster.state.get("revision", 0)

    def is_leader(self):
        return self.leader == self.name

    def peer_of(self, name):
        return next((m["peer"] for m in self.members if m["name"] == name), None)

    def leader_peer(self):
        """The leader's API when another member leads, else None."""
        return None if self.leader in (None, self.name) else self.peer_of(self.leader)

    def others(self):
        return [m for m in self.members if m["name"] != self.name]

    def status(self):
        # read without the lock: a member asked during its own round must still answer
        return {"name": self.name, "leader": self.leader, "term": self.term, "revision": self.revision(),
                "members": [m["name"] for m in self.members], "quorum": self.leader is not None}  # fmt: skip

    def initialize(self):
        """cluster-init on a server with no etcd data yet: a cluster of one member, which leads it."""
        with self.lock:
            self.members = [{"name": self.name, "peer": self.peer}]
            self.term, self.leader = 1, self.name
            self.quorum_seen = self.clock()
            self.persist()

    def add_member(self, name, peer):
        """The leader adds a joining server (again, with its new address, when it joins once more)."""
        with self.lock:
            self.members = [m for m in self.members if m["name"] != name] + [{"name": name, "peer": peer}]
            self.persist()
            self.wake.set()
            with self.cluster.lock:
                state = json.loads(json.dumps(self.cluster.state))
            return {"members": list(self.members), "term": self.term, "leader": self.leader, "state": state}

    def joined(self, reply):
        """This server's side of a join: the members, the leader and the data it answered with."""
        with self.lock:
            self.members, self.term, self.leader = reply["members"], reply["term"], reply["leader"]
            self.leader_seen = self.clock()
            self.cluster.replace(reply["state"])
            self.persist()

    def append(self, msg):
        """The leader's heartbeat with the data: followed unless this member knows a newer term."""
        with self.lock:
            if msg["term"] < self.term:
                return 409, {"error": "stale term", "term": self.term}
            changed = (msg["term"], msg["members"]) != (self.term, self.members)
            self.term, self.leader, self.members = msg["term"], msg["leader"], msg["members"]
            self.leader_seen = self.clock()
            if changed:
                self.persist()
        if msg["state"].get("revision", 0) != self.revision():
            self.cluster.replace(msg["state"])
        return 200, {"ok": True}

    def tick(self):
        """One round: the leader sends the data and checks its quorum; a follower without a leader elects one.
        No lock is held while another member is asked (it may be asking this one at the same time)."""
        now = self.clock()
        with self.lock:
            term, others = self.term, self.others()
            leading = self.is_leader()
            if not leading and self.leader is not None and now - self.leader_seen < ELECTION_S:
                return
        if leading:
            self.lead(now, term, others)
        else:
            self.elect(now, term, others)

    def lead(self, now, term, others):
        with self.cluster.lock:
            state = json.loads(json.dumps(self.cluster.state))
        msg = {"term": term, "leader": self.name, "members": self.members, "state": state}
        acks, newer, answered = 1, False, {self.name}
        for m in others:
            try:
                code, body = self.send(m["peer"], "/gpulab/etcd/append", msg)
            except OSError:
                continue
            acks += code == 200
            if code == 200:
                answered.add(m["name"])
            newer = newer or body.get("term", 0) > term
        with self.lock:
            if self.term != term or not self.is_leader():
                return
            if newer:
                self.leader = None  # another member leads a newer term
                return
            if acks >= self.quorum():
                self.quorum_seen = now
            elif now - self.quorum_seen >= ELECTION_S:
                self.leader = None  # CheckQuorum: no quorum answers, so this member leads no more
                return
            members = [m["name"] for m in self.members]
        self.mark_voters(members, answered)

    def mark_voters(self, members, answered):
        """The leader's member controller: each node with the etcd role gets its EtcdIsVoter state (a voter
        that answered this round, an unhealthy member that did not, or not a member). Written (a new
        revision) only when one changes. The stand-in's members are never learners."""
        with self.cluster.lock:
            changed = False
            for name, node in (self.cluster.state.get("nodes") or {}).items():
                if (node.get("labels") or {}).get("node-role.kubernetes.io/etcd") != "true":
                    continue
                status = "unjoined" if name not in members else "voter" if name in answered else "unhealthy"
                if node.get("etcd_status") != status:
                    node["etcd_status"], changed = status, True
            if changed:
                self.cluster.save()

    def elect(self, now, term, others):
        with self.lock:
            self.leader = None
        views = [self.status()]
        for m in others:
            try:
                code, body = self.send(m["peer"], "/gpulab/etcd/status")
            except OSError:
                continue
            if code == 200 and body.get("name") == m["name"]:
                views.append(body)
        with self.lock:
            if self.leader is not None or self.term != term or len(views) < self.quorum():
                return  # a leader was heard meanwhile, or no quorum: no leader, the API does not answer
            leading = [v for v in views if v["leader"] == v["name"] and v["term"] >= term]
            if leading:
                best = max(leading, key=lambda v: v["term"])
                self.leader, self.term, self.leader_seen = best["name"], best["term"], now
                return
            order = {m["name"]: i for i, m in enumerate(self.members)}
            best = max(views, key=lambda v: (v["revision"], -order.get(v["name"], len(order))))
            if best["name"] == self.name:
                self.term = max(v["term"] for v in views) + 1
                self.leader, self.quorum_seen = self.name, now
                self.persist()
                self.wake.set()

    def run(self):
        while True:
            self.tick()
            self.wake.wait(ETCD_TICK_S)
            self.wake.clear()


def join_cluster(etcd, url, token, name):
    """A server that names `server`: join etcd through that address with the token (again until it answers,
    as systemd restarts k3s after a failed join); the cluster's token from then on."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    while True:
        try:
            code, body = http_send(f"http://{host}", "/gpulab/etcd/join",
                                   {"token": token, "name": name, "peer": etcd.peer}, timeout=10)  # fmt: skip
        except OSError as exc:
            code, body = 0, {"error": f"failed to contact server {host}: {exc}"}
        if code == 200:
            etcd.joined(body)
            tls.adopt_cas(body.get("cas"))  # the cluster's CAs: this server's certificates are signed by them
            return body["token"]
        if code == 401:
            body = {"error": f"failed to get CA certs: https://{host}/cacerts: 401 Unauthorized"}
        print(f'level=error msg="starting kubernetes: preparing server: failed to join the cluster through {host}: '
              f'{body.get("error")}"', file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(2)


def etcd_addons(state, members):
    """Every server's manifests, in the order the servers joined; an object two servers place is the first's."""
    docs, seen = [], set()
    for m in members:
        for d in (state.get("addons") or {}).get(m["name"], []):
            meta = d.get("metadata") or {}
            key = (d.get("kind"), meta.get("namespace"), meta.get("name"))
            if key not in seen:
                seen.add(key)
                docs.append(d)
    return docs
