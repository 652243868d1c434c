"""The admin kubeconfig on the controller (gpulab.k8s.kubeconfig and filter gpulab.homelab.kubeconfig): k3s' entries
under the lab's name, pointed at the registration address, merged into the user's file keeping the rest."""

import plugin_files
import pytest
import yaml

from gpulab.k8s import kubeconfig

K3S_YAML = yaml.safe_dump({
    "apiVersion": "v1", "kind": "Config", "current-context": "default", "preferences": {},
    "clusters": [{"name": "default", "cluster": {"certificate-authority-data": "Q0E=",
                                                 "server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "default", "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}}],
    "contexts": [{"name": "default", "context": {"cluster": "default", "user": "default"}}],
})  # fmt: skip
OTHER = yaml.safe_dump({
    "apiVersion": "v1", "kind": "Config", "current-context": "work",
    "clusters": [{"name": "work", "cluster": {"server": "https://work:6443"}},
                 {"name": "demo", "cluster": {"server": "https://old:6443"}}],
    "users": [{"name": "work", "user": {"token": "w"}}, {"name": "demo", "user": {"token": "old"}}],
    "contexts": [{"name": "work", "context": {"cluster": "work", "user": "work"}},
                 {"name": "demo", "context": {"cluster": "demo", "user": "demo"}}],
})  # fmt: skip


def test_a_new_file_holds_the_labs_entries_at_the_registration_address():
    doc = yaml.safe_load(kubeconfig.merge("", K3S_YAML, "demo", "https://10.0.0.5:6443"))
    assert doc["current-context"] == "demo" and doc["kind"] == "Config"
    assert doc["clusters"] == [{"name": "demo", "cluster": {"certificate-authority-data": "Q0E=",
                                                            "server": "https://10.0.0.5:6443"}}]  # fmt: skip
    assert doc["users"] == [
        {"name": "demo", "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}}
    ]
    assert doc["contexts"] == [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}]


def test_the_merge_keeps_another_clusters_entries_and_the_users_current_context():
    doc = yaml.safe_load(kubeconfig.merge(OTHER, K3S_YAML, "demo", "https://10.0.0.5:6443"))
    assert doc["current-context"] == "work"
    assert [c["name"] for c in doc["clusters"]] == ["work", "demo"]
    assert doc["clusters"][0] == {"name": "work", "cluster": {"server": "https://work:6443"}}
    assert doc["clusters"][1]["cluster"]["server"] == "https://10.0.0.5:6443"
    assert doc["users"][0] == {"name": "work", "user": {"token": "w"}}
    assert doc["users"][1]["user"] == {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}
    assert [c["name"] for c in doc["contexts"]] == ["work", "demo"]


def test_merging_again_changes_nothing_and_a_new_ca_or_address_changes_the_entry():
    once = kubeconfig.merge(OTHER, K3S_YAML, "demo", "https://10.0.0.5:6443")
    assert kubeconfig.merge(once, K3S_YAML, "demo", "https://10.0.0.5:6443") == once
    moved = yaml.safe_load(kubeconfig.merge(once, K3S_YAML, "demo", "https://10.0.0.9:6443"))
    assert moved["clusters"][1]["cluster"]["server"] == "https://10.0.0.9:6443"
    new_ca = K3S_YAML.replace("Q0E=", "TkVX")
    renewed = yaml.safe_load(kubeconfig.merge(once, new_ca, "demo", "https://10.0.0.5:6443"))
    assert renewed["clusters"][1]["cluster"]["certificate-authority-data"] == "TkVX"


def test_a_broken_file_is_refused_without_showing_its_text():
    with pytest.raises(kubeconfig.KubeconfigError, match="not YAML") as err:
        kubeconfig.merge("token: secret\n: [", K3S_YAML, "demo", "https://a:6443")
    assert "secret" not in str(err.value)
    with pytest.raises(kubeconfig.KubeconfigError, match="clusters is not a list"):
        kubeconfig.merge("clusters: {}\n", K3S_YAML, "demo", "https://a:6443")
    with pytest.raises(kubeconfig.KubeconfigError, match="no certificate-authority-data"):
        kubeconfig.merge("", K3S_YAML.replace("certificate-authority-data", "x"), "demo", "https://a:6443")


def test_the_filter_plugin_merges_and_summarises():
    filters = plugin_files.filters("kubeconfig")
    text = filters["kubeconfig"](K3S_YAML, "demo", "https://10.0.0.5:6443", OTHER)
    assert yaml.safe_load(text)["clusters"][1]["name"] == "demo"
    assert filters["kubeconfig"](K3S_YAML, "demo", "https://10.0.0.5:6443") == kubeconfig.merge(
        None, K3S_YAML, "demo", "https://10.0.0.5:6443"
    )


def test_the_role_merges_once_writes_0600_and_never_shows_the_credentials(tmp_path):
    """roles/k3s_server/tasks/kubeconfig.yml on this machine (k3s' kubeconfig a local file): the merge keeps the
    other cluster, a second run changes nothing, a new address is a change that --check --diff shows without
    writing it, and no run at -v shows a credential of the file."""
    from ansible_runs import ansible_playbook, recaps

    source, dest = tmp_path / "k3s.yaml", tmp_path / "kube" / "config"
    source.write_text(K3S_YAML)
    dest.parent.mkdir()
    dest.write_text(OTHER)
    book = tmp_path / "play.yml"

    def play(server, *args):
        book.write_text(yaml.safe_dump([{
            "hosts": "localhost", "gather_facts": False, "tasks": [{
                "ansible.builtin.include_role": {"name": "gpulab.homelab.k3s_server", "tasks_from": "kubeconfig"},
                "vars": {"k3s_server_kubeconfig_source": str(source), "k3s_server_kubeconfig_path": str(dest),
                         "k3s_server_kubeconfig_context": "demo", "k3s_server_kubeconfig_server": server}}]}]))  # fmt: skip
        proc = ansible_playbook("-i", "localhost,", "-c", "local", book, "-v", *args)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        for secret in ("Q0VSVA==", "S0VZ", "Q0E=", "w\n"):
            assert secret not in out, secret
        return recaps(proc)["localhost"]["changed"]

    assert play("https://10.0.0.5:6443") == 1
    assert (dest.stat().st_mode & 0o777) == 0o600
    doc = yaml.safe_load(dest.read_text())
    assert [c["name"] for c in doc["contexts"]] == ["work", "demo"] and doc["current-context"] == "work"
    assert play("https://10.0.0.5:6443") == 0
    before = dest.read_text()
    assert play("https://10.0.0.9:6443", "--check", "--diff") == 1
    assert dest.read_text() == before
