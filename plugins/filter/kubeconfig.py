"""Filter of stage k3s: the admin kubeconfig on the controller, k3s' own merged into the user's file.

`k3s_yaml | gpulab.homelab.kubeconfig(name, server, existing)` is gpulab.k8s.kubeconfig's merge: the
user's kubeconfig text `existing` ('' or none: a new file) with k3s' cluster, admin user and context under
`name`, the cluster's URL `server` (the registration address); only the entries named `name` change. The
result holds credentials: the task that passes it sets no_log.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.k8s import kubeconfig
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    kubeconfig = MissingEngine(err)


def merged_kubeconfig(k3s_yaml, name, server, existing=None):
    try:
        return kubeconfig.merge(existing or "", k3s_yaml or "", str(name), str(server))
    except kubeconfig.KubeconfigError as exc:
        raise AnsibleFilterError(f"kubeconfig: {exc}") from None


class FilterModule:
    def filters(self):
        return {"kubeconfig": merged_kubeconfig}
