"""The engine (the gpulab distribution) as the collection's controller plugins import it.

The action, filter and lookup plugins run the engine on the controller. A controller whose Python lacks it
still loads them (ansible-doc lists them, ansible-test's import test imports them), and each name the plugin
imported from gpulab is then a `MissingEngine`: the first use of it raises Ansible's missing-library message,
so the task or the template that needs the engine fails with what to install and where.
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.module_utils.basic import missing_required_lib

ENGINE = "gpulab (the project's engine: pip install -r requirements.txt, or make venv in a checkout)"


def missing_engine_message() -> str:
    """Ansible's missing-library message for the engine, on the controller."""
    return missing_required_lib(ENGINE, reason="on the controller")


class MissingEngine:
    """Stands for what a plugin imports from gpulab when the import failed (`error`): calling it or reading
    any attribute of it raises AnsibleError with the missing-library message."""

    def __init__(self, error: ImportError):
        self.__dict__["_error"] = error

    def _fail(self):
        raise AnsibleError(missing_engine_message()) from self.__dict__["_error"]

    def __getattr__(self, name):
        self._fail()

    def __call__(self, *args, **kwargs):
        self._fail()
