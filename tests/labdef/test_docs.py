"""README documents every variable: its tables are generated and must be current."""

from pathlib import Path

from gpulab import docs, labdef

ROOT = Path(__file__).resolve().parents[2]


def test_readme_variable_tables_are_current():
    text = (ROOT / "README.md").read_text()
    section = text.split(docs.START, 1)[1].split(docs.END, 1)[0].strip()
    assert section == docs.render(ROOT), "README.md is out of date: run `make docs`"


def test_every_lab_variable_is_documented():
    text = (ROOT / "README.md").read_text()
    for var in labdef.CATALOGUE:
        assert var.doc, var.name
        assert f"| `{var.name}` |" in text


def test_every_role_default_is_in_its_argument_specs():
    import yaml

    for defaults in ROOT.glob("roles/*/defaults/main.yml"):
        role = defaults.parent.parent
        names = set((yaml.safe_load(defaults.read_text()) or {}).keys())
        spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
        options = set(spec["argument_specs"]["main"].get("options", {}))
        assert names <= options, f"{role.name}: defaults not in argument_specs: {sorted(names - options)}"
