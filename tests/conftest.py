"""For every test: the modules' shared code (plugins/module_utils) importable as Ansible ships it."""

from ansible_modules import use_module_utils

use_module_utils()
