"""HAMi 2.9.0 beside 2.10.0: the key facts of both charts, a values key the pinned chart lacks refused in
preflight, one registry for every image, and the plan's list of where each image comes from."""

from types import SimpleNamespace

import pytest

from gpulab import hami
from gpulab.labdef import rules
from gpulab.labdef.hami_values import check_hami_values, image_lines


def lab(**globals_):
    return SimpleNamespace(
        globals={"hami_chart_version": "2.10.0", "k3s_version": "v1.33.5+k3s1", **globals_}, other_vars={}
    )


def test_known_versions_are_hamis_alone():
    """hami-webui-1.2.0-keys.json lies beside hami's own facts: its version is not a HAMi chart version."""
    assert hami.chart_versions("hami-webui") == ["1.2.0"]
    assert "webui-1.2.0" not in hami.known_versions()
    assert all(v[:1].isdigit() for v in hami.known_versions())
    # preflight's fix for an unknown hami_chart_version names the HAMi versions gpulab ships, and only those
    fix = rules.first_failure("hami_chart_version", "2.8.0").fix
    assert f"({', '.join(hami.known_versions())})" in fix and "webui" not in fix


def test_both_charts_are_known_with_their_provenance():
    assert {"2.9.0", "2.10.0"} <= set(hami.known_versions())
    old, new = hami.load_keys("2.9.0"), hami.load_keys("2.10.0")
    assert "tag v2.9.0 = commit 3a006c6ae2f077a2683df7805c43656c07f6dc15" in old["source"]
    assert "tag v2.10.0 = commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e" in new["source"]
    assert (old["global_image_tag"], new["global_image_tag"]) == ("v2.9.0", "v2.10.0")
    # 2.9.0 still has the DRA switch; 2.10.0 added the device plugin's hostPID
    assert "dra.enabled" in old["keys"] and "dra.enabled" not in new["keys"]
    assert "devicePlugin.hostPID" in new["keys"] and "devicePlugin.hostPID" not in old["keys"]
    assert old["keys"]["scheduler.nodeSelector"]["template_only"]
    for version in ("2.9.0", "2.10.0"):
        assert rules.first_failure("hami_chart_version", version) is None
        _values, manifest = hami.render(version, device_split_count=4)
        assert f"version: {version}" in manifest
    assert rules.first_failure("hami_chart_version", "2.8.0") is not None


@pytest.mark.parametrize(
    ("version", "extra", "refused"),
    [
        ("2.9.0", {"devicePlugin": {"hostPID": True}}, "devicePlugin.hostPID"),
        ("2.10.0", {"dra": {"enabled": True}}, "dra"),
        (
            "2.10.0",
            {"scheduler": {"kubeScheduler": {"imageTag": "v1.33.5"}}},
            "scheduler.kubeScheduler.imageTag",
        ),
    ],
)
def test_preflight_refuses_a_values_key_the_pinned_chart_lacks(version, extra, refused):
    out = []
    check_hami_values(lab(hami_chart_version=version, hami_extra_values=extra), out)
    (p,) = out
    assert (p.host, p.field, p.value) == ("all", "hami_extra_values", refused)
    assert f"not a value of HAMi chart {version}" in p.why and f"use a key of HAMi chart {version}" in p.fix


def test_preflight_passes_keys_the_pinned_chart_has():
    out = []
    check_hami_values(lab(hami_chart_version="2.9.0", hami_extra_values={"dra": {"enabled": False}}), out)
    check_hami_values(lab(hami_extra_values={"devicePlugin": {"hostPID": True}}), out)
    assert out == []


def test_one_registry_for_every_image_and_the_plan_says_where_each_comes_from():
    values = hami.build_values(image_registry="registry.lan:5000")
    assert values["global"] == {"imageRegistry": "registry.lan:5000"}
    assert hami.check_values(values, hami.load_keys("2.9.0")) == []

    default = image_lines(lab(hami_chart_version="2.9.0"))
    assert default[0] == "  images (each image's own registry):"
    assert "    kube-scheduler (hami-scheduler): registry.k8s.io/kube-scheduler:v1.33.5" in default
    assert "    device plugin (hami-device-plugin): docker.io/projecthami/hami:v2.9.0" in default
    mirrored = image_lines(lab(hami_image_registry="registry.lan:5000"))
    assert mirrored[0] == "  images (registry registry.lan:5000 (hami_image_registry) for all):"
    assert all(line.split(": ", 1)[1].startswith("registry.lan:5000/") for line in mirrored[1:])
    assert "    scheduler extender (hami-scheduler): registry.lan:5000/projecthami/hami:v2.10.0" in mirrored
