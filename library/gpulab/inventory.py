"""Read an Ansible inventory folder the way ansible-playbook does, for `gpulab plan`.

Only the variables of the lab definition are templated, one at a time, so a secret that is
never asked for is never rendered. `defined_names` lists the variables the inventory itself sets for a
host (the preflight action plugin uses it too), so a misspelt one can be refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpulab.labdef import GROUPS


def defined_names(inventory: Any, loader: Any, sources: list[str]) -> Callable[[str], set[str]]:
    """`names(host)`: the variables an InventoryManager's sources (`sources`, those it was built from) set for a
    host (its inventory file, group_vars and host_vars, its groups' too), without facts, extra vars or
    Ansible's magic variables."""
    from ansible.vars.plugins import get_vars_from_inventory_sources

    def names(host_name: str) -> set[str]:
        host = inventory.get_host(host_name)
        if host is None:
            return set()
        groups = host.get_groups()
        found = set(host.vars)
        for group in groups:
            found |= set(group.get_vars())
        # the vars plugins (host_group_vars) read group_vars/ and host_vars/ beside each source
        return found | set(get_vars_from_inventory_sources(loader, sources, [*groups, host], "task"))

    return names


def load(
    inventory: str | Path | list[str | Path],
    vault_password_file: str | None = None,
    vault_password: str | None = None,
) -> tuple[dict, Callable[[str, str], Any], Callable[[str], set[str]]]:
    """The inventory's groups, `hostvar(host, name)` and `names(host)`. An encrypted vault is opened with
    `vault_password` (typed: `gpulab plan --ask-vault-pass`), else the password file (`--vault-password-file`,
    else Ansible's own ANSIBLE_VAULT_PASSWORD_FILE)."""
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret, get_file_vault_secret
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if AnsibleCollectionConfig.collection_finder is None:  # not yet in this process (ansible-playbook's is)
        init_plugin_loader()  # lookups such as env in the inventory need the plugins
    loader = DataLoader()
    pwfile = vault_password_file or C.DEFAULT_VAULT_PASSWORD_FILE
    if vault_password is not None:
        loader.set_vault_secrets([("default", VaultSecret(vault_password.encode()))])
    elif pwfile:
        secret = get_file_vault_secret(filename=str(pwfile), loader=loader)
        secret.load()
        loader.set_vault_secrets([("default", secret)])
    sources = [str(i) for i in inventory] if isinstance(inventory, (list, tuple)) else [str(inventory)]
    inv = InventoryManager(loader=loader, sources=sources)
    vm = VariableManager(loader=loader, inventory=inv)
    groups = {g: [h.name for h in inv.groups[g].get_hosts()] if g in inv.groups else [] for g in GROUPS}
    cache: dict[str, dict] = {}

    def hostvar(host: str, name: str) -> Any:
        if host not in cache:
            h = inv.get_host(host)
            cache[host] = vm.get_vars(host=h, include_hostvars=False) if h else {}
        variables = cache[host]
        if name not in variables:
            return None
        templar = Templar(loader=loader, variables=variables)
        try:
            return templar.template(variables[name])
        except AnsibleError:
            return None  # undefined (e.g. a vault variable not given): reported as not set

    return groups, hostvar, defined_names(inv, loader, sources)


def of_run(loader: Any, sources: list[str], limit: str | None = None) -> Any:
    """The run's inventory read again from its sources (the magic variable ansible_inventory_sources) with the
    run's loader (its vault secrets), limited as the run is (ansible_limit): what an action plugin reads
    through public API instead of the run's own InventoryManager, which Ansible does not hand to plugins."""
    from ansible.inventory.manager import InventoryManager

    inv = InventoryManager(loader=loader, sources=[str(s) for s in sources])
    if limit:
        inv.subset(limit)
    return inv
