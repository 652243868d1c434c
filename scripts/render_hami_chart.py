#!/usr/bin/env python3
"""Render HAMi's Helm chart with gpulab's own values into the k3s stand-in's chart fixture.

k3s' helm-controller renders the HelmChart that role hami places (``valuesContent`` from the role's
defaults, see ``roles/hami/tasks/chart.yml``) with Helm; the lab's k3s stand-in takes the webhook, the
scheduler's Service and Deployment and the device plugin's DaemonSet from that same rendering instead of
writing them by hand. This script makes it: it loads ``charts/hami`` of a HAMi checkout at a chart's tag,
renders it with Helm's own template engine through ``helm-python-sdk`` (Helm v4's Go SDK in a C library,
no helm binary, no cluster), and writes every rendered manifest, the values, their SHA-256 and the
provenance to ``library/labsim/net/k3s/data/hami-chart.json`` (data of the k3s package, which
``labsim.net.k3s.hami_chart`` loads and the stand-in's zipapp carries). The test
``tests/unit/k3s/test_hami_chart_fixture.py`` fails when role hami's values no longer match the values recorded there;
run this script again then.

``helm-python-sdk`` (a 75 MB wheel) is needed by this script only, not by gpulab: install it anywhere, for
example ``python3 -m venv /tmp/helm && /tmp/helm/bin/pip install helm-python-sdk==0.2.2 pyyaml``, and run

    git -C HAMI archive v2.10.0 charts/hami | tar -x -C /tmp/hami-2.10.0     # HAMI: a clone of Project-HAMi/HAMi
    git -C HAMI archive v2.9.0 charts/hami | tar -x -C /tmp/hami-2.9.0
    /tmp/helm/bin/python scripts/render_hami_chart.py /tmp/hami-2.10.0/charts/hami /tmp/hami-2.9.0/charts/hami \
        --tag v2.10.0 --commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e \
        --tag v2.9.0 --commit 3a006c6ae2f077a2683df7805c43656c07f6dc15

Several charts go into one file: one ``--tag`` and one ``--commit`` per chart folder, in the same order.
The Kubernetes version the chart sees (``.Capabilities.KubeVersion``, which picks the scheduler config's API
and the kube-scheduler tag) is the demo inventory's ``k3s_version``. The output is deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "library"))

from gpulab import hami  # noqa: E402

OUTPUT = ROOT / "library" / "labsim" / "net" / "k3s" / "data" / "hami-chart.json"
ROLE_DEFAULTS = ROOT / "roles" / "hami" / "defaults" / "main.yml"
DEMO_VARS = ROOT / "inventory" / "demo" / "group_vars" / "all" / "main.yml"


def render_chart(chart_dir, values, *, release, namespace, kube_version):
    """Every manifest of the chart rendered as an install: {template path: [documents]} (empty ones left out)."""
    import helm_python

    with helm_python.Chart.load(str(chart_dir)) as chart:
        # Chart.render of helm-python-sdk 0.2.2 takes no Kubernetes version, but the library's render options
        # do (`kube_version`, as `helm template --kube-version`); HAMi's chart reads it for the scheduler.
        from helm_python import _native

        opts = {"name": release, "namespace": namespace, "is_install": True, "kube_version": kube_version}
        rendered = json.loads(
            _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
        )
        name, version = chart.name, chart.version
    manifests = {}
    for path in sorted(rendered):
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        docs = [d for d in yaml.safe_load_all(rendered[path]) if d]
        if docs:
            manifests[path] = docs
    return name, version, manifests


def fixture_text(charts):
    """The chart fixture's text: its provenance first (what made it, and per chart its source, renderer, Kubernetes
    version and values digest), then the renderings by chart version. Deterministic (keys sorted)."""
    keys = ("source", "renderer", "kube_version", "values_sha256")
    provenance = {
        "generator": "scripts/render_hami_chart.py (its docstring says how to run it); do not edit, render again",
        "what": "HAMi's chart rendered with role hami's default values, for the k3s stand-in "
        "(labsim.net.k3s.hami_chart loads it); `charts` maps a chart version to its rendering: chart, version, "
        "source, renderer, the Kubernetes version the chart saw, release, namespace, the values and their SHA-256, "
        "and every manifest by template path (a list of documents)",
        "charts": {version: {k: chart[k] for k in keys} for version, chart in charts.items()},
    }
    return json.dumps({"_provenance": provenance, "charts": charts}, indent=1, sort_keys=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chart", nargs="+", type=Path, help="charts/hami of a HAMi checkout at the tag")
    parser.add_argument("--tag", action="append", required=True, help="the chart's Git tag (one per chart)")
    parser.add_argument("--commit", action="append", required=True, help="the tag's commit (one per chart)")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if not len(args.chart) == len(args.tag) == len(args.commit):
        parser.error("give one --tag and one --commit per chart")
    import helm_python

    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    kube_version = yaml.safe_load(DEMO_VARS.read_text())["k3s_version"]
    values = hami.role_values(defaults)
    charts = {}
    for chart_dir, tag, commit in zip(args.chart, args.tag, args.commit, strict=True):
        name, version, manifests = render_chart(
            chart_dir,
            values,
            release=defaults["hami_release_name"],
            namespace=defaults["hami_namespace"],
            kube_version=kube_version,
        )
        charts[version] = {
            "chart": name,
            "version": version,
            "source": f"charts/{name} of Project-HAMi/HAMi at tag {tag} (commit {commit}), Apache-2.0",
            "renderer": f"helm-python-sdk {helm_python.__version__} (helm-c {helm_python.helm_c_version()}, "
            f"Helm SDK {helm_python.helm_sdk_version()})",
            "release": defaults["hami_release_name"],
            "namespace": defaults["hami_namespace"],
            "kube_version": kube_version,
            "values": values,
            "values_sha256": hami.values_digest(values),
            "manifests": manifests,
        }
    args.output.write_text(fixture_text(charts))
    print(f"wrote {args.output} ({', '.join(charts)}; values {hami.values_digest(values)[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
