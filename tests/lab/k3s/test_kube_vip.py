"""kube-vip for a VIP registration address: role k3s_server's manifest, rendered and placed by ansible-playbook
on this machine (tasks_from kube_vip, the manifests folder in a temporary folder), and where its pin lives."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpulab.labdef import catalogue
from labsim.net.k3s import cluster as k3s_cluster
from labsim.net.k3s import kube_vip as k3s_kube_vip

from .test_roles_local import JSON_CALLBACK, FakeK3sFolder, stats

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def kube_vip(address="192.168.100.60", interface="ens18"):
    return {
        "name": "kube-vip",
        "ansible.builtin.include_role": {"name": "k3s_server", "tasks_from": "kube_vip"},
        "vars": {
            "k3s_server_kube_vip_address": address,
            "k3s_server_kube_vip_interface": interface,
            "k3s_server_manifests_dir": "{{ manifests }}/server",
            "k3s_server_address": "192.168.100.53",
        },
    }


@pytest.fixture
def lab(tmp_path):
    return FakeK3sFolder(tmp_path)


def daemonset(lab):
    docs = list(yaml.safe_load_all((lab.root / "manifests" / "server" / "kube-vip.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"]
    return docs[3]


def test_the_manifest_holds_the_vip_on_the_interface_with_arp_and_leader_election(lab):
    rc, out = lab.play([kube_vip()], check=True)
    assert rc == 0 and stats(out)["changed"] == 1, lab.failures(out)
    assert not (lab.root / "manifests" / "server").exists()  # a dry run writes nothing

    rc, out = lab.play([kube_vip()])
    assert rc == 0 and stats(out)["changed"] == 1, lab.failures(out)
    ds = daemonset(lab)
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["address"] == "192.168.100.60" and env["vip_interface"] == "ens18"
    assert env["vip_arp"] == env["cp_enable"] == env["vip_leaderelection"] == "true"
    assert env["port"] == "6443" and env["vip_leasename"] == "plndr-cp-lock" and env["svc_enable"] == "false"
    assert pod["containers"][0]["image"] == "ghcr.io/kube-vip/kube-vip:v1.2.2" and env["vip_subnet"] == "32"
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "kube-vip"
    assert set(pod["containers"][0]["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "NET_RAW"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {t["matchExpressions"][0]["key"] for t in terms} == {
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    }

    rc, out = lab.play([kube_vip()])
    assert rc == 0 and stats(out)["changed"] == 0, lab.failures(out)
    # the lab's k3s reads the VIP from this manifest as kube-vip would (tests/lab/k3s/test_kube_vip_ns.py runs it)
    docs = list(yaml.safe_load_all((lab.root / "manifests" / "server" / "kube-vip.yaml").read_text()))
    assert k3s_kube_vip.kube_vip_spec(docs) == {"address": "192.168.100.60", "interface": "ens18",
                                               "leader_election": True, "services": False}  # fmt: skip
    assert k3s_kube_vip.kube_vip_spec([{**docs[3], "spec": {}}]) is None

    # another VIP rewrites the file; no interface given: the default route's
    rc, out = lab.play([kube_vip("192.168.100.61", "")])
    assert rc == 0 and stats(out)["changed"] == 1, lab.failures(out)
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True,
                                       text=True, check=True).stdout)  # fmt: skip
    env = {
        e["name"]: e.get("value") for e in daemonset(lab)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["address"] == "192.168.100.61"
    assert env["vip_interface"] == (routes[0]["dev"] if routes else None)


def test_the_kube_vip_pin_is_the_roles_default_and_the_catalogues():
    defaults = yaml.safe_load((ROOT / "roles/k3s_server/defaults/main.yml").read_text())
    specs = catalogue.role_options()
    for name in ("k3s_server_kube_vip_version", "k3s_server_kube_vip_interface"):
        assert catalogue.BY_NAME[name].default == defaults[name] == specs[name]["default"], name


def run_k3s_vip_task(tmp_path, task, vars_files=("k3s_vip.yml",)):
    """Run `task` on localhost with playbooks/vars/k3s_vip.yml (or the `vars_files` of playbooks/vars named) and
    tmp_path/hosts.yml; its result on localhost."""
    files = [str(ROOT / "playbooks" / "vars" / name) for name in vars_files]
    play = [{"hosts": "localhost", "gather_facts": False, "vars_files": files, "tasks": [task]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "gpulab_test_json.py").write_text(JSON_CALLBACK)
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "gpulab_test_json",
           "ANSIBLE_CALLBACK_PLUGINS": str(tmp_path / "callbacks"),
           "PATH": str(ROOT / ".venv/bin") + ":/usr/bin:/bin", "ANSIBLE_LOCALHOST_WARNING": "0"}  # fmt: skip
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, timeout=120,
                          check=False, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_only_an_ipv4_registration_address_that_is_no_vms_is_a_vip(tmp_path):
    """playbooks/vars/k3s_vip.yml, as stages k3s and network read it: a free IPv4 address is the VIP (and what
    stage network keeps free); a server's vm_address, a DNS name or nothing is no VIP."""
    inventory = {"all": {"children": {"vms": {"hosts": {"vm-1": {"vm_address": "192.168.100.53"},
                                                         "vm-2": {"vm_address": "192.168.100.54"}}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    cases = ["192.168.100.60", "192.168.100.53", "k3s.lab.example", ""]
    task = {"name": "vip", "ansible.builtin.debug": {"msg": "{{ [gpulab_k3s_vip, gpulab_network_keep_free] }}"},
            "loop": cases, "vars": {"k3s_registration_address": "{{ item }}"}}  # fmt: skip
    results = run_k3s_vip_task(tmp_path, task)["results"]
    vips = [r["msg"][0] for r in results]
    assert vips == ["192.168.100.60", "", "", ""]
    assert results[0]["msg"][1] == [{"address": "192.168.100.60", "host": "all", "field": "k3s_registration_address",
                                     "what": "the kube-vip VIP the k3s servers hold"}]  # fmt: skip
    assert [r["msg"][1] for r in results[1:]] == [[], [], []]


def test_the_lab_k3s_holds_the_vip_on_the_etcd_leader_only(tmp_path):
    """The stand-in's kube-vip: the VIP of kube-vip's DaemonSet (any server's manifests, as etcd holds them) is
    wanted by the etcd leader, on the DaemonSet's interface, and by no follower; no DaemonSet, no VIP."""
    docs = [{"kind": "DaemonSet", "metadata": {"name": "kube-vip-ds", "namespace": "kube-system"},
             "spec": {"template": {"spec": {"hostNetwork": True, "containers": [{
                 "image": "ghcr.io/kube-vip/kube-vip:v1.2.2",
                 "env": [{"name": "vip_arp", "value": "true"}, {"name": "cp_enable", "value": "true"},
                         {"name": "address", "value": "10.77.0.100"}, {"name": "vip_interface", "value": "ens18"}]}]}}}}]  # fmt: skip

    class Etcd:
        members = ({"name": "vm-1"}, {"name": "vm-2"})
        leader = "vm-2"

        def is_leader(self):
            return self.leader == "vm-2"

    cluster = k3s_cluster.Cluster(str(tmp_path / "state.json"))
    cluster.etcd = Etcd()
    cluster.state["addons"] = {"vm-1": docs, "vm-2": []}
    vip = k3s_kube_vip.KubeVip(cluster, 6443, None, log=lambda msg: None)
    assert vip.wanted() == ("10.77.0.100", "ens18")
    Etcd.leader = "vm-1"
    assert vip.wanted() is None
    Etcd.leader, cluster.state["addons"] = "vm-2", {"vm-1": [], "vm-2": []}
    assert vip.wanted() is None


# The environment variables the DaemonSet sets, each one kube-vip v1.2.2 reads (pkg/kubevip/config_envvar.go at
# v1.2.2, commit 972e0fd6): 1.x dropped vip_cidr (0.8.9's generator wrote it) and reads the mask from vip_subnet.
KUBE_VIP_1_2_2_ENV = {
    "vip_arp", "port", "vip_nodename", "vip_interface", "vip_subnet", "dns_mode", "cp_enable", "cp_namespace",
    "svc_enable", "vip_leaderelection", "vip_leasename", "vip_leaseduration", "vip_renewdeadline",
    "vip_retryperiod", "address", "prometheus_server",
}  # fmt: skip


def test_the_manifest_sets_only_variables_kube_vip_1_2_2_reads():
    template = (
        Path(__file__).resolve().parents[3] / "roles/k3s_server/templates/kube-vip.yaml.j2"
    ).read_text()
    names = set(re.findall(r"^ +- name: ([a-z_]+)$", template, re.M))
    assert "vip_subnet" in names and names <= KUBE_VIP_1_2_2_ENV, names - KUBE_VIP_1_2_2_ENV


def test_stage_network_keeps_each_engines_lan_address_free(tmp_path):
    """playbooks/vars/k3s_vip.yml: an engine on the LAN with a lan_address (kube-vip announces it) is kept free
    on the router as the VIP is; one without lan_address (its node's reserved address) or off the LAN is not."""
    engines = [
        {"name": "vllm", "lan": True, "lan_address": "192.168.100.61"},
        {"name": "ollama", "lan": True},
        {"name": "other", "lan": False, "lan_address": "192.168.100.62"},
    ]
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {}}}))
    task = {"name": "free", "ansible.builtin.debug": {"msg": "{{ gpulab_network_keep_free }}"},
            "vars": {"k3s_registration_address": "192.168.100.60", "workloads_engines": engines}}  # fmt: skip
    free = run_k3s_vip_task(tmp_path, task)["msg"]
    assert free == [
        {"address": "192.168.100.60", "host": "all", "field": "k3s_registration_address",
         "what": "the kube-vip VIP the k3s servers hold"},
        {"address": "192.168.100.61", "host": "all", "field": "workloads_engines",
         "what": "the LAN address kube-vip announces for engine vllm"},
    ]  # fmt: skip


def test_kube_vip_announces_service_addresses_when_an_engine_has_a_lan_address(lab):
    """k3s_server_kube_vip_services (stage k3s: an engine of workloads_engines has a lan_address) turns on
    kube-vip's Service load balancer (svc_enable), which announces the engine Service's kube-vip.io/loadbalancerIPs."""
    task = kube_vip()
    task["vars"]["k3s_server_kube_vip_services"] = True
    rc, out = lab.play([task])
    assert rc == 0, lab.failures(out)
    env = {
        e["name"]: e.get("value") for e in daemonset(lab)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["svc_enable"] == "true" and env["cp_enable"] == "true"
