"""The k3s stand-in's reading of config.yaml, without root or processes: the token a server or agent is given
and the node labels set at each start of its k3s."""

import pytest

from labsim.net.k3s import cluster as k3s_cluster
from labsim.net.k3s import common


def test_token_file_wins_over_token_and_loses_its_whitespace(tmp_path, monkeypatch):
    monkeypatch.delenv("K3S_TOKEN", raising=False)
    monkeypatch.delenv("K3S_TOKEN_FILE", raising=False)
    path = tmp_path / "token"
    path.write_text("\n  from-the-file \n")
    assert common.config_token({"token": "inline", "token-file": str(path)}) == "from-the-file"
    assert common.config_token({"token": "inline"}) == "inline"
    assert common.config_token({}) == ""
    monkeypatch.setenv("K3S_TOKEN_FILE", str(path))
    assert common.config_token({"token": "inline"}) == "from-the-file"


def test_a_token_file_that_stays_missing_ends_k3s(tmp_path, monkeypatch):
    monkeypatch.delenv("K3S_TOKEN_FILE", raising=False)
    missing = tmp_path / "nope"
    with pytest.raises(SystemExit, match=f"token-file {missing}: timeout while trying to read the file"):
        common.config_token({"token-file": str(missing)}, wait_s=0)


def test_node_labels_are_set_again_at_each_start_only(tmp_path):
    cluster = k3s_cluster.Cluster(str(tmp_path / "state.json"))
    me = {"name": "vm-gpu", "address": "10.0.0.3", "labels": {"gpu": "on", "zone": "a"}, "start": "one"}
    cluster.register(me)
    labels = cluster.state["nodes"]["vm-gpu"]["labels"]
    del labels["gpu"]
    labels.update(zone="b", extra="x")
    cluster.register(me)  # a heartbeat of the same start
    assert labels == {"zone": "b", "extra": "x"}
    cluster.register(
        {**me, "labels": {"gpu": "on"}, "start": "two"}
    )  # restarted, zone taken out of config.yaml
    assert labels == {"gpu": "on", "zone": "b", "extra": "x"}
