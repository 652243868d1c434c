"""The docs' generated parts are current (`make docs`): the variable tables of docs/variables.md, each role's
README, the command blocks of README.md and docs/*.md, the data-flow picture; README stays a short front door."""

import re
from pathlib import Path

import yaml

from gpulab import docs, labdef

ROOT = Path(__file__).resolve().parents[3]
STALE = "out of date: run `make docs`"


def test_variable_tables_are_current():
    text = (ROOT / docs.VARIABLES).read_text()
    section = text.split(docs.START, 1)[1].split(docs.END, 1)[0].strip()
    assert section == docs.render(ROOT), f"{docs.VARIABLES} is {STALE}"


def test_every_lab_variable_is_documented():
    text = (ROOT / docs.VARIABLES).read_text()
    for var in labdef.CATALOGUE:
        assert var.doc, var.name
        assert f"| `{var.name}` |" in text


def test_every_role_default_is_in_its_argument_specs():
    for defaults in ROOT.glob("roles/*/defaults/main.yml"):
        role = defaults.parent.parent
        names = set((yaml.safe_load(defaults.read_text()) or {}).keys())
        spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
        options = set(spec["argument_specs"]["main"].get("options", {}))
        assert names <= options, f"{role.name}: defaults not in argument_specs: {sorted(names - options)}"


def test_every_role_has_a_current_generated_readme():
    roles = docs.roles(ROOT)
    assert len(roles) == len(list(ROOT.glob("roles/*/tasks/main.yml")))
    for role in roles:
        text = (role / "README.md").read_text()
        assert docs.ROLE_START in text, f"{role.name}/README.md has no generated part: run `make docs`"
        block = text.split(docs.ROLE_START, 1)[1].split(docs.ROLE_END, 1)[0].strip()
        assert block == docs.render_role_readme(role), f"{role.name}/README.md is {STALE}"


def test_a_role_readme_lists_each_option_and_shows_an_example_play():
    role = ROOT / "roles" / "k3s_agent"
    text = docs.render_role_readme(role)
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]
    for name in spec["options"]:
        assert f"| `{name}` |" in text
    play = yaml.safe_load(text.split("## Example play", 1)[1].split("```yaml", 1)[1].split("```", 1)[0])
    entry = play[-1]["roles"][0]
    assert entry["role"] == "gpulab.homelab.k3s_agent"
    required = {n for n, o in spec["options"].items() if o.get("required")}
    assert set(entry["vars"]) == required


def test_the_command_blocks_of_the_docs_are_current():
    blocks = docs.load_commands(ROOT)
    used = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for name in re.findall(r"<!-- commands:([\w-]+) -->", text):
            start, end = f"<!-- commands:{name} -->", f"<!-- /commands:{name} -->"
            shown = text.split(start, 1)[1].split(end, 1)[0].strip()
            assert shown == docs.render_commands(blocks[name]), f"{path.name}: block {name} is {STALE}"
            used.add(name)
    assert used == set(blocks), f"blocks of commands.yml no page shows: {sorted(set(blocks) - used)}"


def test_a_long_root_command_is_broken_as_the_shell_joins_it_back():
    block = docs.load_commands(ROOT)["pveum"]
    rendered = docs.render_commands(block)
    assert all(len(line) <= docs.WIDTH for line in rendered.splitlines())
    joined = rendered.replace("\\\n", "")
    assert f"# {block['commands'][0]['run']}\n" in joined


def test_the_data_flow_picture_is_current():
    assert (ROOT / docs.DATA_FLOW).read_text() == docs.render_data_flow(), f"{docs.DATA_FLOW} is {STALE}"
    assert "data-flow.svg" in (ROOT / "docs" / "architecture.md").read_text()


def test_the_stage_order_picture_is_current_and_follows_site_yml(tmp_path):
    assert (ROOT / docs.STAGE_ORDER).read_text() == docs.render_stage_order(ROOT), (
        f"{docs.STAGE_ORDER} is {STALE}"
    )
    assert "stage-order.svg" in (ROOT / "docs" / "architecture.md").read_text()
    titles = [s["title"] for s in docs.site_stages(ROOT)]
    assert (
        titles[:3] == ["Stage 0, preflight", "Stage 1, host", "Stage 2, vms"]
        and titles[-1] == "The lab table"
    )
    # a stage site.yml imports is drawn where it runs, from its own plays
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "site.yml").write_text(
        "- name: Stage 1, one\n  ansible.builtin.import_playbook: one.yml\n"
        "- name: Stage 2, two (opt-in, --tags two)\n  ansible.builtin.import_playbook: two.yml\n"
        "- name: Release\n  ansible.builtin.import_playbook: run_lock_release.yml\n"
    )
    (tmp_path / "playbooks" / "one.yml").write_text(
        "- name: Preflight | checks\n  hosts: localhost\n- name: Stage 1, one | the first step\n  hosts: vms\n"
    )
    (tmp_path / "playbooks" / "two.yml").write_text(
        "- name: Stage 2, two | the second\n  hosts: \"{{ 'localhost:!localhost' if x is defined else 'localhost' }}\"\n"
    )  # a play that matches no host when imported with x: drawn where it runs
    assert docs.site_stages(tmp_path) == [
        {"title": "Stage 1, one", "opt_in": False, "hosts": ["each VM"], "does": ["the first step"]},
        {"title": "Stage 2, two", "opt_in": True, "hosts": ["the controller"], "does": ["the second"]},
    ]
    svg = docs.render_stage_order(tmp_path)
    assert svg.index("Stage 1, one") < svg.index("Stage 2, two") and 'stroke-dasharray="6 4"' in svg


def test_readme_is_a_short_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    first_screen = "\n".join(lines[:40])
    assert "$ make demo" in first_screen and "$ make test" in first_screen


def test_the_docs_link_only_to_files_that_exist():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *ROOT.glob("roles/*/README.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"
