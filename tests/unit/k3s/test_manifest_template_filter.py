"""gpulab.k8s.template: the filter the manifest templates write scalars with (gpulab.homelab.yaml_scalar) and the
engine's rendering of a role template, held to PyYAML's own output for the same value at the same place."""

from __future__ import annotations

import plugin_files
import pytest
import yaml
from ansible.errors import AnsibleFilterError
from hypothesis import given
from hypothesis import strategies as st

from gpulab.k8s import template
from gpulab.k8s.template import TemplateError, yaml_scalar


def dumped_at(value, indent, key):
    """PyYAML's text for `value` under `key` at `indent` inside a Kubernetes-shaped document (maps in the items of
    lists, after a sibling key, as env and containers are), after the key (or dash)."""
    node = {"name": "x", "s": [value]} if key == "-" else {"name": "x", key: value}
    for _ in range(indent // 2):
        node = {"items": [node]}
    text = yaml.safe_dump(node, default_flow_style=False, sort_keys=False)
    prefix = " " * indent + ("- " if key == "-" else f"{key}: ")
    start = text.index("\n" + prefix) + 1
    return text[start + len(prefix) :].rstrip("\n")


def test_a_scalar_is_plain_when_yaml_reads_it_back_the_same_and_quoted_otherwise():
    assert [yaml_scalar(v) for v in ("hami", "2.10", "on", "", 1, True, "0.45", "a: b")] == [
        "hami", "'2.10'", "'on'", "''", "1", "true", "'0.45'", "'a: b'"
    ]  # fmt: skip


def test_a_long_scalar_folds_where_it_stands_with_the_indentation_of_its_place():
    words = "words " * 20
    assert yaml_scalar(words, 10, "value") == (
        "'words words words words words words words words words words words\n"
        "            words words words words words words words words words '"
    )
    item = "ollama serve & sleep 5 && ollama pull llama3.2:1b && wait; echo this line is long"
    assert yaml_scalar(item, 8, "-") == (
        "ollama serve & sleep 5 && ollama pull llama3.2:1b && wait; echo this line\n          is long"
    )
    # the same text at column 0 folds later: the place matters
    assert "\n" not in yaml_scalar(item, 0, "-").split("echo")[0]


@given(
    value=st.one_of(st.text(max_size=120), st.integers(), st.booleans(), st.floats(allow_nan=False)),
    indent=st.integers(0, 8).map(lambda n: 2 * n),
    key=st.sampled_from(["-", "value", "path", "nvidia.com/use-gpuuuid"]),
)
def test_it_writes_what_pyyaml_writes_in_place(value, indent, key):
    got = yaml_scalar(value, indent, key)
    assert got == dumped_at(value, indent, key)
    line = " " * indent + ("- " if key == "-" else f"{key}: ") + got
    read = yaml.safe_load(line)
    assert (read[0] if key == "-" else read[key]) == value


@pytest.mark.parametrize(("value", "indent", "why"), [({"a": 1}, 0, "not a scalar"), ("x", 3, "even")])
def test_it_refuses_a_collection_or_an_odd_column(value, indent, why):
    with pytest.raises(TemplateError, match=why):
        yaml_scalar(value, indent)


def test_the_engine_renders_a_template_as_ansible_would_and_names_a_missing_variable(tmp_path):
    tpl = tmp_path / "t.yaml.j2"
    tpl.write_text("{# note #}\n{% if x %}\nname: {{ x | gpulab.homelab.yaml_scalar }}\n{% endif %}\n")
    assert template.render(tpl, {"x": "on"}) == "name: 'on'\n"
    with pytest.raises(TemplateError, match="'x' is undefined"):
        template.render(tpl, {})


def test_the_ansible_filter_is_the_engine_s_and_refuses_as_an_ansible_filter_error():
    ansible_filter = plugin_files.filters("manifest")["yaml_scalar"]
    assert ansible_filter("words " * 20, 10, "value") == yaml_scalar("words " * 20, 10, "value")
    with pytest.raises(AnsibleFilterError, match="not a scalar"):
        ansible_filter(["a"])
