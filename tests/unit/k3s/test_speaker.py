"""The k3s server that speaks for the cluster (gpulab.k8s.speaker): any server that is up and Ready, in
inventory order, never one the run's --limit leaves out and never none while one answers."""

import json

import plugin_files
import pytest

from gpulab.k8s.speaker import choose, ready_nodes

SERVERS = ["server-1", "server-2", "server-3"]


def nodes(*ready, not_ready=()):
    def item(name, status):
        return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": status}]}}

    return {"items": [item(n, "True") for n in ready] + [item(n, "Unknown") for n in not_ready]}


def test_ready_nodes_reads_the_ready_condition():
    assert ready_nodes(nodes("server-1", "agent-1", not_ready=["server-2"])) == {"server-1", "agent-1"}
    assert ready_nodes(None) == set() and ready_nodes({"items": [{"metadata": {"name": "x"}}]}) == set()


@pytest.mark.parametrize(
    ("servers", "reachable", "look", "speaker", "down"),
    [
        # every server up and Ready: the first
        (SERVERS, SERVERS, nodes(*SERVERS), "server-1", []),
        # server-1's VM stopped: its node is still listed, NotReady; the next Ready server speaks
        (
            SERVERS,
            ["server-2", "server-3"],
            nodes("server-2", "server-3", not_ready=["server-1"]),
            "server-2",
            ["server-1"],
        ),
        # up but NotReady (its k3s restarting): a Ready one is preferred over inventory order
        (SERVERS, SERVERS, nodes("server-3", not_ready=["server-1", "server-2"]), "server-3", []),
        # --limit '!server-1': server-1 is not the run's to use, even though it is the first and Ready
        (["server-2", "server-3"], ["server-2", "server-3"], nodes(*SERVERS), "server-2", []),
        # no cluster yet (k3s absent): the first server that is up starts it
        (SERVERS, SERVERS, None, "server-1", []),
        # a cluster whose servers are all NotReady: the first that is up still speaks
        (["server-1"], ["server-1"], nodes(not_ready=["server-1"]), "server-1", []),
    ],
)
def test_the_first_server_that_is_up_and_ready_speaks(servers, reachable, look, speaker, down):
    pick = choose(servers, reachable, look)
    assert (pick["speaker"], pick["down"]) == (speaker, down)
    assert pick["speaker"] in servers


def test_the_pick_says_why_and_names_the_servers_that_are_down():
    pick = choose(SERVERS, ["server-3"], nodes("server-3", not_ready=["server-1", "server-2"]))
    assert pick == {
        "speaker": "server-3",
        "down": ["server-1", "server-2"],
        "ready": ["server-3"],
        "why": "the first k3s server that is up and Ready (server-1, server-2 down)",
    }


def test_no_server_answers_means_no_speaker_and_says_which_were_tried():
    pick = choose(SERVERS, [], None)
    assert pick["speaker"] is None and pick["down"] == SERVERS
    assert pick["why"] == "no k3s server answers: tried server-1, server-2, server-3"
    assert "--limit leaves out every k3s server" in choose([], [], None)["why"]


def test_the_filter_reads_kubectls_text():
    filters = plugin_files.filters("k3s")
    speaker = filters["k3s_speaker"]
    assert speaker(SERVERS, ["server-2"], json.dumps(nodes("server-2")))["speaker"] == "server-2"
    # an error text instead of a node list (k3s not answering): no cluster to ask
    assert speaker(SERVERS, ["server-2"], "The connection to the server was refused")["speaker"] == "server-2"
    assert speaker(SERVERS, ["server-2"], "")["why"].startswith("no cluster to ask yet")
    ready = filters["k3s_ready_nodes"]
    assert ready(json.dumps(nodes("server-2", "agent-1", not_ready=["server-1"]))) == ["agent-1", "server-2"]
    assert ready("etcdserver: request timed out") == [] and ready("") == []


def test_ready_versions_are_the_kubelets_of_the_ready_nodes_only():
    """What an upgrade waits for: each Ready node's kubelet version; a node not Ready is not there yet."""
    look = nodes("server-1", "server-2", not_ready=["server-3"])
    for item, version in zip(look["items"], ["v1.36.2+k3s1", "v1.35.6+k3s1", "v1.36.2+k3s1"], strict=True):
        item["status"]["nodeInfo"] = {"kubeletVersion": version}
    versions = plugin_files.filters("k3s")["k3s_ready_versions"]
    assert versions(json.dumps(look)) == {"server-1": "v1.36.2+k3s1", "server-2": "v1.35.6+k3s1"}
    assert versions("The connection to the server was refused") == {} and versions("") == {}
