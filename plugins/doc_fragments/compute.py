"""Documentation of what the gpulab modules that only compute share (fragment `gpulab.homelab.compute`)."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
requirements:
  - gpulab, the project's engine, in the controller's Python (requirements.txt; C(make venv) in a checkout)
attributes:
  check_mode:
    support: full
    details: The module only computes; it runs the same in check mode.
  diff_mode:
    support: none
notes:
  - Runs on the controller (delegate it to V(localhost)) and imports the gpulab package. It writes nothing
    and always returns C(changed=false).
"""
