"""HAMi chart values: key facts against the chart's values.yaml, key refusal, HelmChart rendering, module."""

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpulab import hami
from gpulab.k8s.validate import ManifestError, validate_manifest

from .conftest import CHART_VALUES, CONSTRUCTED, need_shared, run_ansible_module

FACTS = hami.load_keys("2.10.0")


def chart_values():
    return yaml.safe_load(need_shared(CHART_VALUES).read_text())


def all_paths(node, prefix=""):
    for key, value in node.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from all_paths(value, f"{prefix}{key}.")


def test_committed_facts_are_generated_from_the_chart_values():
    """The key facts in the package are exactly what the generator makes from chart 2.10.0's values.yaml."""
    regenerated = hami.keys_from_values(chart_values(), "2.10.0", FACTS["source"])
    assert regenerated == FACTS


def test_the_generator_command_writes_the_same_file(tmp_path):
    out = tmp_path / "keys.json"
    commit = "4707fb02c91c545bc7343ce26dba4c32919f9a3e"  # tag v2.10.0 (anchors.md)
    assert hami.main([str(need_shared(CHART_VALUES)), "2.10.0", "--commit", commit, "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == FACTS


def test_every_key_of_the_chart_is_known_and_the_chart_defaults_pass():
    values = chart_values()
    assert set(all_paths(values)) <= set(FACTS["keys"])
    assert hami.check_values(values, FACTS) == []


def test_gpulab_values_use_only_chart_keys():
    values = hami.build_values(
        device_split_count=4,
        device_memory_scaling=1.5,
        kube_scheduler_image={
            "registry": "registry.k8s.io",
            "repository": "kube-scheduler",
            "tag": "v1.33.5",
        },
    )
    assert hami.check_values(values, FACTS) == []
    for path in all_paths(values):
        assert path in FACTS["keys"] or any(
            path.startswith(p + ".") for p, e in FACTS["keys"].items() if e.get("open")
        )


def test_unknown_key_is_refused_with_a_suggestion():
    problems = hami.check_values({"devicePlugin": {"deviceSplitCont": 3}}, FACTS)
    assert len(problems) == 1
    assert "devicePlugin.deviceSplitCont" in problems[0] and "devicePlugin.deviceSplitCount" in problems[0]


def test_stale_scheduler_image_tag_key_is_refused_with_its_new_name():
    problems = hami.check_values({"scheduler": {"kubeScheduler": {"imageTag": "v1.33.5"}}}, FACTS)
    assert problems and "scheduler.kubeScheduler.image.tag" in problems[0]


def test_shape_mismatches_are_refused():
    assert hami.check_values({"devicePlugin": 3}, FACTS)
    assert hami.check_values({"devicePlugin": {"deviceSplitCount": {"a": 1}}}, FACTS)
    assert hami.check_values({1: "x"}, FACTS)


def test_open_maps_take_any_key():
    values = {
        "devicePlugin": {
            "nvidiaNodeSelector": {"nvidia.com/gpu.present": "true"},
            "resources": {"limits": {}},
        },
        "scheduler": {"nodeSelector": {"node-role.kubernetes.io/control-plane": "true"}},
        "global": {"labels": {"team": "lab"}},
    }
    assert hami.check_values(values, FACTS) == []


@given(st.text("abcdefghijklmnopqrstuvwxyzXYZ", min_size=1, max_size=12))
def test_any_key_not_in_the_chart_is_refused(name):
    for section in ("devicePlugin", "scheduler", ""):
        path = f"{section}.{name}" if section else name
        values = {section: {name: 1}} if section else {name: 1}
        if path in FACTS["keys"]:
            continue
        assert hami.check_values(values, FACTS), path


def test_bare_on_in_the_node_selector_is_refused():
    with pytest.raises(hami.ValuesError, match="quote it"):
        hami.build_values(node_selector=yaml.safe_load("gpu: on"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device_split_count": 0},
        {"device_split_count": True},
        {"device_memory_scaling": 0},
        {"device_memory_scaling": "1"},
    ],
)
def test_bad_numbers_are_refused(kwargs):
    with pytest.raises(hami.ValuesError):
        hami.build_values(**kwargs)


def test_values_content_keeps_on_a_string_for_yaml_1_1():
    text = hami.values_content(hami.build_values())
    # PyYAML implements YAML 1.1, where a bare `on` is true: the text must still give the string back.
    assert yaml.safe_load(text)["devicePlugin"]["nvidiaNodeSelector"] == {"gpu": "on"}


def test_scheduler_tag_is_left_to_the_chart_unless_set():
    assert "scheduler" not in hami.build_values()
    image = hami.build_values(kube_scheduler_image={"registry": "registry.k8s.io", "tag": ""})["scheduler"]
    assert image == {"kubeScheduler": {"image": {"registry": "registry.k8s.io"}}}
    tagged = hami.build_values(kube_scheduler_image={"tag": "v1.33.5"})
    assert tagged["scheduler"]["kubeScheduler"]["image"] == {"tag": "v1.33.5"}


def test_scheduler_tag_follows_the_k3s_release_the_role_is_given():
    # stage hami passes k3s_version: the tag is written out, so the HelmChart changes with a k3s upgrade
    image = {"registry": "registry.k8s.io", "repository": "kube-scheduler", "tag": ""}
    old = hami.build_values(kube_scheduler_image=image, kube_version="v1.33.5+k3s1")
    new = hami.build_values(kube_scheduler_image=image, kube_version="v1.34.1+k3s1")
    assert old["scheduler"]["kubeScheduler"]["image"] == {**image, "tag": "v1.33.5"}
    assert new["scheduler"]["kubeScheduler"]["image"]["tag"] == "v1.34.1"
    assert hami.values_digest(old) != hami.values_digest(new)
    # the owner's tag wins
    pinned = hami.build_values(kube_scheduler_image={**image, "tag": "v1.33.4"}, kube_version="v1.34.1+k3s1")
    assert pinned["scheduler"]["kubeScheduler"]["image"]["tag"] == "v1.33.4"


def test_extra_values_merge_and_are_checked():
    values = hami.build_values(
        extra_values={"devicePlugin": {"deviceCoreScaling": 2}, "scheduler": {"replicas": 2}}
    )
    assert (
        values["devicePlugin"]["deviceCoreScaling"] == 2 and values["devicePlugin"]["deviceSplitCount"] == 10
    )
    with pytest.raises(hami.ValuesError, match=r"scheduler\.replica"):
        hami.render("2.10.0", extra_values={"scheduler": {"replica": 2}})


def test_render_gives_a_valid_helmchart_with_the_requested_values():
    values, manifest = hami.render("2.10.0", device_split_count=7, device_memory_scaling=1)
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(docs) == 1
    chart = docs[0]
    validate_manifest(chart, "v1.33.5+k3s1")
    spec = chart["spec"]
    assert (spec["repo"], spec["chart"], spec["version"]) == (
        "https://project-hami.github.io/HAMi/",
        "hami",
        "2.10.0",
    )
    assert yaml.safe_load(spec["valuesContent"]) == values
    plugin = values["devicePlugin"]
    assert plugin["deviceSplitCount"] == 7 and plugin["runtimeClassName"] == "nvidia"
    # Stable text: a second render is byte-identical (the role's copy task then reports no change).
    assert hami.render("2.10.0", device_split_count=7, device_memory_scaling=1)[1] == manifest


def test_constructed_helmchart_sample_validates_and_a_typo_does_not():
    sample = yaml.safe_load(need_shared(CONSTRUCTED / "helmchart-hami.yaml").read_text())
    validate_manifest(sample, "1.33")
    assert hami.check_values(yaml.safe_load(sample["spec"]["valuesContent"]), FACTS) == []
    sample["spec"]["valueContent"] = sample["spec"].pop("valuesContent")
    with pytest.raises(ManifestError, match="valueContent"):
        validate_manifest(sample, "1.33")


def test_unknown_chart_version_names_the_known_ones():
    with pytest.raises(hami.ValuesError, match=r"2\.10\.0"):
        hami.load_keys("9.9.9")


def test_module_renders_and_refuses():
    ok = run_ansible_module("hami_values", {"chart_version": "2.10.0", "device_split_count": 5})
    assert not ok.get("failed"), ok
    assert ok["changed"] is False and ok["values"]["devicePlugin"]["deviceSplitCount"] == 5
    assert ok["values"]["devicePlugin"]["deviceMemoryScaling"] == 1
    assert "kind: HelmChart" in ok["manifest"] and ok["keys_known"] == len(FACTS["keys"])

    bad = run_ansible_module(
        "hami_values", {"chart_version": "2.10.0", "extra_values": {"devicePlugin": {"splitCount": 5}}}
    )
    assert bad["failed"] and "devicePlugin.splitCount" in bad["msg"]

    boolean = run_ansible_module("hami_values", {"chart_version": "2.10.0", "node_selector": {"gpu": True}})
    assert boolean["failed"] and "quote" in boolean["msg"]


def test_module_check_mode_renders_the_same():
    args = {"chart_version": "2.10.0"}
    assert (
        run_ansible_module("hami_values", args, check_mode=True)["manifest"]
        == run_ansible_module("hami_values", args)["manifest"]
    )
