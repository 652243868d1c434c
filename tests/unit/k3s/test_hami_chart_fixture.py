"""The k3s stand-in's HAMi chart fixture (library/labsim/net/k3s/data/hami-chart.json, loaded by
labsim.net.k3s.hami_chart, made by scripts/render_hami_chart.py from HAMi's own chart): its provenance, that it was
rendered with the values role hami renders today, and that the k3s binary carries it."""

import importlib.util
import pathlib
import subprocess
import sys

import pytest
import yaml

from gpulab import hami
from labsim.net.k3s import build_zipapp, hami_chart

ROOT = pathlib.Path(__file__).resolve().parents[3]
RERUN = "re-render it: scripts/render_hami_chart.py (see its docstring)"


def role_defaults():
    return yaml.safe_load((ROOT / "roles" / "hami" / "defaults" / "main.yml").read_text())


@pytest.mark.parametrize("version", ["2.10.0", "2.9.0"])
def test_the_fixture_says_what_rendered_it_from_which_chart(version):
    chart = hami_chart.CHARTS[version]
    assert chart["chart"] == "hami" and chart["version"] == version
    assert f"Project-HAMi/HAMi at tag v{version} (commit " in chart["source"]
    assert chart["renderer"].startswith("helm-python-sdk 0.2.2 (") and "Helm SDK v4." in chart["renderer"]
    assert chart["values_sha256"] == hami.values_digest(chart["values"])
    kinds = {doc["kind"] for docs in chart["manifests"].values() for doc in docs}
    assert {"MutatingWebhookConfiguration", "Service", "Deployment", "DaemonSet", "ConfigMap"} <= kinds


@pytest.mark.parametrize("version", sorted(hami_chart.CHARTS))
def test_the_fixture_was_rendered_with_role_hamis_values_of_today(version):
    defaults = role_defaults()
    chart = hami_chart.CHARTS[version]
    want = hami.role_values(defaults)
    assert chart["values_sha256"] == hami.values_digest(want), (
        f"role hami's values changed since the chart fixture {version} was rendered ({chart['values']} then, "
        f"{want} now): {RERUN}"
    )
    assert (chart["release"], chart["namespace"]) == (
        defaults["hami_release_name"],
        defaults["hami_namespace"],
    )
    demo = yaml.safe_load((ROOT / "inventory" / "demo" / "group_vars" / "all" / "main.yml").read_text())
    assert chart["kube_version"] == demo["k3s_version"], f"the demo's k3s version changed: {RERUN}"


def test_role_values_pass_the_same_variables_as_the_role_does():
    # tasks/chart.yml hands module hami_values these arguments: role_values must map every one of them
    (task, *_rest) = yaml.safe_load((ROOT / "roles" / "hami" / "tasks" / "chart.yml").read_text())
    args = task["gpulab.homelab.hami_values"]
    passed = {k: v.strip("{} ") for k, v in args.items() if k in hami.ROLE_VALUE_ARGS}
    assert passed == hami.ROLE_VALUE_ARGS
    assert set(args) - set(hami.ROLE_VALUE_ARGS) == {"chart_version", "repo", "name", "namespace"}


def test_the_fixture_file_is_what_the_script_writes():
    # the committed file is the script's own output for these renderings: its provenance block (per chart the
    # source, renderer, Kubernetes version and values digest) agrees with the renderings, nothing edited by hand
    spec = importlib.util.spec_from_file_location(
        "render_hami_chart", ROOT / "scripts" / "render_hami_chart.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fixture = ROOT / "library" / "labsim" / "net" / "k3s" / hami_chart.FIXTURE
    assert fixture == script.OUTPUT  # the script writes the file the stand-in loads
    assert fixture.read_text() == script.fixture_text(hami_chart.CHARTS), RERUN


def test_the_k3s_binary_carries_the_chart_fixture(tmp_path):
    # the lab's hosts run the stand-in as one zipapp: the chart data travels in it and loads from it
    binary = build_zipapp(tmp_path / "k3s")
    load = f"import sys; sys.path.insert(0, {str(binary)!r}); from k3s import hami_chart; print(sorted(hami_chart.CHARTS))"
    out = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{sorted(hami_chart.CHARTS)}\n", "")
