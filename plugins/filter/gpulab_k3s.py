"""Filters of the k3s stages.

`servers | gpulab_k3s_speaker(reachable, nodes_json)` is gpulab.k8s.speaker.choose: the k3s server that
speaks for the cluster in this run (up and Ready, not the first server), the servers that are down and why.
`nodes_json` is the text of `kubectl get nodes -o json` read through a server that answered, or empty when
it was not read (k3s absent, nothing answered). `nodes_json | gpulab_k3s_ready_nodes` is the sorted list of
the nodes whose Ready condition is True ([] for an empty or non-JSON text).
"""

from __future__ import annotations

import json

from gpulab.k8s.speaker import choose, ready_nodes


def gpulab_k3s_speaker(servers, reachable, nodes_json=""):
    try:
        nodes = json.loads(nodes_json) if nodes_json else None
    except ValueError:  # a server that answered with an error, not a node list: no cluster to ask
        nodes = None
    return choose(list(servers or []), list(reachable or []), nodes)


def gpulab_k3s_ready_nodes(nodes_json):
    try:
        nodes = json.loads(nodes_json) if nodes_json else None
    except ValueError:
        nodes = None
    return sorted(ready_nodes(nodes))


class FilterModule:
    def filters(self):
        return {"gpulab_k3s_speaker": gpulab_k3s_speaker, "gpulab_k3s_ready_nodes": gpulab_k3s_ready_nodes}
