"""Filter of stage workloads' opt-in front end, Open WebUI (roles/workloads/tasks/open_webui.yml).

`engines | open_webui_chart(...)` takes the planned engines (module hami_workloads' `engines`) and the role's
settings, and returns gpulab.k8s.open_webui.render's result: the chart values (the LAN engines as its OpenAI
connections) checked against the pinned chart version's keys, the HelmChart manifest, and its address and URL.
A refused value fails the task with every problem named. `health | open_webui_silent_text(url, timeout, port)` says
what the controller's GET URL/health (an ansible.builtin.uri result) got instead of Open WebUI's answer.
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.k8s import open_webui
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    open_webui = MissingEngine(err)


def open_webui_chart(
    engines: Any,
    version: str,
    repo: str,
    namespace: str,
    lan_port: Any,
    lan_address: Any = "",
    server: str = "",
    storage_size: str = "2Gi",
    extra_values: Any = None,
) -> dict:
    plain = json.loads(json.dumps({"engines": engines or [], "extra": extra_values or {}}))
    try:
        return open_webui.render(
            engines=plain["engines"], version=str(version), repo=str(repo), namespace=str(namespace),
            lan_port=int(lan_port) if str(lan_port).isdigit() else lan_port, lan_address_value=lan_address,
            server=str(server or ""), storage_size=str(storage_size), extra_values=plain["extra"],
        )  # fmt: skip
    except open_webui.OpenWebUIError as err:
        raise AnsibleFilterError(str(err)) from None


def open_webui_silent_text(health: Any, url: str, timeout: Any, port: Any) -> str:
    health = health or {}
    status = int(health.get("status", -1) or -1)
    if status < 0:
        answered = f"nothing ({health.get('msg') or 'no reply'})"
    else:
        body = str(health.get("content") or "")
        answered = f"HTTP {status}: {body[:200]}{'...' if len(body) > 200 else ''}"
    return (
        f'Open WebUI is Ready but {url}/health did not answer as Open WebUI (200 with {{"status": true}}) from '
        f"the controller within {timeout} s: it answered {answered}. Check that the address is reachable from here "
        f"and that nothing else holds port {port} there (k3s' ServiceLB, or kube-vip for "
        "workloads_open_webui_lan_address)."
    )


class FilterModule:
    def filters(self):
        return {"open_webui_chart": open_webui_chart, "open_webui_silent_text": open_webui_silent_text}
