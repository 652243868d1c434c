"""The attributes every gpulab module documents (fragment `gpulab.homelab.attributes`): what each one
means, and the support most modules have. A module, or a family fragment listed before this one
(compute, pve, reads), writes only the support and details that differ: the first to give
an attribute's key wins, this fragment fills in the rest."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Whether a run with C(--check) says what the module would change without changing it.
    support: full
  diff_mode:
    description: Whether a run with C(--diff) shows what the module changed (or would change), before and after.
    support: none
  platform:
    description: The systems the module runs on or against.
    support: full
    platforms: posix
"""
