"""HAMi chart values: the facts of one chart version, key validation, and the k3s HelmChart that installs it.

Helm silently ignores a values key the chart does not use (HAMi ships no values schema), so a stale key such as
`scheduler.kubeScheduler.imageTag` (renamed `scheduler.kubeScheduler.image.tag` in 2.7) would install a chart
that quietly does something else. Every key is therefore checked against the key facts of the pinned chart
version, kept in `gpulab/data/hami-<version>-keys.json` and generated from that version's values.yaml by
`keys_from_values` (see `python -m gpulab.hami --help`).

A key facts file maps each dotted key path of the chart's values to its kind (`map`, `list`, `str`, `int`,
`float`, `bool`, `any` for a null default) and says which maps are open (free-form: node selectors, labels,
annotations, resources, security contexts, empty maps), under which any key is accepted.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import pathlib
import sys
from importlib import resources

import yaml

CHART_NAME = "hami"
CHART_REPO = "https://project-hami.github.io/HAMi/"
DEFAULT_RUNTIME_CLASS = "nvidia"
DEFAULT_NODE_SELECTOR = {"gpu": "on"}

# Maps whose keys are the user's own (Kubernetes label/annotation/selector/resource maps) even when the chart
# fills in an example; everything beneath them is accepted.
OPEN_MAP_NAMES = frozenset(
    {
        "annotations",
        "capabilities",
        "extraEnvs",
        "labels",
        "managedNodeSelector",
        "matchLabels",
        "nodeSelector",
        "nvidiaNodeSelector",
        "podAnnotations",
        "resources",
        "securityContext",
    }
)

# Keys the chart's templates read although values.yaml does not list them (anchors.md, HAMi 2.10.0 section D;
# 2.9.0's templates/scheduler/deployment.yaml reads the same two).
TEMPLATE_ONLY_KEYS = {
    "2.9.0": {"scheduler.nodeSelector": "map", "scheduler.nodeLabelSelector": "map"},
    "2.10.0": {"scheduler.nodeSelector": "map", "scheduler.nodeLabelSelector": "map"},
}

# The images the chart runs (a GPU node's device plugin and monitor, the scheduler's two containers, the job
# that makes the webhook's certificate), by their values path; the mock device plugin and DRA are off by default.
CHART_IMAGES = (
    ("scheduler.kubeScheduler.image", "kube-scheduler (hami-scheduler)"),
    ("scheduler.extender.image", "scheduler extender (hami-scheduler)"),
    ("devicePlugin.image", "device plugin (hami-device-plugin)"),
    ("devicePlugin.monitor.image", "vGPU monitor (hami-device-plugin)"),
    ("scheduler.patch.imageNew", "webhook certificate job"),
)

# Keys that existed in older chart versions, with their replacement, for a precise refusal message.
RENAMED_KEYS = {"scheduler.kubeScheduler.imageTag": "scheduler.kubeScheduler.image.tag"}


class ValuesError(ValueError):
    """The requested values do not fit the pinned chart version."""


# A value's kind, by the first type it is an instance of (bool before int: a bool is an int too).
_KINDS = ((dict, "map"), (list, "list"), (bool, "bool"), (int, "int"), (float, "float"), (str, "str"))


def _kind(value):
    return next((kind for type_, kind in _KINDS if isinstance(value, type_)), "any")


def keys_from_values(
    values,
    chart_version,
    source="",
    *,
    chart=CHART_NAME,
    open_names=OPEN_MAP_NAMES,
    template_only=None,
    images=None,
):
    """Key facts of a chart from its parsed values.yaml (see the module docstring). HAMi's by default; another
    chart (gpulab.monitoring) gives its name, its open map names, its template-only keys and its images."""
    template_only = TEMPLATE_ONLY_KEYS.get(chart_version, {}) if template_only is None else template_only
    image_paths = CHART_IMAGES if images is None else images
    keys = {}

    def walk(node, prefix):
        for name, value in node.items():
            path = f"{prefix}{name}"
            kind = _kind(value)
            entry = {"kind": kind}
            if kind == "map":
                entry["open"] = name in open_names or path in open_names or not value
            keys[path] = entry
            if kind == "map":
                walk(value, path + ".")

    walk(values, "")
    for path, kind in template_only.items():
        keys.setdefault(path, {"kind": kind, "open": True, "template_only": True})

    def at(path):
        node = values
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {}

    found = {
        path: {k: at(path).get(k) or "" for k in ("registry", "repository", "tag")}
        for path, _what in image_paths
        if at(path)
    }
    return {
        "chart": chart,
        "version": chart_version,
        "source": source,
        "global_image_tag": str(at("global").get("imageTag") or ""),
        "images": found,
        "keys": dict(sorted(keys.items())),
    }


def chart_images(facts, *, kube_version="", image_registry="", kube_scheduler_image=None):
    """Where each image of the chart comes from: [(what, image)], as the chart renders them. global.imageRegistry
    (`image_registry`) replaces every image's registry; the kube-scheduler's tag is the server's version without
    `+k3s1` unless set; HAMi's own images take global.imageTag."""
    out = []
    for path, what in CHART_IMAGES:
        image = dict(facts.get("images", {}).get(path) or {})
        if not image:
            continue
        if path == "scheduler.kubeScheduler.image":
            image.update({k: v for k, v in (kube_scheduler_image or {}).items() if v})
            if not image.get("tag"):
                image["tag"] = kube_version.split("+", 1)[0] or "(the server's version)"
        elif not image.get("tag"):
            image["tag"] = facts.get("global_image_tag") or "?"
        registry = image_registry or image.get("registry")
        out.append((what, f"{registry + '/' if registry else ''}{image['repository']}:{image['tag']}"))
    return out


def chart_facts_path(chart, version):
    """Where the package keeps the key facts of `chart` at `version` (data/<chart>-<version>-keys.json)."""
    return resources.files("gpulab").joinpath("data", f"{chart}-{version}-keys.json")


def chart_versions(chart):
    """The versions of `chart` whose key facts the package holds, sorted (a version starts with a digit, so
    chart hami's are not hami-webui's)."""
    prefix, suffix = f"{chart}-", "-keys.json"
    return sorted(
        p.name[len(prefix) : -len(suffix)]
        for p in resources.files("gpulab").joinpath("data").iterdir()
        if p.name.startswith(prefix) and p.name.endswith(suffix) and p.name[len(prefix) :][:1].isdigit()
    )


def load_chart_keys(chart, version, *, generate, error=None, otherwise=""):
    """The key facts of `chart` at `version` kept in the package. None there: `error` (ValuesError unless
    given) naming the versions that are, how to make the missing ones (`generate`: the words after
    `python -m`) and `otherwise`, what else the user may do."""
    path = chart_facts_path(chart, version)
    if not path.is_file():
        known = ", ".join(chart_versions(chart)) or "none"
        raise (error or ValuesError)(
            f"No key facts for chart {chart} {version} (known: {known}): generate them with `python -m "
            f"{generate}` and add the file to library/gpulab/data/{otherwise}."
        )
    return json.loads(path.read_text())


def facts_path(chart_version):
    return chart_facts_path(CHART_NAME, chart_version)


def known_versions():
    """The HAMi chart versions whose key facts the package holds, sorted."""
    return chart_versions(CHART_NAME)


def load_keys(chart_version):
    """The key facts of a HAMi chart version kept in the package; ValuesError when there are none."""
    return load_chart_keys(
        CHART_NAME,
        chart_version,
        generate=f"gpulab.hami <values.yaml of chart {chart_version}> {chart_version}",
    )


def check_values(values, facts):
    """Every problem with `values` for the chart described by `facts`, as readable lines (empty: all good)."""
    keys = facts["keys"]
    chart = "HAMi" if facts.get("chart", CHART_NAME) == CHART_NAME else facts["chart"]
    problems = []

    def suggest(path):
        if path in RENAMED_KEYS:
            return f"; it was renamed {RENAMED_KEYS[path]}"
        close = difflib.get_close_matches(path, keys, n=1, cutoff=0.75)
        return f"; did you mean {close[0]}?" if close else ""

    def walk(node, prefix):
        for name, value in node.items():
            if not isinstance(name, str):
                problems.append(f"{prefix}{name!r}: keys must be strings (quote it in YAML)")
                continue
            path = f"{prefix}{name}"
            entry = keys.get(path)
            if entry is None:
                problems.append(
                    f"{path}: not a value of {chart} chart {facts['version']} (Helm would ignore it){suggest(path)}"
                )
                continue
            kind = entry["kind"]
            if kind == "map":
                if value is None:
                    continue
                if not isinstance(value, dict):
                    problems.append(f"{path}: the chart expects a map here, not {_kind(value)}")
                elif not entry.get("open"):
                    walk(value, path + ".")
            elif isinstance(value, dict) and kind != "any":
                problems.append(f"{path}: the chart expects {kind} here, not a map")

    if not isinstance(values, dict):
        return ["values must be a map"]
    walk(values, "")
    return problems


def deep_merge(base, extra):
    """`extra` merged into a copy of `base`: maps merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def build_values(
    *,
    device_split_count=10,
    device_memory_scaling=1,
    runtime_class_name=DEFAULT_RUNTIME_CLASS,
    node_selector=None,
    kube_scheduler_image=None,
    image_registry="",
    extra_values=None,
    kube_version="",
):
    """The chart values gpulab sets, from the role's variables; `extra_values` is merged last.
    A non-empty `image_registry` becomes global.imageRegistry, which replaces the registry of every image.

    The kube-scheduler image tag is `kube_scheduler_image`'s `tag`; without one it is `kube_version` (the
    cluster's k3s release) with `+k3s1` stripped, what the chart itself derives, written out so that the
    HelmChart changes with a k3s upgrade: k3s' helm controller runs helm again only when the HelmChart changes,
    so the chart would keep the old release's kube-scheduler (k3s-io/helm-controller; see
    rancher/prometheus-federator#103). Both empty: the tag is left to the chart.
    """
    if (
        isinstance(device_split_count, bool)
        or not isinstance(device_split_count, int)
        or device_split_count < 1
    ):
        raise ValuesError(f"deviceSplitCount must be a whole number of 1 or more, not {device_split_count!r}")
    if isinstance(device_memory_scaling, bool) or not isinstance(device_memory_scaling, int | float):
        raise ValuesError(f"deviceMemoryScaling must be a number, not {device_memory_scaling!r}")
    if device_memory_scaling <= 0:
        raise ValuesError(f"deviceMemoryScaling must be above 0, not {device_memory_scaling!r}")
    selector = DEFAULT_NODE_SELECTOR if node_selector is None else node_selector
    for key, value in selector.items():
        if not isinstance(value, str):
            raise ValuesError(
                f"node selector {key}: {value!r} is not a string; Kubernetes labels are strings and YAML 1.1 "
                f'reads a bare on/off/yes/no as a boolean: quote it ({key}: "on")'
            )
    plugin = {
        "deviceSplitCount": device_split_count,
        "deviceMemoryScaling": device_memory_scaling,
        "runtimeClassName": runtime_class_name,
        "nvidiaNodeSelector": dict(selector),
    }
    values = {"devicePlugin": plugin}
    image = {k: v for k, v in (kube_scheduler_image or {}).items() if v not in (None, "")}
    if kube_version and not image.get("tag"):
        image["tag"] = str(kube_version).split("+", 1)[0]
    if image:
        values["scheduler"] = {"kubeScheduler": {"image": image}}
    if image_registry:
        values["global"] = {"imageRegistry": image_registry}
    return deep_merge(values, extra_values or {})


#: role hami's variables (defaults/main.yml) that tasks/chart.yml passes to module hami_values as values
ROLE_VALUE_ARGS = {
    "device_split_count": "hami_device_split_count",
    "device_memory_scaling": "hami_device_memory_scaling",
    "runtime_class_name": "hami_runtime_class_name",
    "node_selector": "hami_node_selector",
    "kube_scheduler_image": "hami_kube_scheduler_image",
    "image_registry": "hami_image_registry",
    "extra_values": "hami_extra_values",
    "kube_version": "hami_kube_version",
}


def role_values(role_vars):
    """The chart values role hami renders from its variables (`role_vars`: defaults/main.yml, or the
    inventory's), as tasks/chart.yml passes them to build_values."""
    return build_values(**{arg: role_vars[var] for arg, var in ROLE_VALUE_ARGS.items()})


def values_digest(values):
    """SHA-256 of the values as canonical JSON (sorted keys), to tell whether two renderings used the same."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def values_content(values):
    """Values as the YAML text of `valuesContent`; strings that YAML 1.1 would read otherwise are quoted."""
    return yaml.safe_dump(values, default_flow_style=False, sort_keys=False)


def helmchart(
    values,
    *,
    chart_version,
    name=CHART_NAME,
    namespace="kube-system",
    target_namespace=None,
    repo=CHART_REPO,
    timeout="10m0s",
    chart=CHART_NAME,
    labels=None,
):
    """The helm.cattle.io/v1 HelmChart that k3s's helm-controller installs from the manifests directory (HAMi's,
    or `chart` of `repo`)."""
    return {
        "apiVersion": "helm.cattle.io/v1",
        "kind": "HelmChart",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpulab", **(labels or {})},
        },
        "spec": {
            "repo": repo,
            "chart": chart,
            "version": chart_version,
            "targetNamespace": target_namespace or namespace,
            "timeout": timeout,
            "valuesContent": values_content(values),
        },
    }


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so valuesContent stays readable in the file."""


def _str_representer(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_LiteralDumper.add_representer(str, _str_representer)


def dump_manifest(doc, header="Managed by gpulab (role hami): changes here are overwritten."):
    """One manifest as YAML text with a header comment, stable from run to run."""
    body = yaml.dump(doc, Dumper=_LiteralDumper, default_flow_style=False, sort_keys=False)
    return f"# {header}\n---\n{body}"


def render(chart_version, **kwargs):
    """Check and render in one go: (values, HelmChart manifest text). Raises ValuesError listing every problem."""
    chart_args = {
        k: kwargs.pop(k) for k in ("name", "namespace", "target_namespace", "repo", "timeout") if k in kwargs
    }
    facts = load_keys(chart_version)
    values = build_values(**kwargs)
    problems = check_values(values, facts)
    if problems:
        raise ValuesError(
            f"HAMi chart {chart_version} values refused ({len(problems)} problem(s)): " + "; ".join(problems)
        )
    return values, dump_manifest(helmchart(values, chart_version=chart_version, **chart_args))


def facts_parser(prog, description):
    """The arguments every key facts generator takes (`python -m PROG VALUES_YAML ... [-o FILE]`); the caller
    adds its chart's own after VALUES_YAML. Its facts go out through write_facts."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("values_yaml", type=pathlib.Path)
    parser.add_argument("-o", "--output", type=pathlib.Path, help="default: stdout")
    return parser


def main(argv=None):
    parser = facts_parser(
        "python -m gpulab.hami", "Generate the key facts file of a HAMi chart version from its values.yaml."
    )
    parser.add_argument("chart_version")
    parser.add_argument("--commit", default="", help="the Git commit of the chart's tag, for the provenance")
    args = parser.parse_args(argv)
    values = yaml.safe_load(args.values_yaml.read_text())
    at = f" at tag v{args.chart_version} = commit {args.commit}" if args.commit else ""
    source = (
        f"charts/hami/values.yaml of Project-HAMi/HAMi chart {args.chart_version}{at} (Apache-2.0); "
        "key names, kinds and image defaults only"
    )
    return write_facts(keys_from_values(values, args.chart_version, source), args.output)


def write_facts(facts, output=None):
    """A facts file's JSON text (indent 1) to `output`, or to stdout; 0, the command's exit status."""
    text = json.dumps(facts, indent=1) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
