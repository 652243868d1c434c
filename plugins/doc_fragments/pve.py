"""Documentation of what every gpulab PVE module shares (fragment `gpulab.homelab.pve`): the connection options,
check mode (gpulab.tasks gives it to each) and the request counts it returns."""


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
  - In a play, give the connection once for every PVE module with C(module_defaults) for the action group
    C(group/gpulab.homelab.pve); gpulab's stage playbooks set it from preflight's fact C(gpulab_pve_api)
    (O(api_url) from C(pve_api_url), O(api_token_id) from C(pve_api_token_id) and so on), with its secret
    from the inventory (C(playbooks/vars/pve_api.yml)).
  - An option the task gives wins over the group's. The environment variables apply to what neither
    gives (and to the module run outside a play).
"""
