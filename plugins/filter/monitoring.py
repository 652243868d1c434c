"""Filters of stage monitoring: the proof's problems, parsed in Python from the one look of each wait.

`look | monitoring_problems` takes the text that roles/monitoring/tasks/verify.yml prints (`{"targets":
<Prometheus /api/v1/targets>, "query": <its /api/v1/query of hami_gpu_memory_allocated_bytes>, "nodes": <kubectl
get nodes -o json>, "pods": <kubectl get pods -A -o json>}`) and returns gpulab.monitoring's problems (field,
value, cause, fix, wait); `problems | monitoring_problems_text` makes them one message.
`service_json | monitoring_webui_port` is the NodePort of HAMi-WebUI's `http` port (kubectl get service -o
json of roles/monitoring/tasks/verify_webui.yml), or None.
"""

from __future__ import annotations

from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import monitoring
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    monitoring = MissingEngine(err)


def monitoring_problems(look, jobs=None):
    return monitoring.problems(look or "", jobs)


def monitoring_problems_text(problems):
    return monitoring.problems_text(problems or [])


def monitoring_webui_port(service):
    return monitoring.webui_node_port(service or "")


class FilterModule:
    def filters(self):
        return {
            "monitoring_problems": monitoring_problems,
            "monitoring_problems_text": monitoring_problems_text,
            "monitoring_webui_port": monitoring_webui_port,
        }
