"""Every module in plugins/modules: DOCUMENTATION, EXAMPLES and RETURN parse and match its argument spec.

Modules are found by listing the folder, so a new module is checked without touching this file. Every module
declares its options in ARGUMENT_SPEC, the one place they are declared: by hand (a PVE module spreads the
connection options of plugins/module_utils/pve.py into it), but for pve_vm's, which `make docs` generates from
its option table gpulab.pve.vmoptions. A module without one must be the documentation of an action plugin.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpulab import docs, tasks

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("[!_]*.py"))
# Modules name their doc fragments by full name, as an installed collection needs (galaxy.yml's namespace.name).
COLLECTION = "gpulab.homelab"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def module(name: str) -> ModuleType:
    return load(ROOT / "plugins" / "modules" / f"{name}.py", name)


def argument_spec(mod: ModuleType) -> dict | None:
    """The module's whole argument spec, as its file declares it (ARGUMENT_SPEC)."""
    return getattr(mod, "ARGUMENT_SPEC", None)


def with_fragments(doc: dict, key: str, section: str = "DOCUMENTATION") -> dict:
    """The entries under `key` of the module's docs (the whole RETURN for key None), with those its doc
    fragments give, merged as ansible-doc merges them: an entry already there wins (the module's own first,
    then each fragment in the order listed), and an entry that is a dict in both is merged key by key."""
    own = (
        {k: v for k, v in doc.items() if k != "extends_documentation_fragment"}
        if key is None
        else doc.get(key)
    )
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in (own or {}).items()}
    for name in doc.get("extends_documentation_fragment") or []:
        if name.startswith("ansible.builtin."):  # ansible-core's own, e.g. action_common_attributes.facts
            fragment, _, part_name = name.removeprefix("ansible.builtin.").partition(".")
            frag = importlib.import_module(f"ansible.plugins.doc_fragments.{fragment}")
            text = getattr(frag.ModuleDocFragment, part_name.upper() or section, "{}")
            part = yaml.safe_load(text) if section == "DOCUMENTATION" else {}
        else:
            collection, _, fragment = name.rpartition(".")
            assert collection == COLLECTION, f"doc fragment {name}: by its full name, {COLLECTION}.<fragment>"
            frag = load(ROOT / "plugins" / "doc_fragments" / f"{fragment}.py", f"fragment_{fragment}")
            part = yaml.safe_load(getattr(frag.ModuleDocFragment, section, "{}"))
        for entry, value in ((part if key is None else part.get(key)) or {}).items():
            if isinstance(value, dict) and isinstance(merged.get(entry), dict):
                merged[entry] = {**value, **merged[entry]}
            else:
                merged.setdefault(entry, value)
    return merged


def documented_options(doc: dict) -> dict:
    """The module's options with those of its gpulab doc fragments."""
    return with_fragments(doc, "options")


def compare(doc: dict, spec: dict, where: str = "") -> list[str]:
    problems = []
    for name in sorted(set(doc) | set(spec)):
        if name not in doc or name not in spec:
            problems.append(
                f"{where}{name}: only in {'the argument spec' if name in spec else 'the documentation'}"
            )
            continue
        d, s = doc[name], spec[name]
        for key, default in (("type", "str"), ("required", False), ("default", None), ("choices", None)):
            if d.get(key, default) != s.get(key, default):
                problems.append(
                    f"{where}{name}: {key} {d.get(key, default)!r} (doc) != {s.get(key, default)!r}"
                )
        if d.get("elements") != s.get("elements"):
            problems.append(f"{where}{name}: elements {d.get('elements')!r} (doc) != {s.get('elements')!r}")
        if not d.get("description"):
            problems.append(f"{where}{name}: no description")
        if "options" in s or "suboptions" in d:
            problems += compare(d.get("suboptions") or {}, s.get("options") or {}, f"{where}{name}.")
    return problems


def test_every_module_is_found():
    assert {"pve_vm", "dhcp_reservation", "gpu_facts", "preflight"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_argument_spec(name):
    mod = module(name)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == name
    assert doc.get("short_description") and doc.get("description")
    spec = argument_spec(mod)
    if spec is None:
        # The documentation of an action plugin that takes no options.
        assert (ROOT / "plugins" / "action" / f"{name}.py").is_file()
        assert documented_options(doc) == {}
        return
    assert compare(documented_options(doc), spec) == []
    assert with_fragments(doc, "attributes")["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_call_the_module_with_documented_options(name):
    mod = module(name)
    options = documented_options(yaml.safe_load(mod.DOCUMENTATION))
    tasks = yaml.safe_load(mod.EXAMPLES)
    used = [task[f"gpulab.homelab.{name}"] for task in tasks if f"gpulab.homelab.{name}" in task]
    assert used, "no example calls the module by its full name"
    assert not [task for task in tasks if name in task], "an example calls the module by its short name"
    for args in used:
        assert set(args or {}) <= set(options), set(args or {}) - set(options)
        for opt, info in options.items():
            if info.get("required") and not (argument_spec(mod) or {}).get(opt, {}).get("fallback"):
                assert opt in args, f"an example lacks the required option {opt}"


@pytest.mark.parametrize("name", MODULES)
def test_return_parses_and_describes_each_value(name):
    returned = with_fragments(yaml.safe_load(module(name).RETURN), None, "RETURN")
    assert returned
    assert all("description" in v and "returned" in v and "type" in v for v in returned.values())


@pytest.mark.parametrize("name", [n for n in MODULES if argument_spec(module(n)) is not None])
def test_secret_options_are_no_log(name):
    spec = argument_spec(module(name))

    def walk(options, where=""):
        for opt, info in options.items():
            if any(word in opt for word in ("password", "secret", "token")) and not opt.endswith("_id"):
                assert info.get("no_log") is True, f"{where}{opt} is a secret and needs no_log"
            yield from walk(info.get("options") or {}, f"{where}{opt}.")
            yield opt

    assert list(walk(spec))


CONTROLLER = [n for n in MODULES if tasks.of(n) is not None]
RUFF = importlib.util.find_spec("ruff") is not None


@pytest.mark.parametrize("name", CONTROLLER)
def test_a_controller_modules_options_are_declared_in_its_file_only(name):
    """The module file's ARGUMENT_SPEC is the one declaration of its options: the engine's task keeps no copy
    (it reads its options from the checked params by name), and only pve_vm's is written by `make docs`."""
    task = tasks.of(name)
    assert not hasattr(task, "OPTIONS") and not hasattr(task, "PVE"), f"gpulab.tasks.{name} repeats the spec"
    text = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
    assert ("by `make docs`: edit its OPTIONS" in text) == (name == "pve_vm")


@pytest.mark.parametrize("name", CONTROLLER)
def test_a_pve_module_spreads_the_connection_options_and_rules(name):
    """A module documented with the pve fragment takes the connection options and their rules of
    plugins/module_utils/pve.py as they are; any other controller module takes neither."""
    from ansible_collections.gpulab.homelab.plugins.module_utils import pve

    mod = module(name)
    fragments = yaml.safe_load(mod.DOCUMENTATION).get("extends_documentation_fragment") or []
    if f"{COLLECTION}.pve" in fragments:
        assert {k: mod.ARGUMENT_SPEC.get(k) for k in pve.CONNECTION} == pve.CONNECTION
        assert mod.RULES == pve.CONNECTION_RULES
    else:
        assert not [k for k in mod.ARGUMENT_SPEC if k.startswith("api_")]
        assert mod.RULES == {}


def test_pve_vms_argument_spec_is_its_option_table():
    """pve_vm's spec is generated from gpulab.pve.vmoptions (the table that also maps each option to PVE's
    keys) with the connection options: `make docs` wrote it and nobody edited it."""
    from ansible_collections.gpulab.homelab.plugins.module_utils import pve

    from gpulab.pve import vmoptions

    mod = module("pve_vm")
    assert {**vmoptions.argument_spec(), **pve.CONNECTION} == mod.ARGUMENT_SPEC
    assert mod.RULES == pve.CONNECTION_RULES
    # an option's suboptions are named above the spec (DISKS_OPTIONS), so that the spec is one option a line
    nested = {k: v["options"] for k, v in mod.ARGUMENT_SPEC.items() if "options" in v}
    assert set(nested) == {"efidisk", "disks", "nets", "hostpci", "cloudinit"}
    assert all(options is getattr(mod, f"{k.upper()}_OPTIONS") for k, options in nested.items())
    text = (ROOT / "plugins" / "modules" / "pve_vm.py").read_text()
    if RUFF:  # make docs lays the lines out with ruff (a venv without it, such as unit-min's, writes them unformatted)
        assert docs.vm_argument_spec_block(text) == docs.render_vm_argument_spec()


def keywords(function, *leave_out: str) -> dict:
    """The keyword parameters of `function` (but `leave_out`), with their defaults."""
    params = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in params if p.name not in leave_out and p.kind is not p.VAR_KEYWORD}


def test_the_hand_kept_specs_offer_what_the_engine_takes():
    """What a hand-kept spec shares with the engine is checked here: the router kinds, PVE's info sections, and
    the options a task hands on whole to an engine function (a name the function does not take would fail
    every run; a default that differs from the function's would change what a run does)."""
    from gpulab import constants, hami, monitoring, routers
    from gpulab.pve import connection, download, info
    from gpulab.tasks import pve_download

    dhcp = module("dhcp_reservation").ARGUMENT_SPEC
    assert dhcp["kind"]["choices"] == list(routers.KINDS) == list(constants.ROUTER_KINDS)
    gather = module("pve_info").ARGUMENT_SPEC["gather"]
    assert (gather["choices"], gather["default"]) == (list(info.SECTIONS), list(info.DEFAULT_SECTIONS))

    charts = module("monitoring_charts").ARGUMENT_SPEC
    render = keywords(monitoring.render)
    assert set(charts) == set(render)
    assert {
        k: v["default"] for k, v in charts.items() if render[k] not in (None, inspect.Parameter.empty)
    } == {k: v for k, v in render.items() if v not in (None, inspect.Parameter.empty)}

    values = module("hami_values").ARGUMENT_SPEC
    chart_args = (
        "chart_version",
        "name",
        "namespace",
        "repo",
        "timeout",
    )  # hami.render's own, to the HelmChart
    assert set(values) == set(keywords(hami.build_values)) | set(chart_args)

    spec = module("pve_download").ARGUMENT_SPEC
    taken = keywords(download.ensure_download, "client", "check_mode", "on_progress")
    assert set(spec) - set(connection.OPTIONS) - set(pve_download.NOT_DOWNLOAD) == set(taken)
    assert {k: spec[k].get("default") for k in taken if taken[k] is not inspect.Parameter.empty} == {
        k: v for k, v in taken.items() if v is not inspect.Parameter.empty
    }


def test_the_pve_connection_options_are_written_once_for_every_pve_module():
    """plugins/module_utils/pve.py holds the connection options (the engine's gpulab.pve.connection, written by
    `make docs`); each PVE module spreads them into its ARGUMENT_SPEC instead of repeating them."""
    from ansible.module_utils.basic import env_fallback
    from ansible_collections.gpulab.homelab.plugins.module_utils import pve

    from gpulab.pve import connection

    assert connection.argument_spec(env_fallback) == pve.CONNECTION
    assert {k: [list(g) for g in v] for k, v in connection.MODULE_KWARGS.items()} == pve.CONNECTION_RULES
    text = (ROOT / "plugins" / "module_utils" / "pve.py").read_text()
    if RUFF:
        assert docs.connection_spec_block(text) == docs.render_connection_spec()
    for name in MODULES:
        source = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
        assert "api_token_secret=" not in source, name  # documented by the fragment, declared once


def _example_args(mod: ModuleType) -> dict:
    """The arguments of the module's one example task, with the spec's defaults for the options it omits."""
    [example] = yaml.safe_load(mod.EXAMPLES)
    [args] = [v for k, v in example.items() if k.startswith(COLLECTION)]
    return {k: v.get("default") for k, v in mod.ARGUMENT_SPEC.items()} | args


def test_return_samples_are_what_the_engine_gives_for_the_example():
    """A RETURN sample is the engine's answer to the module's EXAMPLES task, so the two cannot drift apart."""
    from gpulab import monitoring
    from gpulab.pve import mapping

    charts = module("monitoring_charts")
    out = monitoring.render(**_example_args(charts))
    assert yaml.safe_load(charts.RETURN)["urls"]["sample"] == out["urls"]
    pci = module("pve_pci_mapping")
    args = _example_args(pci)
    # a new mapping without O(description) (ensure_pci_mapping's `after`): its entries' map items, sorted
    after = {"map": sorted(mapping.map_entry(e) for e in args["entries"]), "description": ""}
    assert yaml.safe_load(pci.RETURN)["mapping"]["sample"] == after
