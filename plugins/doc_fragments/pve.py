"""Documentation of what every gpulab PVE module shares (fragment `gpulab.homelab.pve`): the connection options,
check mode (gpulab.tasks gives it to each, in the worker and as a module) and the request counts it returns."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  api_url:
    description:
      - URL of the Proxmox VE API, such as V(https://pve.example:8006). A trailing C(/api2/json) is accepted.
      - Falls back to the environment variable E(PVE_API_URL).
    type: str
    required: true
  api_token_id:
    description:
      - API token ID, C(USER@REALM!TOKENID), such as V(root@pam!gpulab).
      - Give a token (O(api_token_id) and O(api_token_secret)) or a user and password, not both.
      - PVE refuses raw PCI devices (C(host=)) to every token, even one of root@pam; GPUs are then attached
        through a PCI resource mapping.
      - Falls back to E(PVE_API_TOKEN_ID).
    type: str
  api_token_secret:
    description:
      - Secret (UUID) of the API token. Falls back to E(PVE_API_TOKEN_SECRET).
    type: str
  api_user:
    description:
      - User for ticket (password) login, such as V(root@pam). Falls back to E(PVE_API_USER).
    type: str
  api_password:
    description:
      - Password of O(api_user). Falls back to E(PVE_API_PASSWORD).
    type: str
  api_validate_certs:
    description:
      - Verify the API's TLS certificate. Keep it on; for PVE's self-signed certificate use O(api_ca_file)
        or O(api_fingerprint).
      - Falls back to E(PVE_API_VALIDATE_CERTS).
    type: bool
    default: true
  api_ca_file:
    description:
      - CA bundle to verify the API's certificate with, such as a copy of the node's C(/etc/pve/pve-root-ca.pem).
      - Falls back to E(PVE_API_CA_FILE).
    type: path
  api_fingerprint:
    description:
      - SHA-256 fingerprint of the API's certificate (as PVE shows it under Node > System > Certificates).
        Only a certificate with exactly this fingerprint is accepted; the chain is not checked.
      - Falls back to E(PVE_API_FINGERPRINT).
    type: str
  api_timeout:
    description:
      - Seconds to wait for one HTTP answer.
    type: int
    default: 30
  api_retries:
    description:
      - How many times a request that failed with a 5xx answer or a connection reset is tried again (with
        backoff) before the module fails naming the call.
    type: int
    default: 3
requirements:
  - gpulab, the project's engine, in the controller's Python (requirements.txt; C(make venv) in a checkout)
attributes:
  check_mode:
    support: full
    details: Reads the API as a real run does and writes nothing.
notes:
  - Runs on the controller and needs the C(gpulab) Python package (requirements.txt, the project's virtualenv).
  - In a play, a task passes only its own options. Each connection option it leaves out comes from the
    inventory, through the module's action plugin (C(plugins/plugin_utils/pve_connection.py)) -
    O(api_url) from C(pve_api_url), O(api_token_id) from C(pve_api_token_id) and so on - of the host of
    group C(proxmox) whose C(pve_node) (or name) is the task's C(node) (for M(gpulab.homelab.pve_pci_mapping)
    the node of its first entry); the first host of C(proxmox) for a task without one; the task's own
    host when C(proxmox) has none of them.
  - An option the task gives wins, and the inventory's login and certificate check are then not mixed
    in (a task's token takes none of the inventory's user and password, its O(api_ca_file) none of its
    O(api_fingerprint)). The environment variables apply to what neither gives (and to the module run
    outside a play).
"""
