"""Documentation of what the gpulab modules that only read their host share (fragment `gpulab.homelab.reads`)."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: The module only reads; it runs the same in check mode.
  diff_mode:
    support: none
notes:
  - Runs on the managed host with the Python standard library only, and changes nothing there.
"""
