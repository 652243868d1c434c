"""The Proxmox VE connection options every PVE module takes (pve_vm, pve_info, pve_download, pve_pci_mapping,
lab_table), once: each module spreads CONNECTION into its ARGUMENT_SPEC and passes CONNECTION_RULES to
AnsibleModule, as the doc fragment gpulab.homelab.pve documents them. `make docs` writes the lines below from the
engine's gpulab.pve.connection; tests/unit/test_module_docs.py checks they are in step.
"""

from __future__ import annotations

from ansible.module_utils.basic import env_fallback

# generated from gpulab.pve.connection by `make docs`: edit its OPTIONS, not these lines
CONNECTION = dict(
    api_url=dict(type="str", required=True, fallback=(env_fallback, ["PVE_API_URL"])),
    api_token_id=dict(type="str", no_log=False, fallback=(env_fallback, ["PVE_API_TOKEN_ID"])),
    api_token_secret=dict(type="str", no_log=True, fallback=(env_fallback, ["PVE_API_TOKEN_SECRET"])),
    api_user=dict(type="str", fallback=(env_fallback, ["PVE_API_USER"])),
    api_password=dict(type="str", no_log=True, fallback=(env_fallback, ["PVE_API_PASSWORD"])),
    api_validate_certs=dict(type="bool", default=True, fallback=(env_fallback, ["PVE_API_VALIDATE_CERTS"])),
    api_ca_file=dict(type="path", fallback=(env_fallback, ["PVE_API_CA_FILE"])),
    api_fingerprint=dict(type="str", no_log=False, fallback=(env_fallback, ["PVE_API_FINGERPRINT"])),
    api_timeout=dict(type="int", default=30),
    api_retries=dict(type="int", default=3),
)
CONNECTION_RULES = dict(
    required_together=[["api_token_id", "api_token_secret"], ["api_user", "api_password"]],
    required_one_of=[["api_token_id", "api_user"]],
    mutually_exclusive=[["api_token_id", "api_user"], ["api_ca_file", "api_fingerprint"]],
)
# end of the generated argument spec
