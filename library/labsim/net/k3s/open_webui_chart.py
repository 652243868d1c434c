"""The open-webui chart of stage workloads' front end on the k3s stand-in, as k3s' helm controller leaves it
installed; the behaviour and its test are listed in library/labsim/UPSTREAM.md (## Open WebUI chart).

open-webui chart 16.0.0 (github.com/open-webui/helm-charts, tag open-webui-16.0.0): the install job completes; the
chart's workload is named by its fullname (templates/_helpers.tpl ``open-webui.fullname``: the release name when it
contains ``open-webui``, else ``<release>-open-webui``) and is a StatefulSet when ``persistence.enabled`` (on by
default) with ``persistence.provider`` ``local`` (the default), else a Deployment, unless ``workload.kind`` names
one (templates/workload-manager.yaml). The stand-in runs no image: the workload is Ready at once, so ``k3s kubectl
rollout status statefulset/<fullname>`` answers; the page itself is not served in the lab.
"""

CHART = "open-webui"


def fullname(release):
    return release if CHART in release else f"{release}-{CHART}"


def workload_kind(values):
    """StatefulSet or Deployment, as templates/workload-manager.yaml chooses from the values."""
    kind = ((values.get("workload") or {}).get("kind")) or ""
    if kind:
        return kind
    persistence = values.get("persistence") or {}
    local = persistence.get("enabled", True) and (persistence.get("provider") or "local") == "local"
    return "StatefulSet" if local else "Deployment"


def install_chart(name, target, spec):
    """({namespace/fullname: rollout}, {namespace/fullname: object}) of an open-webui HelmChart."""
    import yaml

    values = yaml.safe_load(spec.get("valuesContent") or "") or {}
    full = fullname(name)
    obj = {
        "apiVersion": "apps/v1",
        "kind": workload_kind(values),
        "metadata": {"name": full, "namespace": target, "labels": {"app.kubernetes.io/instance": name}},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "readyReplicas": 1},
    }
    key = f"{target}/{full}"
    return {key: {"ready": True}}, {key: obj}
