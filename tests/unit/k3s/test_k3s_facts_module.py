"""plugins/modules/k3s_facts.py: the release it reads from `k3s --version` (roles k3s_server and k3s_agent,
playbooks/upgrade.yml)."""

from importlib import util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "plugins" / "modules" / "k3s_facts.py"
_SPEC = util.spec_from_file_location("gpulab_k3s_facts_module", _PATH)
_MOD = util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MOD)


def test_the_release_is_the_first_lines_third_word():
    assert _MOD.parse_version("k3s version v1.33.5+k3s1 (8fbbf6e0)\ngo version go1.24.6\n") == "v1.33.5+k3s1"
    assert _MOD.parse_version("") == "" and _MOD.parse_version("bash: k3s: command not found") == ""
