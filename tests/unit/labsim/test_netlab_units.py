"""network_lab's pure parts: range choice and refusal, address translation, cloud-init and agent formats."""

import ipaddress
import os
import urllib.parse

import pytest

from labsim import network_lab
from labsim.net import addressing
from labsim.net.addressing import SubnetConflict
from labsim.vm_hooks import VmHooks

HOME_ROUTES = [
    {"dst": "default", "gateway": "192.168.100.1", "dev": "wlan0", "protocol": "dhcp"},
    {"dst": "192.168.100.0/24", "dev": "wlan0", "protocol": "kernel", "prefsrc": "192.168.100.23"},
    {"type": "local", "dst": "192.168.100.23", "dev": "wlan0", "table": "local", "protocol": "kernel"},
    {"dst": "10.8.0.0/16", "gateway": "10.9.0.1", "dev": "tun0"},
]


def net(text):
    return ipaddress.ip_network(text)


def test_configured_range_overlapping_a_route_is_refused_naming_the_route():
    with pytest.raises(SubnetConflict) as err:
        addressing.check_subnet(net("192.168.100.0/24"), HOME_ROUTES)
    msg = str(err.value)
    assert "192.168.100.0/24 dev wlan0" in msg
    assert "network.subnet" in msg  # says how to change it
    # the default route alone never counts as a conflict
    addressing.check_subnet(net("10.213.0.0/24"), HOME_ROUTES[:1])


def test_overlap_is_found_inside_a_wider_route():
    with pytest.raises(SubnetConflict, match=r"10\.8\.0\.0/16 via 10\.9\.0\.1 dev tun0"):
        addressing.check_subnet(net("10.8.42.0/24"), HOME_ROUTES)


def test_chosen_range_is_private_and_free_even_when_the_first_candidates_are_taken():
    seed = "/some/state/dir"
    first = next(addressing.candidates(seed))
    second = list(addressing.candidates(seed))[1]
    routes = [*HOME_ROUTES, {"dst": str(first), "dev": "eth1"}]
    chosen = addressing.choose_subnet(seed, routes)
    assert chosen == second
    assert chosen.is_private and not addressing.conflicts(chosen, routes)


def test_a_route_covering_all_candidates_exhausts_the_choice():
    routes = [{"dst": "10.0.0.0/8", "dev": "x"}, {"dst": "172.16.0.0/12", "dev": "y"}]
    with pytest.raises(SubnetConflict, match="no free private"):
        addressing.choose_subnet("seed", routes)


def test_translate_keeps_the_host_part():
    assert str(addressing.translate("192.168.100.53", net("10.213.7.0/24"))) == "10.213.7.53"
    assert str(addressing.translate("192.168.100.5", net("172.20.0.0/16"))) == "172.20.100.5"


def test_pool_is_split_around_the_labs_own_addresses():
    ip = ipaddress.ip_address
    ranges = addressing.pool_ranges(ip("10.0.0.2"), ip("10.0.0.254"), [ip("10.0.0.5"), ip("10.0.0.254")])
    assert [(str(a), str(b)) for a, b in ranges] == [("10.0.0.2", "10.0.0.4"), ("10.0.0.6", "10.0.0.253")]


def test_known_hosts_pattern_matches_lab_addresses_only():
    assert network_lab._host_pattern(net("10.213.7.0/24")) == "10.213.7.*"
    assert network_lab._host_pattern(net("172.20.0.0/16")) == "172.20.*.*"
    assert network_lab._host_pattern(net("10.1.2.0/29")) == ",".join(f"10.1.2.{i}" for i in range(1, 7))


def test_cloud_init_users_decode_pve_url_encoded_keys():
    keys = "ssh-ed25519 AAAAC3Nza+/x= me@laptop\nssh-rsa AAAAB3 other\n"
    config = {"ciuser": "admin", "sshkeys": urllib.parse.quote(keys, safe="")}
    users = network_lab.cloud_init_users(config, "ssh-ed25519 LABKEY lab")
    by_name = {u["name"]: u for u in users}
    assert by_name["admin"]["keys"] == ["ssh-ed25519 AAAAC3Nza+/x= me@laptop", "ssh-rsa AAAAB3 other"]
    assert by_name["admin"]["sudo"] is True
    assert by_name["root"]["keys"] == ["ssh-ed25519 LABKEY lab"]
    assert {u["name"] for u in network_lab.cloud_init_users({}, "k")} == {"root", "ubuntu"}


def test_ipconfig0_static_or_dhcp():
    assert network_lab.static_address({"ipconfig0": "ip=dhcp"}) is None
    assert network_lab.static_address({}) is None
    assert network_lab.static_address({"ipconfig0": "ip=10.1.2.3/24,gw=10.1.2.1"}) == "10.1.2.3"


def test_agent_interfaces_follow_the_guest_agent_format():
    ip_json = [
        {
            "ifname": "ens18",
            "address": "bc:24:11:00:00:64",
            "addr_info": [{"family": "inet", "local": "10.2.3.53", "prefixlen": 24}],
            "stats64": {"rx": {"bytes": 10, "packets": 1, "errors": 0, "dropped": 2}, "tx": {"bytes": 5}},
        }
    ]
    (iface,) = network_lab.agent_interfaces(ip_json)
    assert iface["name"] == "ens18" and iface["hardware-address"] == "bc:24:11:00:00:64"
    assert iface["ip-addresses"] == [{"ip-address": "10.2.3.53", "ip-address-type": "ipv4", "prefix": 24}]
    assert iface["statistics"]["rx-dropped"] == 2 and iface["statistics"]["tx-bytes"] == 5


def test_lab_ids_are_short_unique_and_prefixed(tmp_path):
    a, b = network_lab.lab_id(tmp_path / "a"), network_lab.lab_id(tmp_path / "b")
    assert a != b and a.startswith("gl") and len(a) == 5
    # the longest link name (a VM with a 9-digit id) fits the kernel's 15 characters
    assert len(f"{a}v999999999") <= 15


def test_without_root_up_changes_nothing_and_says_what_it_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    def no_commands(*args, **kwargs):
        raise AssertionError(f"no command may run without root: {args}")

    monkeypatch.setattr(network_lab.subprocess, "run", no_commands)
    monkeypatch.setattr(network_lab.subprocess, "Popen", no_commands)
    facts = network_lab.up(tmp_path, {"nodes": [{"name": "pve"}]})
    assert facts["network"] == "skipped"
    assert all("root" in s["why"] for s in facts["skipped"])
    what = " ".join(s["what"] for s in facts["skipped"])
    for part in ("bridge", "blackhole route", "router", "node host", "VM hosts"):
        assert part in what
    assert not (tmp_path / "net").exists()
    hooks = network_lab.make_hooks(tmp_path, {"nodes": [{"name": "pve"}]})
    assert type(hooks) is VmHooks
    network_lab.down(tmp_path)  # nothing recorded: nothing to do, no error


def test_vm_gpus_follow_hostpci_and_the_fixture():
    from labsim.fixture import load_fixture

    fixture = load_fixture()
    assert network_lab.vm_gpus({"name": "vm-1"}, fixture, "pve") == []
    (gpu,) = network_lab.vm_gpus({"hostpci0": "0000:02:00,pcie=1"}, fixture, "pve")
    assert gpu["name"] == "NVIDIA GeForce RTX 3090" and gpu["memory_mib"] == 24576
    assert gpu["host_address"] == "0000:02:00.0" and gpu["pci_bus_id"] == "00000000:01:00.0"
    assert len(gpu["uuid"]) == 40 and gpu["uuid"].startswith("GPU-")
    # stable across starts, and a resource mapping passes the card too
    assert network_lab.vm_gpus({"hostpci0": "mapping=rtx3090,pcie=1"}, fixture, "pve") == [gpu]
    assert network_lab.vm_gpus({"hostpci0": "0000:03:00"}, fixture, "pve") == []


def test_lab_archive_has_the_real_package_names_and_a_signed_nvidia_repository(tmp_path):
    import subprocess

    from labsim.net import package_archive

    paths = package_archive.build(tmp_path / "srv", tmp_path / "gnupg", kernel="6.8.0-90-generic")
    ubuntu = (tmp_path / "srv" / paths["ubuntu"] / "Packages").read_text()
    for name in ("nvidia-driver-580-server", "dkms", "linux-headers-6.8.0-90-generic", "qemu-guest-agent"):
        assert f"Package: {name}\n" in ubuntu
    nvidia_dir = tmp_path / "srv" / "nvidia/stable/deb/amd64"
    assert "Package: nvidia-container-toolkit\n" in (nvidia_dir / "Packages").read_text()
    # the InRelease signature verifies with the key the archive publishes, and only with it
    keyring = tmp_path / "key.gpg"
    subprocess.run(
        ["gpg", "--batch", "--dearmor", "-o", str(keyring), str(tmp_path / "srv" / paths["nvidia_key"])],
        check=True,
    )
    ok = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(nvidia_dir / "InRelease")], capture_output=True
    )
    assert ok.returncode == 0, ok.stderr
    tampered = tmp_path / "InRelease"
    tampered.write_text(
        (nvidia_dir / "InRelease").read_text().replace("Origin: gpulab-lab", "Origin: elsewhere")
    )
    bad = subprocess.run(["gpgv", "--keyring", str(keyring), str(tampered)], capture_output=True)
    assert bad.returncode != 0
    # no gpg-agent is left running for the lab's key
    agents = subprocess.run(
        ["pgrep", "-f", f"gpg-agent --homedir {tmp_path}"], capture_output=True, text=True
    )
    assert agents.stdout.strip() == ""


def test_bootdisk_size_from_the_vm_config():
    assert network_lab._bootdisk_gb({"scsi0": "local-zfs:vm-100-disk-0,size=60G"}) == 60.0
    assert network_lab._bootdisk_gb({"virtio0": "local-zfs:vm-1-disk-0,iothread=1,size=1T"}) == 1024.0
    assert network_lab._bootdisk_gb({"scsi0": "local-zfs:vm-100-disk-0,size=512M"}) == 0.5
    assert network_lab._bootdisk_gb({"name": "x"}) == 0.0


def test_vm_firmware_and_secure_boot_follow_pve_semantics():
    assert network_lab.vm_firmware({}) == {"efi": False, "secure_boot": False}
    ovmf = {"bios": "ovmf", "efidisk0": "local-zfs:vm-102-disk-1,efitype=4m,pre-enrolled-keys=1,size=1M"}
    assert network_lab.vm_firmware(ovmf) == {"efi": True, "secure_boot": True}
    off = {"bios": "ovmf", "efidisk0": "local-zfs:vm-102-disk-1,efitype=4m,pre-enrolled-keys=0"}
    assert network_lab.vm_firmware(off)["secure_boot"] is False
    # the keys are only enrolled with the 4m vars template, and default to off
    assert (
        network_lab.vm_firmware({"bios": "ovmf", "efidisk0": "local-zfs:1,pre-enrolled-keys=1"})[
            "secure_boot"
        ]
        is False
    )
    assert (
        network_lab.vm_firmware({"bios": "ovmf", "efidisk0": "local-zfs:1,efitype=4m"})["secure_boot"]
        is False
    )


def test_k3s_standin_installs_hami_helmcharts_as_the_helm_controller_would(tmp_path, monkeypatch):
    import time

    from labsim.net.k3s import cluster as k3s

    monkeypatch.setattr(k3s, "STATE", str(tmp_path / "state.json"))
    monkeypatch.setattr(k3s, "MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    cluster = k3s.Cluster()
    base = {"address": "10.0.0.2", "runtimes": ["nvidia"], "labels": {"gpu": "on"}}
    # the agent registers the cards nvidia-smi lists; HAMi's device plugin registers them in turn
    card = {"uuid": "GPU-aaaa", "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}
    cluster.register({**base, "name": "gpu-node", "gpus": 1, "gpu_uuids": ["GPU-aaaa"], "gpu_cards": [card]})
    cluster.register({**base, "name": "no-runtime", "gpus": 1, "runtimes": []})
    cluster.register({**base, "name": "unlabelled", "gpus": 2, "labels": {}})
    (tmp_path / "manifests" / "hami.yaml").write_text(
        "apiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: hami, namespace: kube-system}\n"
        "spec:\n  chart: hami\n  valuesContent: |-\n    devicePlugin:\n      deviceSplitCount: 4\n"
        '      runtimeClassName: nvidia\n      nvidiaNodeSelector:\n        gpu: "on"\n'
    )
    cluster.apply_manifests()
    assert cluster.state["jobs"] == {}  # the install job is still running
    cluster.state["charts_seen"]["kube-system/hami"] = time.time() - 5
    cluster.apply_manifests()
    assert cluster.state["jobs"] == {"kube-system/helm-install-hami": {"complete": True}}
    assert [d["metadata"]["name"] for d in cluster.state["daemonsets"]] == ["hami-device-plugin"]
    nodes = {n: k3s.node_object(n, v) for n, v in cluster.state["nodes"].items()}
    assert nodes["gpu-node"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert "nvidia.com/gpu" not in nodes["no-runtime"]["status"]["allocatable"]
    assert "nvidia.com/gpu" not in nodes["unlabelled"]["status"]["allocatable"]
    # workloads: a pod pinned to a card that exists runs, one pinned to a missing card stays pending
    engine = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: ai}}\nspec:\n  template:\n"
        "    metadata:\n      annotations: {{nvidia.com/use-gpuuuid: {uuid}}}\n    spec:\n      containers:\n"
        "        - name: vllm\n          resources: {{limits: {{nvidia.com/gpu: 1}}}}\n"
    )
    (tmp_path / "manifests" / "engines.yaml").write_text(
        engine.format(name="good", uuid="GPU-aaaa") + "---\n" + engine.format(name="bad", uuid="GPU-zzzz")
    )
    cluster.apply_manifests()
    # a Deployment's pod is Ready a moment after its container started
    assert not cluster.state["deployments"]["ai/good"]["ready"]
    history = cluster.state["deployment_history"]
    assert history["ai/good"]["pod"]["node"] == "gpu-node" and history["ai/bad"]["pod"]["node"] is None
    history["ai/good"]["pod"]["started"] -= k3s.DEPLOY_READY_S
    cluster.apply_manifests()
    assert cluster.state["deployments"]["ai/good"]["ready"] is True
    assert cluster.state["deployments"]["ai/bad"]["ready"] is False
    # taking the chart out uninstalls it: GPU pods no longer fit, the running one keeps running (as on k3s)
    (tmp_path / "manifests" / "hami.yaml").unlink()
    cluster.apply_manifests()
    assert cluster.state["daemonsets"] == [] and cluster.state["nodes"]["gpu-node"]["vgpus"] == 0
    assert cluster.state["deployments"]["ai/good"]["ready"] is True
    import yaml

    good = next(yaml.safe_load_all((tmp_path / "manifests" / "engines.yaml").read_text()))
    assert cluster.placement(good) is None


def test_state_dir_on_a_file_system_overlayfs_cannot_use_is_refused(tmp_path, monkeypatch):
    assert network_lab.fs_type(tmp_path / "not" / "yet") == network_lab.fs_type(
        tmp_path
    )  # nearest existing dir
    network_lab.check_disk_fs(tmp_path)  # the test's own tmp dir is usable
    monkeypatch.setattr(network_lab, "fs_type", lambda path: "overlayfs")
    with pytest.raises(network_lab.LabNetError, match=r"on overlayfs.*--state"):
        network_lab.check_disk_fs(tmp_path)


def test_record_lock_is_reentrant_and_shared_by_threads(tmp_path):
    import threading

    lab = network_lab.NetworkLab(tmp_path)
    order = []

    def other():
        with lab.locked():
            order.append("other")

    with lab.locked():
        with lab.locked():  # nested use in one thread does not deadlock
            lab.note("netns", "x")
        t = threading.Thread(target=other)
        t.start()
        t.join(0.2)
        order.append("first")  # the other thread waits for us
    t.join(5)
    assert order == ["first", "other"]
    assert lab.load()["netns"] == ["x"]


def test_lab_archive_serves_the_driver_branches_and_one_replaces_the_other(tmp_path):
    """Branches 580, 595 and 570 under Ubuntu's -server names, every package role nvidia_driver asks for
    (gpulab.cards.packages) among them; installing another branch's nvidia-utils takes the first one's away
    (Conflicts and Replaces), and the nvidia-smi left is the new branch's."""
    import subprocess

    from gpulab import cards
    from labsim.net import package_archive

    paths = package_archive.build(tmp_path / "srv", tmp_path / "gnupg", kernel="6.8.0-90-generic")
    repo = tmp_path / "srv" / paths["ubuntu"]
    ubuntu = (repo / "Packages").read_text()
    for branch, driver in (("580", "580.173.02"), ("595", "595.71.05"), ("570", "570.195.03")):
        for name in ("nvidia-driver", "nvidia-utils", "nvidia-headless-no-dkms", "linux-modules-nvidia"):
            suffix = "-server-generic" if name == "linux-modules-nvidia" else "-server"
            assert f"Package: {name}-{branch}{suffix}\nVersion: {driver}-0ubuntu0.24.04.1\n" in ubuntu
    served = {line.removeprefix("Package: ") for line in ubuntu.splitlines() if line.startswith("Package: ")}
    for branch in cards.BRANCHES:
        for flavour in ("server", "server-open"):
            for signed in (False, True):
                for series in ("generic", "generic-hwe-24.04"):
                    wanted = set(cards.packages(branch, flavour, signed, series))
                    assert wanted <= served, (branch, flavour, signed, series, wanted - served)
    root = tmp_path / "root"
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/updates").mkdir()
    (root / "var/lib/dpkg/status").touch()

    def install(branch):
        (deb,) = repo.glob(f"nvidia-utils-{branch}-server_*.deb")
        done = subprocess.run(
            ["dpkg", f"--root={root}", "--force-script-chrootless", "--log=/dev/null", "-i", str(deb)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        listed = subprocess.run(["dpkg-query", f"--root={root}", "-W", "-f", "${Package} ${db:Status-Abbrev}\n"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        return {line.split()[0] for line in listed.splitlines() if line.split()[1:] == ["ii"]}

    assert install("570") == {"nvidia-utils-570-server"}
    assert 'DRIVER = "570.195.03"' in (root / "usr/bin/nvidia-smi").read_text()
    assert install("580") == {"nvidia-utils-580-server"}
    assert 'DRIVER = "580.173.02"' in (root / "usr/bin/nvidia-smi").read_text()
    assert install("595") == {"nvidia-utils-595-server"}
    assert 'DRIVER = "595.71.05"' in (root / "usr/bin/nvidia-smi").read_text()


def test_apt_hold_comes_from_the_fixture_then_the_test_sessions_variable_then_the_default(monkeypatch):
    monkeypatch.delenv(network_lab.APT_HOLD_ENV, raising=False)
    assert network_lab.apt_hold_s({}) == network_lab.DEFAULT_APT_HOLD_S == 25
    monkeypatch.setenv(network_lab.APT_HOLD_ENV, "8")
    assert network_lab.apt_hold_s({}) == 8
    assert network_lab.apt_hold_s({"network": {"guest_apt_hold_s": 0}}) == 0  # the fixture's own hold wins
    monkeypatch.setenv(network_lab.APT_HOLD_ENV, "soon")
    with pytest.raises(network_lab.LabNetError, match="GPULAB_LAB_APT_HOLD_S must be 0 or more seconds"):
        network_lab.apt_hold_s({})
    with pytest.raises(network_lab.LabNetError, match=r"network.guest_apt_hold_s .* \(got -1\)"):
        network_lab.apt_hold_s({"network": {"guest_apt_hold_s": -1}})


def test_the_test_session_shortens_the_labs_apt_hold():
    """tests/conftest.py: every lab a test starts meets unattended-upgrades' locks after each VM boot, for less
    time than `make demo`'s lab (the wait itself is proven at length in tests/lab/labsim/test_netlab_apt_locks.py)."""
    assert 0 < float(os.environ[network_lab.APT_HOLD_ENV]) < network_lab.DEFAULT_APT_HOLD_S
