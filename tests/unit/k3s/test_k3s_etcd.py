"""The k3s stand-in's embedded etcd, stepped by hand (no root, no processes, a fake clock and network):
cluster-init makes one member, joins add members, the leader's data reaches the others, a stopped leader is
replaced by the member with the newest data, and two of three members down leave no leader (no quorum)."""

import pytest

from labsim.net.k3s import cluster as k3s_cluster
from labsim.net.k3s import etcd as k3s

from .etcd_net import Net, three_members


@pytest.fixture
def net(tmp_path):
    return Net(tmp_path)


@pytest.fixture
def three(tmp_path):
    return three_members(tmp_path)


def test_cluster_init_makes_one_member_and_each_join_adds_one(net, tmp_path):
    first = net.server("vm-1")
    first.initialize()
    assert first.status() == {"name": "vm-1", "leader": "vm-1", "term": 1, "revision": 0,
                              "members": ["vm-1"], "quorum": True}  # fmt: skip
    net.write(first, "nodes", {"vm-1": {"labels": {}}})
    second = net.join(first, "vm-2")
    # the joining server gets the data and the members with the answer, and follows the leader
    assert second.cluster.state["nodes"] == {"vm-1": {"labels": {}}}
    assert second.leader == "vm-1" and second.status()["members"] == ["vm-1", "vm-2"]
    net.join(first, "vm-3")
    net.rounds()
    assert net.leaders() == dict.fromkeys(["vm-1", "vm-2", "vm-3"], "vm-1")
    assert all(e.status()["members"] == ["vm-1", "vm-2", "vm-3"] for e in net.members.values())
    # a write on the leader is a new revision that every member holds after the next round
    net.write(first, "marker", "one")
    net.rounds()
    assert {e.cluster.state.get("marker") for e in net.members.values()} == {"one"}
    assert {e.revision() for e in net.members.values()} == {first.revision()}
    # members, term and data are on disk: a member started again knows its cluster
    again = k3s.Etcd(
        "vm-2", "http://vm-2", second.cluster, net.send, net.clock, str(tmp_path / "vm-2" / "etcd.json")
    )
    assert [m["name"] for m in again.members] == ["vm-1", "vm-2", "vm-3"] and again.term == 1
    assert k3s_cluster.Cluster(str(tmp_path / "vm-3" / "state.json")).state["marker"] == "one"


def test_a_stopped_leader_is_replaced_and_follows_when_it_returns(three):
    net = three
    net.down.add("vm-1")
    net.rounds()  # the followers have heard their leader lately: no election yet
    assert net.leaders() == {"vm-2": "vm-1", "vm-3": "vm-1"}
    net.rounds(k3s.ELECTION_S)
    # the member with the newest data, the first to have joined among equals, leads the next term
    assert net.leaders() == {"vm-2": "vm-2", "vm-3": "vm-2"}
    assert net.members["vm-2"].term == 2
    net.write(net.members["vm-2"], "marker", "after")
    net.rounds()
    assert net.members["vm-3"].cluster.state["marker"] == "after"
    net.down.clear()
    net.rounds(2)
    assert net.leaders() == dict.fromkeys(["vm-1", "vm-2", "vm-3"], "vm-2")
    assert net.members["vm-1"].cluster.state["marker"] == "after" and net.members["vm-1"].term == 2


def test_the_newest_data_wins_the_election(three):
    net = three
    net.write(net.members["vm-1"], "marker", "x")
    # vm-3 got the last write, vm-2 did not (it was away for that round)
    net.down.add("vm-2")
    net.rounds()
    net.down = {"vm-1"}
    net.rounds(k3s.ELECTION_S + 1)
    assert net.leaders() == {"vm-2": "vm-3", "vm-3": "vm-3"}


@pytest.mark.parametrize("survivor", ["vm-1", "vm-3"])
def test_two_of_three_down_leave_no_leader_until_one_returns(three, survivor):
    net = three
    net.down = {"vm-1", "vm-2", "vm-3"} - {survivor}
    net.rounds(k3s.ELECTION_S + 1)
    # the leader steps down when no quorum answers (CheckQuorum); a follower finds no quorum to elect one
    assert net.leaders() == {survivor: None}
    assert net.members[survivor].status()["quorum"] is False
    net.down.discard("vm-2")
    net.rounds(k3s.ELECTION_S + 1)
    leaders = net.leaders()
    assert (
        set(leaders) == {survivor, "vm-2"}
        and len(set(leaders.values())) == 1
        and None not in leaders.values()
    )


def test_a_stale_leader_is_told_of_the_newer_term(three):
    net = three
    old = net.members["vm-1"]
    net.down.add("vm-1")
    net.rounds(k3s.ELECTION_S + 1)
    assert net.members["vm-2"].is_leader()
    code, body = net.members["vm-3"].append({"term": old.term, "leader": "vm-1", "members": [], "state": {}})
    assert (code, body["term"]) == (409, 2)


def test_a_server_without_etcd_is_not_one_a_server_joins(tmp_path, monkeypatch):
    monkeypatch.setattr(k3s_cluster, "STATE", str(tmp_path / "state.json"))
    assert k3s_cluster.Cluster().etcd is None
    addons = {"vm-1": [{"kind": "HelmChart", "metadata": {"name": "hami", "namespace": "kube-system"}, "v": 1}],
              "vm-2": [{"kind": "HelmChart", "metadata": {"name": "hami", "namespace": "kube-system"}, "v": 2},
                       {"kind": "Deployment", "metadata": {"name": "e0", "namespace": "default"}}]}  # fmt: skip
    members = [{"name": "vm-1"}, {"name": "vm-2"}]
    docs = k3s.etcd_addons({"addons": addons}, members)
    assert [(d["kind"], d.get("v")) for d in docs] == [("HelmChart", 1), ("Deployment", None)]
