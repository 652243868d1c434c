"""The lab definition's validation: the reference lab passes, and each mistake gets its message."""

import pytest

from gpulab import labdef


def test_reference_lab_is_valid(inv):
    lab, problems = inv.check()
    assert problems == []
    assert set(lab.vms) == {"vm-1", "vm-2", "vm-gpu"}
    assert labdef.pinned_mib(lab.vms["vm-gpu"]) == 16384


def test_message_names_host_field_value_why_and_fix(inv):
    inv.hosts["vm-2"]["vm_id"] = 100
    [msg] = inv.messages()
    assert msg == ("vm-2: vm_id=100: already used by vm-1. Fix: give every VM its own vm_id.")


def _set(inv, host, **values):
    target = inv.globals if host == "all" else inv.hosts[host]
    for key, value in values.items():
        if value is KeyError:
            target.pop(key, None)
        else:
            target[key] = value


_IMAGE = {
    "url": "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
    "filename": "noble-server-cloudimg-amd64.qcow2",
    "checksum": "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac",
    "checksum_algorithm": "sha256",
    "storage": "local",
}

# (id, host, changes, expected fragment of the one message). Each is a distinct mistake a user can make.
BAD = [
    ("dup-vmid", "vm-2", {"vm_id": 100}, "vm-2: vm_id=100: already used by vm-1"),
    ("vmid-low", "vm-1", {"vm_id": 99}, "vm-1: vm_id=99: PVE VMIDs are 100-999999999"),
    ("vmid-high", "vm-1", {"vm_id": 1_000_000_000}, "vm-1: vm_id=1000000000: PVE VMIDs are 100-999999999"),
    ("dup-name", "vm-2", {"vm_name": "VM-1"}, "vm-2: vm_name='VM-1': the same name as vm-1"),
    ("bad-name", "vm-1", {"vm_name": "vm_1"}, "vm-1: vm_name='vm_1': PVE VM names are DNS labels"),
    (
        "bad-mac",
        "vm-1",
        {"vm_mac": "bc:24:11:zz:00:01"},
        "vm-1: vm_mac='bc:24:11:zz:00:01': not a MAC address",
    ),
    ("multicast-mac", "vm-1", {"vm_mac": "01:24:11:00:00:01"}, "a multicast MAC cannot be a NIC's address"),
    (
        "bad-pci",
        "pve",
        {"pve_gpus": [{"id": "rtx3090", "pci": "02:00.0"}]},
        "pve: pve_gpus[0].pci='02:00.0': not a PCI slot",
    ),
    (
        "bad-function",
        "pve",
        {"pve_gpus": [{"id": "rtx3090", "pci": "0000:02:00", "functions": ["0000:03:00.0"]}]},
        "pve: pve_gpus[0].functions='0000:03:00.0': not a function DDDD:BB:SS.F of slot 0000:02:00",
    ),
    (
        "bad-vendor-device",
        "pve",
        {"pve_gpus": [{"id": "rtx3090", "pci": "0000:02:00", "vendor_device": "10DE-2204"}]},
        "pve_gpus[0].vendor_device='10DE-2204': not VVVV:DDDD",
    ),
    (
        "address-outside",
        "vm-1",
        {"vm_address": "192.168.1.53"},
        "vm-1: vm_address='192.168.1.53': outside the router's subnet 192.168.100.0/24",
    ),
    (
        "address-router",
        "vm-1",
        {"vm_address": "192.168.100.1"},
        "vm-1: vm_address='192.168.100.1': that is the router's own address",
    ),
    (
        "address-twice",
        "vm-2",
        {"vm_address": "192.168.100.53"},
        "vm-2: vm_address='192.168.100.53': already given to vm-1",
    ),
    (
        "address-broadcast",
        "vm-1",
        {"vm_address": "192.168.100.255"},
        "the network or broadcast address of 192.168.100.0/24",
    ),
    (
        "address-node",
        "vm-1",
        {"vm_address": "192.168.100.5"},
        "vm-1: vm_address='192.168.100.5': that is the address of Proxmox node pve",
    ),
    (
        "address-malformed",
        "vm-1",
        {"vm_address": "192.168.100"},
        "vm-1: vm_address='192.168.100': not an IPv4 address",
    ),
    (
        "gpu-twice",
        "vm-2",
        {
            "vm_gpu": "rtx3090",
            "vm_machine": "q35",
            "vm_firmware": "ovmf",
            "vm_balloon": False,
            "vm_onboot": False,
        },
        "vm-gpu: vm_gpu='rtx3090': already given to vm-2",
    ),
    (
        "gpu-unknown",
        "vm-gpu",
        {"vm_gpu": "rtx4090"},
        "vm-gpu: vm_gpu='rtx4090': node pve has no GPU with that id",
    ),
    (
        "gpu-not-q35",
        "vm-gpu",
        {"vm_machine": "i440fx"},
        "vm-gpu: vm_machine='i440fx': a GPU VM needs PCI Express",
    ),
    (
        "gpu-not-ovmf",
        "vm-gpu",
        {"vm_firmware": "seabios"},
        "vm-gpu: vm_firmware='seabios': a GPU VM needs UEFI",
    ),
    (
        "gpu-balloon",
        "vm-gpu",
        {"vm_balloon": True},
        "vm-gpu: vm_balloon=True: ballooning cannot work with a passed-through device",
    ),
    (
        "gpu-onboot-display",
        "vm-gpu",
        {"vm_onboot": True},
        "vm-gpu: vm_onboot=True: GPU rtx3090 is the host's boot display",
    ),
    (
        "pinned-memory",
        "vm-1",
        {"vm_memory_mib": 12288},
        "pve: pve_memory_mib=31744: pinned memory 36864 MiB (vm-1 12288, vm-2 4096, vm-gpu 16384, host reserve 4096) exceeds it",
    ),
    (
        "disk-too-big",
        "vm-gpu",
        {"vm_disk_gb": 2000},
        "vm-gpu: vm_disk_gb=2000: larger than storage local-zfs (1700 GB)",
    ),
    (
        "router-kind",
        "isp-router",
        {"router_kind": "fritzbox"},
        "isp-router: router_kind='fritzbox': unknown router kind",
    ),
    (
        "router-password",
        "isp-router",
        {"router_password": KeyError},
        "isp-router: router_password=(not set): missing secret",
    ),
    (
        "token-secret",
        "all",
        {"pve_api_token_secret": ""},
        "all: pve_api_token_secret=(not set): missing secret for the API token",
    ),
    (
        "placeholder-secret",
        "all",
        {"pve_api_token_secret": "CHANGE-ME-token-uuid"},
        "the example placeholder was never replaced",
    ),
    (
        "no-login",
        "all",
        {"pve_api_token_id": KeyError, "pve_api_token_secret": KeyError},
        "no way to log in to the Proxmox API",
    ),
    (
        "password-missing",
        "all",
        {"pve_api_token_id": KeyError, "pve_api_user": "root@pam"},
        "all: pve_api_password=(not set): missing secret: password of root@pam",
    ),
    ("token-id-format", "all", {"pve_api_token_id": "gpulab-token"}, "a token id is USER@REALM!TOKENNAME"),
    (
        "url",
        "all",
        {"pve_api_url": "192.168.100.5:8006"},
        "all: pve_api_url='192.168.100.5:8006': not an https:// URL",
    ),
    ("fingerprint", "all", {"pve_api_fingerprint": "AB:CD"}, "not a SHA-256 fingerprint"),
    (
        "checksum",
        "all",
        {
            "gpulab_os_image": {
                "url": "https://x/y.img",
                "filename": "y.qcow2",
                "checksum": "abc",
                "storage": "local",
            }
        },
        "all: gpulab_os_image.checksum='abc': a sha256 checksum is 64 hex digits",
    ),
    (
        "checksum-algo",
        "all",
        {
            "gpulab_os_image": {
                "url": "https://x/y.img",
                "filename": "y",
                "checksum": "ab",
                "checksum_algorithm": "md5",
                "storage": "local",
            }
        },
        "PVE checks sha256 or sha512 here",
    ),
    ("unknown-node", "vm-1", {"vm_node": "pve2"}, "vm-1: vm_node='pve2': no Proxmox node of that name"),
    (
        "unknown-storage",
        "vm-1",
        {"vm_storage": "tank"},
        "vm-1: vm_storage='tank': node pve has no such storage",
    ),
    (
        "storage-no-images",
        "vm-1",
        {"vm_storage": "local"},
        "vm-1: vm_storage='local': this storage does not hold VM disks",
    ),
    (
        "machine",
        "vm-1",
        {"vm_machine": "pc"},
        "vm-1: vm_machine='pc': unknown value. Fix: use one of i440fx, q35",
    ),
    ("cores-over-threads", "vm-1", {"vm_cores": 32}, "vm-1: vm_cores=32: node pve has 20 threads"),
    ("memory-too-small", "vm-1", {"vm_memory_mib": 256}, "vm-1: vm_memory_mib=256: must be at least 512"),
    ("wrong-type", "vm-1", {"vm_cores": "four"}, "vm-1: vm_cores='four': expected a int, got str"),
    ("required-missing", "vm-1", {"vm_id": KeyError}, "vm-1: vm_id=(not set): required and not set"),
    (
        "balloon-floor",
        "vm-1",
        {"vm_balloon_min_mib": 8192},
        "vm-1: vm_balloon_min_mib=8192: above the VM's memory",
    ),
    (
        "no-ssh-key",
        "vm-1",
        {"vm_ssh_public_key": KeyError},
        "vm-1: vm_ssh_public_key=(not set): cloud-init needs a public key",
    ),
    (
        "subnet",
        "isp-router",
        {"router_subnet": "192.168.100.1/24"},
        "isp-router: router_subnet='192.168.100.1/24': not an IPv4 network",
    ),
    (
        "pool-reversed",
        "isp-router",
        {"router_dhcp_pool": {"start": "192.168.100.254", "end": "192.168.100.2"}},
        "start is after end",
    ),
    (
        "split-count",
        "all",
        {"hami_device_split_count": 0},
        "all: hami_device_split_count=0: must be at least 1",
    ),
    (
        "apt-lock-timeout-negative",
        "all",
        {"gpulab_apt_lock_timeout": -1},
        "all: gpulab_apt_lock_timeout=-1: must be at least 0",
    ),
    # --- names the lab definition and the roles do not know ---
    (
        "misspelt-vm-variable",
        "vm-1",
        {"vm_memroy_mib": 8192},
        "vm-1: vm_memroy_mib=8192: unknown variable: neither the lab definition nor a role reads it "
        "(did you mean vm_memory_mib?). Fix: rename it to vm_memory_mib, or remove it.",
    ),
    (
        "misspelt-node-variable",
        "pve",
        {"pve_gpu": [{"id": "rtx3090", "pci": "0000:02:00"}]},
        "(did you mean pve_gpus?). Fix: rename it to pve_gpus, or remove it.",
    ),
    (
        "misspelt-global-variable",
        "all",
        {"k3s_versoin": "v1.33.6+k3s1"},
        "all: k3s_versoin='v1.33.6+k3s1': unknown variable: neither the lab definition nor a role reads it "
        "(did you mean k3s_version?)",
    ),
    (
        "misspelt-role-variable",
        "vm-2",
        {"guest_base_packges": ["htop"]},
        "vm-2: guest_base_packges=['htop']: unknown variable: neither the lab definition nor a role reads it "
        "(did you mean guest_base_packages?)",
    ),
    # --- versions and URLs the run downloads ---
    (
        "k3s-version-bare",
        "all",
        {"k3s_version": "1.33.5"},
        "all: k3s_version='1.33.5': not a k3s release: k3s tags its releases v1.Y.Z+k3sN and downloads "
        "nothing else. Fix: write the release as k3s tags it, e.g. v1.36.2+k3s1",
    ),
    (
        "k3s-version-no-suffix",
        "all",
        {"k3s_version": "v1.33.5"},
        "all: k3s_version='v1.33.5': not a k3s release",
    ),
    (
        "k3s-version-not-1",
        "all",
        {"k3s_version": "v2.0.0+k3s1"},
        "all: k3s_version='v2.0.0+k3s1': not a k3s release",
    ),
    (
        "kube-vip-version-no-v",
        "all",
        {"k3s_server_kube_vip_version": "0.8.9"},
        "all: k3s_server_kube_vip_version='0.8.9': not a kube-vip release: its images are tagged vX.Y.Z, so "
        "this names an image that does not exist. Fix: write the release with its v, e.g. v1.2.2",
    ),
    (
        "chart-version-form",
        "all",
        {"hami_chart_version": "v2.10"},
        "all: hami_chart_version='v2.10': not a Helm chart version X.Y.Z",
    ),
    (
        "chart-version-without-facts",
        "all",
        {"hami_chart_version": "2.8.0"},
        "all: hami_chart_version='2.8.0': gpulab holds no key facts for this HAMi chart version",
    ),
    (
        "hami-values-key-the-pinned-chart-lacks",
        "all",
        {"hami_chart_version": "2.9.0", "hami_extra_values": {"devicePlugin": {"hostPID": True}}},
        "all: hami_extra_values='devicePlugin.hostPID': not a value of HAMi chart 2.9.0 (Helm would ignore it)",
    ),
    (
        "driver-branch",
        "all",
        {"nvidia_driver_branch": 58},
        "all: nvidia_driver_branch=58: not a driver branch",
    ),
    (
        "driver-flavour",
        "all",
        {"nvidia_driver_flavour": "desktop"},
        "all: nvidia_driver_flavour='desktop': unknown value. Fix: use one of server, server-open, open, \"\"",
    ),
    (
        "install-script-url",
        "vm-1",
        {"k3s_server_install_script_url": "get.k3s.io"},
        "vm-1: k3s_server_install_script_url='get.k3s.io': not an http(s) URL: the run downloads from it",
    ),
    (
        "toolkit-version",
        "vm-gpu",
        {"nvidia_container_toolkit_version": "latest"},
        "vm-gpu: nvidia_container_toolkit_version='latest': not a Debian package version",
    ),
    (
        "image-url-without-host",
        "all",
        {"gpulab_os_image": {**_IMAGE, "url": "https:///noble-server-cloudimg-amd64.img"}},
        "all: gpulab_os_image.url='https:///noble-server-cloudimg-amd64.img': PVE downloads from an http(s) URL",
    ),
    (
        "image-filename-extension",
        "all",
        {"gpulab_os_image": {**_IMAGE, "filename": "noble-server-cloudimg-amd64.img"}},
        "all: gpulab_os_image.filename='noble-server-cloudimg-amd64.img': PVE stores this download as content "
        "import, which must end with .qcow2",
    ),
    (
        "image-filename-folder",
        "all",
        {"gpulab_os_image": {**_IMAGE, "filename": "images/noble.qcow2"}},
        "all: gpulab_os_image.filename='images/noble.qcow2': PVE keeps only letters, digits",
    ),
    (
        "snippet-storage-id",
        "all",
        {"gpulab_snippet_storage": "Local Btrfs"},
        "all: gpulab_snippet_storage='Local Btrfs': not a PVE storage ID",
    ),
    (
        "download-check-proxy-https",
        "all",
        {"gpulab_download_check_proxy": "https://proxy.example:3128"},
        "all: gpulab_download_check_proxy='https://proxy.example:3128': not the http:// URL of a proxy",
    ),
]


@pytest.mark.parametrize(("host", "changes", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_mistake_has_its_message(inv, host, changes, expected):
    _set(inv, host, **changes)
    msgs = inv.messages()
    assert len(msgs) == 1, msgs
    assert expected in msgs[0]
    assert ". Fix: " in msgs[0]


def test_there_are_at_least_25_distinct_mistakes():
    assert len({b[3] for b in BAD}) >= 25


def test_k3s_without_server(inv):
    inv.groups["k3s_server"] = []
    assert inv.messages() == [
        "inventory: group k3s_server=(not set): k3s has no server. Fix: put one VM (e.g. vm-1) in group k3s_server."
    ]


def test_two_servers_are_refused_with_the_quorum_reason(inv):
    inv.groups["k3s_server"] = ["vm-1", "vm-2"]
    inv.groups["k3s_agent"] = ["vm-gpu"]
    [problem] = inv.check()[1]
    assert (problem.host, problem.field, problem.value) == ("inventory", "group k3s_server", ["vm-1", "vm-2"])
    assert "quorum is 2 of 2, so losing either server loses quorum" in problem.why
    assert problem.fix == "use 1 server (SQLite) or 3 (quorum 2 of 3 survives losing one)"


def _vm(inv, name, address, vm_id):
    inv.groups["vms"].append(name)
    inv.hosts[name] = {**inv.hosts["vm-2"], "vm_id": vm_id, "vm_address": address}


def test_other_even_server_counts_are_refused_and_odd_ones_pass(inv):
    for i, name in enumerate(("vm-3", "vm-4", "vm-5")):
        _vm(inv, name, f"192.168.100.{60 + i}", 110 + i)
    inv.hosts["pve"]["pve_memory_mib"] = 10**6
    inv.groups["k3s_server"] = ["vm-1", "vm-3", "vm-4", "vm-5"]
    [problem] = inv.check()[1]
    assert problem.why.startswith("4 servers: embedded etcd needs an odd number for a quorum (3 of 4")
    assert problem.fix == "use 3 or 5 servers"
    inv.groups["k3s_server"] = ["vm-1", "vm-3", "vm-4"]
    assert inv.messages() == []


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.0.0.7", "outside the router's subnet 192.168.100.0/24"),
        ("192.168.100.200", "inside the router's DHCP pool 192.168.100.2-192.168.100.254 and no reservation"),
        ("192.168.100.54", "that is the address of vm-2, which is not a k3s server (vm-1)"),
        ("192.168.100.1", "the network, broadcast or router address"),
        ("not a name!", "neither an IPv4 address nor a DNS name"),
    ],
)
def test_a_registration_address_the_lan_cannot_hold_is_refused(inv, address, why):
    inv.globals["k3s_registration_address"] = address
    [problem] = inv.check()[1]
    assert (problem.host, problem.field, problem.value) == ("all", "k3s_registration_address", address)
    assert problem.why.startswith(why), problem.why
    assert problem.fix


@pytest.mark.parametrize("address", ["192.168.100.53", "k3s.home.arpa", "api", "192.168.100.1x.lan"])
def test_a_reserved_server_address_a_vip_outside_the_pool_or_a_dns_name_passes(inv, address):
    inv.globals["k3s_registration_address"] = address
    assert inv.messages() == []


def test_a_vip_outside_the_pool_passes(inv):
    inv.hosts["isp-router"]["router_dhcp_pool"] = {"start": "192.168.100.100", "end": "192.168.100.199"}
    inv.globals["k3s_registration_address"] = "192.168.100.250"
    assert inv.messages() == []
    inv.globals["k3s_registration_address"] = "192.168.100.150"
    [msg] = inv.messages()
    assert msg.startswith("all: k3s_registration_address='192.168.100.150': inside the router's DHCP pool")
    assert "Fix: pick a free address of 192.168.100.0/24 outside 192.168.100.100-192.168.100.199" in msg


def test_k3s_node_not_a_vm(inv):
    inv.groups["k3s_agent"].append("laptop")
    [msg] = inv.messages()
    assert msg.startswith("laptop: group vms='laptop': a k3s node that is not a lab VM")


def test_host_in_server_and_agent(inv):
    inv.groups["k3s_agent"].append("vm-1")
    [msg] = inv.messages()
    assert "the host is both k3s server and agent" in msg


def test_no_router(inv):
    inv.groups["router"] = []
    [msg] = inv.messages()
    assert "no router in the inventory" in msg


def test_onboot_override_allows_boot_display(inv):
    inv.hosts["vm-gpu"].update(vm_onboot=True, vm_onboot_override_boot_display=True)
    assert inv.messages() == []


def test_ballooning_floor_lowers_pinned_memory(inv):
    # 12 GiB vm-1 is too much pinned; with a 2 GiB balloon floor it fits.
    inv.hosts["vm-1"].update(vm_memory_mib=12288)
    assert inv.messages()
    inv.hosts["vm-1"].update(vm_balloon_min_mib=2048)
    assert inv.messages() == []


def test_fourth_vm_does_not_fit_31_gib(inv):
    inv.groups["vms"].append("vm-3")
    inv.hosts["vm-3"] = {
        **inv.hosts["vm-1"],
        "vm_id": 103,
        "vm_address": "192.168.100.56",
    }
    [msg] = inv.messages()
    assert "pinned memory 32768 MiB" in msg


def test_several_problems_are_all_reported(inv):
    inv.hosts["vm-1"]["vm_id"] = 5
    inv.hosts["vm-2"]["vm_address"] = "10.0.0.1"
    inv.hosts["isp-router"]["router_kind"] = "nope"
    hosts = [m.split(":")[0] for m in inv.messages()]
    assert hosts == ["vm-1", "isp-router", "vm-2"]


def test_secret_values_never_appear_in_messages(inv):
    inv.globals["pve_api_token_secret"] = "CHANGE-ME-0123456789"
    msgs = inv.messages()
    assert msgs and all("0123456789" not in m for m in msgs)


def test_templated_numbers_and_bools_are_accepted(inv):
    inv.hosts["vm-1"].update(vm_cores="4", vm_onboot="true")
    assert inv.messages() == []


def test_plan_text_lists_vms_budget_gpu_and_addresses(inv):
    lab, _ = inv.check()
    text = labdef.plan_text(lab)
    assert "102   vm-gpu  8     16384 MiB fixed  200 GB local-zfs  q35/ovmf" in text
    assert (
        "pinned memory: 24576 MiB of VMs + 4096 MiB host reserve = 28672 of 31744 MiB (3072 MiB left)" in text
    )
    assert "GPU rtx3090 0000:02:00 (10de:2204, IOMMU group 13, boot display) -> vm-gpu" in text
    assert "reserve (MAC from PVE) -> 192.168.100.55 (vm-gpu)" in text
    assert "reserve (MAC of the node's LAN bridge port) -> 192.168.100.5 (node pve)" in text


def test_the_version_rules_are_written_once_and_the_role_defaults_keep_them():
    """The k3s and kube-vip version rules live in the catalogue (preflight checks them before any stage):
    no role or playbook matches those versions against a pattern of its own."""
    import re
    from pathlib import Path

    import yaml

    from gpulab.labdef.catalogue import K3S_VERSION_RE, KUBE_VIP_VERSION_RE

    root = Path(__file__).resolve().parents[3]
    copies = [
        f"{path.relative_to(root)}: {line.strip()}"
        for top in ("roles", "playbooks")
        for path in (root / top).rglob("*.yml")
        for line in path.read_text().splitlines()
        if re.search(r"(k3s_\w*version|kube_vip_version)\b.*\bis\s+(match|search|regex)\b", line)
    ]
    assert copies == []
    defaults = yaml.safe_load((root / "roles/k3s_server/defaults/main.yml").read_text())
    assert KUBE_VIP_VERSION_RE.match(defaults["k3s_server_kube_vip_version"])
    assert K3S_VERSION_RE.match("v1.33.5+k3s1") and not K3S_VERSION_RE.match("v0.10.2+k3s1")


def test_the_pins_a_first_time_user_gets_are_releases_upstream_supports():
    """Issue 42: inventory/homelab (which `gpulab discover` copies) pinned k3s v1.33, out of upstream support, and
    the role default kube-vip v0.8.9, a release line behind; the driver role knew branch 580 only. Now: a k3s
    minor upstream still patches (v1.34 or newer), kube-vip 1.x, and branch 595 offered beside 580."""
    from pathlib import Path

    import yaml

    from gpulab import cards
    from gpulab.k8s import skew

    root = Path(__file__).resolve().parents[3]
    for inventory in ("homelab", "homelab-lab"):
        pins = yaml.safe_load((root / "inventory" / inventory / "group_vars/all/main.yml").read_text())
        assert skew.parse(pins["k3s_version"])[:2] >= (1, 34), inventory
    kube_vip = yaml.safe_load((root / "roles/k3s_server/defaults/main.yml").read_text())
    assert skew.parse(kube_vip["k3s_server_kube_vip_version"])[0] >= 1
    assert set(cards.BRANCHES) >= {"580", "595"}


def test_monitoring_chart_values_the_pinned_charts_lack_are_refused_before_any_change(inv):
    """Stage monitoring's extra values are checked in preflight against the pinned Prometheus and Grafana charts."""
    _set(
        inv,
        "vm-1",
        monitoring_prometheus_extra_values={"server": {"retention": "15d", "retension": "15d"}},
        monitoring_grafana_extra_values={"persistence": {"enabled": True}},
    )
    [msg] = inv.messages()
    assert msg.startswith(
        "vm-1: monitoring_prometheus_extra_values='server.retension': not a value of prometheus chart 29.27.0 "
        "(Helm would ignore it); did you mean server.retention?"
    )
    assert "library/gpulab/data/prometheus-29.27.0-keys.json" in msg
    _set(inv, "vm-1", monitoring_grafana_chart_version="1.0.0", monitoring_prometheus_extra_values=KeyError)
    [msg] = inv.messages()
    assert msg.startswith(
        "vm-1: monitoring_grafana_chart_version='1.0.0': gpulab holds no key facts for the grafana"
    )


def test_a_webui_chart_that_does_not_fit_the_hami_chart_is_refused_before_any_change(inv):
    """monitoring_webui: true needs a HAMi-WebUI chart gpulab knows, for a HAMi chart whose metric names it reads."""
    _set(inv, "vm-1", monitoring_webui=True)
    assert inv.messages() == []  # WebUI 1.2.0 with the demo's HAMi 2.10.0
    _set(inv, "vm-1", monitoring_webui_chart_version="1.1.0")
    [msg] = inv.messages()
    assert msg.startswith(
        "vm-1: monitoring_webui_chart_version='1.1.0': with hami_chart_version='2.10.0': gpulab knows no HAMi-WebUI "
        "chart 1.1.0"
    )
    assert "set monitoring_webui: false" in msg
    _set(inv, "vm-1", monitoring_webui_chart_version=KeyError)
    _set(inv, "all", hami_chart_version="2.8.0")
    webui = [m for m in inv.messages() if m.startswith("vm-1: monitoring_webui_chart_version=")]
    assert len(webui) == 1 and "with hami_chart_version='2.8.0'" in webui[0]
    assert "needs HAMi chart 2.9.0 or later" in webui[0]
    _set(inv, "vm-1", monitoring_webui=False)
    assert not [m for m in inv.messages() if "monitoring_webui" in m]
    _set(inv, "all", hami_chart_version="2.9.0")
    _set(
        inv, "vm-1", monitoring_webui=True, monitoring_webui_extra_values={"serviceMonitr": {"enabled": True}}
    )
    [msg] = inv.messages()
    assert msg.startswith(
        "vm-1: monitoring_webui_extra_values='serviceMonitr': not a value of hami-webui chart 1.2.0"
    )
