"""The plays on the controller run on Ansible's implicit localhost, and say nothing of its connection.

A play's `connection: local`, or an `ansible_python_interpreter` in its vars, applies to every task of the
play, the tasks delegated to a Proxmox node or a VM too: they would run on the controller (a file meant for
the node written here) or look for the controller's Python on the node. The implicit localhost already
has the local connection and the controller's Python.
"""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_no_play_sets_the_connection_or_the_python_of_all_its_tasks(path):
    for play in yaml.safe_load(path.read_text()) or []:
        if "import_playbook" in play:
            continue
        assert "connection" not in play, f"{path.name}: play {play.get('name')!r} sets connection"
        assert "ansible_python_interpreter" not in (play.get("vars") or {}), (
            f"{path.name}: {play.get('name')!r}"
        )
