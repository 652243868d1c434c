#!/usr/bin/python
"""Ansible module pve_download: a file PVE downloads itself, checked against its checksum."""

DOCUMENTATION = r"""
module: pve_download
short_description: Have Proxmox VE download an OS image or ISO and check its SHA-256 or SHA-512
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Calls PVE's C(download-url) with the checksum, so the node fetches the file itself and refuses it when
    the checksum does not match (the task fails with PVE's message, such as C(checksum mismatch)).
  - Idempotent without a transfer. A file of that name already in the storage counts as done; with
    O(verify_existing=true), PVE checks it against the checksum instead (no transfer when it matches).
  - Waits for the task, or with O(wait=false) only starts it and returns RV(upid); a later call with
    O(upid) reports how far it got (RV(progress), RV(bytes), RV(total), RV(rate)), read from the task log
    that PVE's C(wget --progress=dot:giga) writes.
  - In a play, a task with O(wait=true) is one task that says how far the download has got; its action
    plugin starts the download, looks at the task every O(poll_interval) seconds and prints a line each time
    through Ansible's display (the bytes so far, the total, the rate and the seconds waited), with no retry
    lines, until it ends or O(timeout) passes. A file that is already there returns at once, without a line.
attributes:
  diff_mode:
    support: full
    details: Shows whether the file is in the storage, before and after, and the checksum it is held to.
extends_documentation_fragment:
  - gpulab.homelab.pve
  - gpulab.homelab.attributes
options:
  node:
    description: The node that downloads.
    type: str
    required: true
  storage:
    description: A file-based storage with the content type enabled (for V(import), such as V(local) with C(import) added).
    type: str
    required: true
  url:
    description: Where to download from (C(http) or C(https)).
    type: str
    required: true
  filename:
    description:
      - The file name in the storage; PVE normalises it (directories dropped, other characters than
        C([a-zA-Z0-9_.-]) turned into C(_)).
      - For O(content=import) it must end with C(.qcow2), C(.raw), C(.vmdk) or C(.ova); Ubuntu's cloud
        C(.img) is qcow2, so name it C(.qcow2).
    type: str
    required: true
  content:
    description: What the file is.
    type: str
    choices: [iso, import, vztmpl]
    default: iso
  checksum:
    description: Expected checksum (hex).
    type: str
  checksum_algorithm:
    description: Checksum algorithm.
    type: str
    choices: [md5, sha1, sha224, sha256, sha384, sha512]
    default: sha256
  verify_certificates:
    description: Let PVE verify the download server's TLS certificate.
    type: bool
    default: true
  verify_existing:
    description: Ask PVE to check an existing file against O(checksum) (a write request, no transfer when it matches).
    type: bool
    default: false
  wait:
    description: Wait for the download to end.
    type: bool
    default: true
  upid:
    description: A download task started earlier (RV(upid)); the module then only reports its state.
    type: str
  timeout:
    description: Seconds to wait for PVE's download task (with O(wait=true)) before the module fails.
    type: int
    default: 3600
  poll_interval:
    description: Seconds between two looks at the running download (and two progress lines) in a play.
    type: int
    default: 5
"""

EXAMPLES = r"""
# In a play the connection comes from the inventory (pve_api_* of node pve's host in group proxmox).
- name: Ubuntu 24.04 cloud image for import, checked against its SHA-256
  gpulab.homelab.pve_download:
    node: pve
    storage: local
    content: import
    url: https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img
    filename: noble-server-cloudimg-amd64.qcow2
    checksum: d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac
    checksum_algorithm: sha256

- name: The installer ISO, with a progress line every 10 s
  gpulab.homelab.pve_download:
    node: pve
    storage: local
    url: https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso
    filename: ubuntu-24.04.3-live-server-amd64.iso
    checksum: "{{ iso_sha256 }}"
    poll_interval: 10
    timeout: 3600
"""

RETURN = r"""
requests: {description: 'API requests this run sent (reads, writes).', returned: always, type: dict}
volid:
  description: The volume ID of the file, such as C(local:import/noble-server-cloudimg-amd64.qcow2).
  returned: always
  type: str
present_before:
  description: Whether the file was in the storage before.
  returned: always
  type: bool
transferred:
  description: Whether PVE transferred the file in this run.
  returned: always
  type: bool
upid:
  description: The download task (empty when none was started).
  returned: always
  type: str
done:
  description: Whether the task has ended (always true unless O(wait=false) or O(upid) polling).
  returned: always
  type: bool
progress:
  description: Percentage PVE logged last (null when unknown).
  returned: always
  type: float
bytes:
  description: Bytes downloaded so far, from the task log (with O(upid), and at the end of a wait in a play).
  returned: success
  type: int
total:
  description: The file's size as the server gave it (null when it gave none).
  returned: success
  type: int
rate:
  description: The rate of the last progress line of the task log, in bytes per second (null before the first).
  returned: success
  type: int
log:
  description: The task's last log lines.
  returned: always
  type: list
  elements: str
msg:
  description: What happened, in words.
  returned: always
  type: str
"""

from ansible_collections.gpulab.homelab.plugins.module_utils import pve  # noqa: E402
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    node=dict(type="str", required=True),
    storage=dict(type="str", required=True),
    url=dict(type="str", required=True),
    filename=dict(type="str", required=True),
    content=dict(type="str", choices=["iso", "import", "vztmpl"], default="iso"),
    checksum=dict(type="str"),
    checksum_algorithm=dict(
        type="str", choices=["md5", "sha1", "sha224", "sha256", "sha384", "sha512"], default="sha256"
    ),
    verify_certificates=dict(type="bool", default=True),
    verify_existing=dict(type="bool", default=False),
    wait=dict(type="bool", default=True),
    upid=dict(type="str"),
    timeout=dict(type="int", default=3600),
    poll_interval=dict(type="int", default=5),
    **pve.CONNECTION,
)
RULES = pve.CONNECTION_RULES


def main():
    run_module(ARGUMENT_SPEC, RULES, "pve_download")  # AnsibleModule, then gpulab.tasks.pve_download


if __name__ == "__main__":
    main()
