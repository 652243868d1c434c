"""The checkout as the collection gpulab.homelab (galaxy.yml, meta/runtime.yml, changelogs/, requirements.txt).

The collection is built with ansible-galaxy and installed into an empty folder; ansible-doc then finds every
module of plugins/modules there by its full name, with an empty ansible.cfg, so nothing of the checkout's own
paths (ansible.cfg `library`, `doc_fragment_plugins`) helps it. Without the engine (the `gpulab` distribution
that requirements.txt names) a playbook fails with Ansible's missing-library message: a controller module run
as a module by a Python that lacks it, and a controller whose own Python lacks it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible_runs import build_collection, install_collection, playbook_env
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MISSING = "Failed to import the required Python library (gpulab"
# The modules whose main() runs the engine's task (plugins/module_utils/controller_module.py's run_task).
ENGINE_MODULES = {
    m
    for m in MODULES
    if any(
        isinstance(n, ast.ImportFrom)
        and n.module == "ansible_collections.gpulab.homelab.plugins.module_utils.controller_module"
        for n in ast.walk(ast.parse((ROOT / "plugins" / "modules" / f"{m}.py").read_text()))
    )
}


def run(cmd, *, env=None, timeout=300, cwd=ROOT):
    """`cmd` with the environment the tests give Ansible (tests/ansible_runs.py: none of the shell's ANSIBLE_*
    settings, the checkout's ansible.cfg), `env` added last."""
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        env=playbook_env(**(env or {})),
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The collection's tarball, built from the checkout."""
    tarball = build_collection(tmp_path_factory.mktemp("build"), playbook_env())
    assert tarball.name == f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
    return tarball


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """The environment of an Ansible that sees only the installed collection: its collections path and an
    empty ansible.cfg (not the checkout's, whose library and doc fragment paths would find the modules)."""
    where = tmp_path_factory.mktemp("collections")
    cfg = where / "empty.cfg"
    cfg.write_text("")
    env = {"ANSIBLE_CONFIG": str(cfg), "ANSIBLE_COLLECTIONS_PATH": str(where), "ANSIBLE_HOME": str(where)}
    install_collection(built, where, playbook_env(**env))
    assert (where / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"] / "MANIFEST.json").is_file()
    return env, where


def test_the_tarball_holds_the_collection_and_leaves_out_the_checkout_s_own_tooling(built):
    with tarfile.open(built) as tar:
        names = tar.getnames()
        files = {m.name for m in tar.getmembers() if m.isfile()}
    top = {n.split("/", 1)[0] for n in names}
    assert {"plugins", "roles", "playbooks", "meta", "changelogs", "requirements.txt", "README.md"} <= top
    assert {f"plugins/modules/{m}.py" for m in MODULES} <= set(names)
    left_out = {
        ".git",
        ".venv",
        ".venv-min",
        ".lab",
        ".collections",
        "library",
        "molecule",
        "scripts",
    }
    assert not top & left_out, sorted(top & left_out)
    # of the tests only ansible-test's ignore files, which sanity reads in the installed copy (make sanity)
    tests = {n for n in files if n.startswith("tests/")}
    assert tests and all(n.startswith("tests/sanity/ignore-") for n in tests), sorted(tests)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_ansible_doc_finds_every_module_of_the_installed_collection_with_its_fragments(installed):
    env, where = installed
    names = [f"{FQCN}.{m}" for m in MODULES]
    proc = run([BIN / "ansible-doc", "-t", "module", "--json", *names], env=env, cwd=where)
    assert proc.returncode == 0, proc.stderr
    assert "[WARNING]" not in proc.stderr and "[ERROR]" not in proc.stderr, proc.stderr
    docs = json.loads(proc.stdout)
    assert sorted(docs) == sorted(names)
    for name, doc in docs.items():
        module = doc["doc"]
        assert module["collection"] == FQCN, name
        assert Path(module["filename"]).is_relative_to(where), name
        # a fragment's options are merged in: they are not written in the module's own DOCUMENTATION
        fragments = module.get("extends_documentation_fragment") or []
        for fragment in fragments:
            assert fragment.startswith((f"{FQCN}.", "ansible.builtin.")), (name, fragment)
        if f"{FQCN}.pve" in fragments:
            assert {"api_url", "api_token_id", "api_token_secret"} <= set(module["options"]), name
        # a module that runs the engine says so where ansible-doc shows what a module needs
        needs = [r for r in module.get("requirements") or [] if "gpulab" in r and "requirements.txt" in r]
        assert bool(needs) == (name.rsplit(".", 1)[-1] in ENGINE_MODULES), name


def test_ansible_doc_shows_every_module_as_text(installed):
    """The page a user reads (`ansible-doc gpulab.homelab.<module>`, no --json): ansible-core 2.19 could not
    render a RETURN that extended a doc fragment, so every module's page is rendered on both ends of the range
    (make unit or make pytest, and make unit-min)."""
    env, where = installed
    for module in MODULES:
        proc = run([BIN / "ansible-doc", "-t", "module", f"{FQCN}.{module}"], env=env, cwd=where)
        assert proc.returncode == 0 and "[ERROR]" not in proc.stderr, proc.stderr
        assert f"{FQCN}.{module}" in proc.stdout and "RETURN VALUES" in proc.stdout, module


def test_the_old_prefixed_names_still_work_in_the_installed_copy_with_a_deprecation(installed, tmp_path):
    """Before 0.2.0 the plugins repeated the namespace (gpulab.homelab.gpulab_pve_vm): meta/runtime.yml routes
    each old name to the new one until 1.0.0, and Ansible says so with a deprecation naming the new one."""
    env, where = installed
    routing = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["plugin_routing"]
    redirects = {
        kind: {old: e for old, e in entries.items() if "tombstone" not in e}
        for kind, entries in routing.items()
    }
    assert {f"gpulab_{m}" for m in MODULES} == set(redirects["modules"])
    for kind, entries in redirects.items():
        for old, entry in entries.items():
            new = entry["redirect"]
            assert new == f"{FQCN}.{old.removeprefix('gpulab_')}", (kind, old)
            if kind == "action":  # a module's action plugin: the module's entry warns
                assert old in redirects["modules"] and "deprecation" not in entry, old
                continue
            assert (
                entry["deprecation"]["removal_version"] == "1.0.0"
                and new in entry["deprecation"]["warning_text"]
            )
    proc = run([BIN / "ansible-doc", "-t", "module", f"{FQCN}.gpulab_pve_vm"], env=env, cwd=where)
    assert proc.returncode == 0 and "[ERROR]" not in proc.stderr, proc.stderr
    assert "pve_vm" in proc.stdout and "RETURN VALUES" in proc.stdout
    # a play of one's own with the old names: the filter and the module still answer, each with its warning
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "tasks": [
                {"name": "Old filter", "ansible.builtin.debug": {
                    "msg": "{{ [] | gpulab.homelab.gpulab_hami_problems_text }}"}},
                {"name": "Old module", f"{FQCN}.gpulab_wait": {
                    "what": "nothing", "timeout": 5, "module": "ansible.builtin.command",
                    "module_args": {"cmd": "true"}}},
            ],
        }
    ]  # fmt: skip
    book = tmp_path / "old-names.yml"
    book.write_text(yaml.safe_dump(play))
    proc = run([BIN / "ansible-playbook", "-i", "localhost,", "-c", "local", str(book)], env=env, cwd=where)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    said = " ".join(out.split())
    assert "gpulab.homelab.gpulab_wait has been deprecated. Use gpulab.homelab.wait" in said, out
    assert (
        '"gpulab.homelab.gpulab_hami_problems_text" has been deprecated. Use gpulab.homelab.hami_problems_text'
        in said
    )
    # the module's action plugin answered under the old name too: it ran the command it wraps
    assert re.search(r"TASK \[Old module\] \*+\nchanged: \[localhost\]", proc.stdout), out


def test_a_playbook_of_one_s_own_imports_the_installed_site_and_stage_playbooks(installed, tmp_path):
    """`import_playbook: gpulab.homelab.site` (and a stage, gpulab.homelab.vms) from a playbook outside the
    collection: Ansible parses every imported play, its roles and their static tasks, so each module, role and
    playbook they name must resolve in the installed copy alone (the demo's inventory gives the groups)."""
    env, _ = installed
    mine = tmp_path / "mine.yml"
    mine.write_text(
        yaml.safe_dump(
            [
                {"name": "My lab, every stage", "ansible.builtin.import_playbook": f"{FQCN}.site"},
                {"name": "Its VMs again", "ansible.builtin.import_playbook": f"{FQCN}.vms"},
            ]
        )
    )
    inventory = ROOT / "inventory" / "demo"
    proc = run([BIN / "ansible-playbook", "-i", inventory, mine, "--list-tasks"], env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[ERROR]" not in out and "couldn't resolve" not in out, out
    # the plays of the collection's playbooks, their roles' tasks by full name
    assert "play #1 (localhost): Preflight | validate the whole lab definition" in out, out
    for listed in ("gpulab.homelab.pve_vms : ", "gpulab.homelab.k3s_server : ", "gpulab.homelab.hami : "):
        assert listed in out, listed


def test_requires_ansible_is_the_ansible_core_range_of_pyproject():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    (core,) = [d for d in PYPROJECT["project"]["dependencies"] if re.match(r"ansible-core\b", d)]
    assert SpecifierSet(runtime["requires_ansible"]) == SpecifierSet(core.removeprefix("ansible-core"))


def test_the_pve_action_group_is_every_module_with_the_pve_connection_options():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
    with_connection = set()
    for module in MODULES:
        tree = ast.parse((ROOT / "plugins" / "modules" / f"{module}.py").read_text())
        (doc,) = [
            n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "DOCUMENTATION" for t in n.targets)
        ]
        if f"{FQCN}.pve" in (yaml.safe_load(doc).get("extends_documentation_fragment") or []):
            with_connection.add(module)
    assert with_connection and set(runtime["action_groups"]["pve"]) == with_connection


def test_module_defaults_of_the_pve_group_give_a_pve_module_its_connection(tmp_path):
    """From the checkout (ansible.cfg's collections_path holds it as gpulab.homelab), a task that names the
    module by its full name takes the connection of `group/gpulab.homelab.pve`: its request goes to that URL
    (a closed port here), where without the defaults the module says the URL is missing."""
    task = {"name": "Read the node", f"{FQCN}.pve_info": {"node": "pve"}}
    defaults = {"api_url": "https://127.0.0.1:9", "api_token_id": "u@pve!t", "api_token_secret": "s3cret"}
    defaults |= {"api_retries": 0, "api_timeout": 5}

    def play(module_defaults):
        playbook = tmp_path / "defaults.yml"
        play = {
            "hosts": "localhost",
            "gather_facts": False,
            "module_defaults": module_defaults,
            "tasks": [task],
        }
        playbook.write_text(yaml.safe_dump([play]))
        env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
        cmd = [BIN / "ansible-playbook", "-i", "localhost,", "-c", "local", "--check", playbook]
        proc = run(cmd, env=env, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "s3cret" not in proc.stdout
        return proc.stdout

    assert "missing required arguments: api_url" in play({})
    with_defaults = play({f"group/{FQCN}.pve": defaults})
    assert "127.0.0.1:9" in with_defaults and "missing required arguments" not in with_defaults, with_defaults


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python without the engine: a virtualenv of this Python with nothing installed."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    proc = run([sys.executable, "-m", "venv", "--without-pip", where])
    assert proc.returncode == 0, proc.stderr
    python = where / "bin" / "python"
    assert run([python, "-c", "import gpulab"]).returncode != 0, "the bare virtualenv has the engine"
    return python


def test_a_module_run_by_a_python_without_the_engine_fails_with_the_missing_library_message(
    bare_python, tmp_path
):
    """A controller module runs as any module, its own Python; with a Python that lacks the engine as the host's
    interpreter, it fails with missing_required_lib's message."""
    playbook = tmp_path / "no_engine.yml"
    task = {
        "name": "Plan the workloads",
        "gpulab.homelab.hami_workloads": {"engines": [], "gpus_by_node": {}},
    }
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    interpreter = f"ansible_python_interpreter={bare_python}"
    proc = run(
        [BIN / "ansible-playbook", "-i", "localhost,", "-c", "local", playbook, "-e", interpreter],
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert MISSING in proc.stdout and "requirements.txt" in proc.stdout, proc.stdout
    assert str(bare_python) in proc.stdout  # the Python that lacks it is named
    assert "Traceback" not in proc.stdout.split('"exception"')[0]


def test_a_controller_without_the_engine_stops_with_the_missing_library_message(tmp_path):
    """ansible-playbook started by a Python that has ansible-core but not the engine: an action plugin that
    needs it (pve_vm's progress lines while it waits for the address) stops the run with the missing-library
    message, not an "Unexpected Exception"."""
    import ansible

    controller = tmp_path / "controller"
    assert run([sys.executable, "-m", "venv", "--without-pip", controller]).returncode == 0
    (site,) = (controller / "lib").glob("python3*/site-packages")
    # ansible-core's folder on the path; the engine's editable install (a .pth file there) is not read
    (site / "ansible_core.pth").write_text(f"{Path(ansible.__file__).parents[1]}\n")
    python = controller / "bin" / "python"
    assert run([python, "-c", "import ansible.cli"]).returncode == 0
    if run([python, "-c", "import gpulab"]).returncode == 0:
        pytest.skip("the engine is installed in ansible-core's own site-packages, not apart from it")
    playbook = tmp_path / "no_engine.yml"
    task = {
        "name": "Start the VM and wait for its address",
        "gpulab.homelab.pve_vm": {"node": "pve", "vmid": 100, "name": "vm-1", "wait_for_address": True},
    }
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    proc = run(
        [python, "-m", "ansible", "playbook", "-i", "localhost,", "-c", "local", playbook],
        env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert MISSING in out and "requirements.txt" in out and str(python) in out, out
    assert "Unexpected Exception" not in out and "Traceback" not in out, out


# The controller's plugins that import the engine (action and filter plugins and the action plugins' shared
# classes in plugin_utils; the lookup needs none).
PLUGINS_WITH_ENGINE = sorted(
    p
    for kind in ("action", "filter", "lookup", "plugin_utils")
    for p in (ROOT / "plugins" / kind).glob("[!_]*.py")
    if any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "gpulab")
        or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "gpulab" for a in n.names))
        for n in ast.walk(ast.parse(p.read_text()))
    )
)


def test_the_plugins_that_import_the_engine_are_found():
    kinds = {p.parent.name for p in PLUGINS_WITH_ENGINE}
    assert kinds == {"action", "filter", "plugin_utils"} and len(PLUGINS_WITH_ENGINE) > len(kinds)


@pytest.mark.parametrize("path", PLUGINS_WITH_ENGINE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_plugin_that_imports_the_engine_loads_without_it_and_names_it_when_used(path):
    """Imported through the collection as Ansible's plugin loader does, with `import gpulab` failing: the
    plugin loads (ansible-doc lists it, ansible-test's import test imports it), and each name it imported from
    the engine, called or read, raises AnsibleError with the missing-library message (through a playbook:
    test_a_controller_without_the_engine_stops_with_the_missing_library_message)."""
    name = f"ansible_collections.gpulab.homelab.plugins.{path.parent.name}.{path.stem}"
    loader = (
        "import sys, importlib, inspect; sys.modules['gpulab'] = None\n"
        "from ansible.errors import AnsibleError\n"
        "from ansible.plugins.loader import init_plugin_loader\n"
        f"init_plugin_loader([{str(ROOT / '.collections')!r}])\n"
        f"plugin = importlib.import_module({name!r})\n"
        "print('loaded')\n"
        "from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine\n"
        "for what, value in vars(plugin).items():\n"
        "    if isinstance(value, MissingEngine):\n"
        "        for use in (lambda: value(), lambda: value.anything):\n"
        "            try:\n"
        "                use()\n"
        "            except AnsibleError as err:\n"
        "                print(what, str(err).replace(chr(10), ' '))\n"
    )
    proc = run([sys.executable, "-c", loader], timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("loaded"), proc.stdout + proc.stderr
    used = proc.stdout.splitlines()[1:]
    assert used, "no name of the plugin stands for the engine"
    for line in used:
        assert MISSING in line and "requirements.txt" in line, line


def test_one_version_for_the_collection_its_engine_and_requirements_txt():
    version = PYPROJECT["project"]["version"]
    assert GALAXY["version"] == version
    wanted = [
        line.split("#", 1)[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.split("#", 1)[0].strip()
    ]
    assert f"{PYPROJECT['project']['name']}=={version}" in wanted


def test_every_changelog_fragment_uses_the_sections_of_the_changelog_config():
    config = yaml.safe_load((ROOT / "changelogs" / "config.yaml").read_text())
    sections = {name for name, _title in config["sections"]}
    sections |= {config["prelude_section_name"], config["trivial_section_name"]}
    fragments = sorted((ROOT / "changelogs" / config["notesdir"]).glob("*.y*ml"))
    assert fragments
    for fragment in fragments:
        entries = yaml.safe_load(fragment.read_text())
        assert entries and set(entries) <= sections, fragment.name
        for section, lines in entries.items():
            if section == config["prelude_section_name"]:
                assert isinstance(lines, str), fragment.name
            else:
                assert lines and all(isinstance(line, str) for line in lines), (fragment.name, section)


def test_the_collection_s_playbooks_and_roles_call_its_plugins_and_roles_by_full_name():
    """What an installed copy runs (playbooks/, roles/) names gpulab's modules, filters, lookups and roles as
    gpulab.homelab.<name>: a short name resolves only in a checkout (ansible.cfg's plugin and role paths)."""
    # one-word names (files, units, wait) are also option names; ansible.cfg resolves no short name anyway
    modules = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("[!_]*.py") if "_" in p.stem)
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    filters = sorted(yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["plugin_routing"]["filter"])
    filters = [name.removeprefix("gpulab_") for name in filters]
    short = [
        re.compile(rf"^\s*(?:- )?({'|'.join(modules)}):", re.M),  # a task calling a module
        re.compile(rf"^\s*module: ({'|'.join(modules)})\s*$", re.M),  # wait's module option
        re.compile(rf"\|\s*({'|'.join(filters)})\b"),  # a filter
        re.compile(r"""(?:query|lookup)\(\s*['"](reach)"""),  # a lookup
        re.compile(rf"^\s*- role: ({'|'.join(roles)})\s*$", re.M),
        re.compile(rf"_role:\n\s+name: ({'|'.join(roles)})\s*$", re.M),
    ]
    files = [
        ROOT / "site.yml",
        *sorted((ROOT / "playbooks").rglob("*.yml")),
        *sorted((ROOT / "roles").rglob("*.yml")),
    ]
    files += sorted((ROOT / "roles").rglob("*.j2"))
    found = [
        f"{path.relative_to(ROOT)}: {m.group(1)}"
        for path in files
        for pattern in short
        for m in pattern.finditer("\n".join(line.split(" #")[0] for line in path.read_text().splitlines()))
    ]
    assert len(files) > 50 and not found, found


def test_the_removed_units_module_is_a_tombstone_that_names_the_builtin():
    """units (several systemd units in one call) saved the demo's no-op less than a batch module has to save to
    stay (files.py's docstring states the rule): it is gone, both of its names say which builtin does its work,
    and no task of an installed copy calls it."""
    assert not (ROOT / "plugins" / "modules" / "units.py").exists()
    modules = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["plugin_routing"]["modules"]
    for name in ("units", "gpulab_units"):
        tombstone = modules[name]["tombstone"]
        assert tombstone["removal_version"] == "0.2.0", name  # the release after 0.1.0
        assert "ansible.builtin.systemd_service" in tombstone["warning_text"], name
    tasks = [ROOT / "site.yml", *(ROOT / "playbooks").rglob("*.yml"), *(ROOT / "roles").rglob("*.yml")]
    calls = re.compile(r"^\s*(?:- )?(?:gpulab\.homelab\.)?(?:gpulab_)?units:\s*$", re.M)
    assert [str(p.relative_to(ROOT)) for p in tasks if calls.search(p.read_text())] == []


def test_a_batch_module_that_stays_states_what_it_saves_and_the_threshold():
    """files stays because the builtins cost the demo's no-op re-run more than the threshold: its docstring says
    by how much, measured with scripts/benchmark.py, so the next reader can measure again."""
    doc = ast.get_docstring(ast.parse((ROOT / "plugins" / "modules" / "files.py").read_text())) or ""
    assert re.search(r"more than (\d+(\.\d+)?) s \(the threshold\)", doc), doc
    assert "scripts/benchmark.py" in doc and re.search(r"builtins cost (\d+(\.\d+)?) s", doc), doc
    threshold = float(re.search(r"more than (\d+(\.\d+)?) s", doc).group(1))
    assert float(re.search(r"builtins cost (\d+(\.\d+)?) s", doc).group(1)) > threshold
