"""dhcp_reservation: secrets stay hidden, its task (gpulab.tasks.dhcp_reservation) drives a backend."""

import json
import subprocess
from pathlib import Path

import pytest
from ansible_modules import command
from plugin_files import argument_spec

from gpulab.routers import OPTION_DEFAULTS, RouterError, make_backend
from gpulab.tasks import dhcp_reservation as task
from labsim.routers.mikrotik import MikroTikSim

ROOT = Path(__file__).resolve().parents[3]
PATH = ROOT / "plugins/modules/dhcp_reservation.py"
PW = "Mod-Secret-42"


def test_passwords_are_no_log_and_every_backend_is_a_kind():
    spec = argument_spec("dhcp_reservation")
    assert spec["password"]["no_log"] is True
    assert spec["ssh"]["options"]["password"]["no_log"] is True
    assert set(spec["kind"]["choices"]) == set(OPTION_DEFAULTS)


def test_make_backend_refuses_unknown_kind_and_option():
    with pytest.raises(RouterError, match="unknown router kind"):
        make_backend({"kind": "tplink"})
    with pytest.raises(RouterError, match=r"unknown option.*hostfile.*known: .*hostsfile"):
        make_backend({"kind": "dnsmasq", "address": "192.0.2.1", "options": {"hostfile": "/x"}})


def params(sim, **kw):
    base = {"kind": "mikrotik", "address": "127.0.0.1", "subnet": "192.168.88.0/24", "pool": None, "user": "admin",
            "password": PW, "url": sim.url, "validate_certs": True, "ssh": None, "options": {}, "state": "present",
            "reservations": [{"mac": "BC:24:11:00:0A:01", "address": "192.168.88.9", "hostname": "vm-1",
                              "current_address": None, "name": "vm-1"}]}  # fmt: skip
    base.update(kw)
    return base


def test_run_check_then_apply_then_absent():
    with MikroTikSim(password=PW) as sim:
        out = task.apply(params(sim), check_mode=True)
        assert out["changed"] and sim.leases == []
        assert out["diff"] == {"before": "", "after": "bc:24:11:00:0a:01 192.168.88.9 vm-1\n"}
        out = task.apply(params(sim), check_mode=False)
        assert out["reservations"]["bc:24:11:00:0a:01"]["address"] == "192.168.88.9"
        assert task.apply(params(sim), check_mode=False)["changed"] is False
        out = task.apply(params(sim, state="absent"), check_mode=False)
        assert [c["action"] for c in out["changes"]] == ["delete"] and sim.leases == []


def test_module_process_hides_the_password_on_failure(tmp_path):
    with MikroTikSim(password="other") as sim:
        args = {"ANSIBLE_MODULE_ARGS": {k: v for k, v in params(sim).items() if v is not None}}
        f = tmp_path / "args.json"
        f.write_text(json.dumps(args))
        proc = subprocess.run(command(PATH, str(f)), capture_output=True, text=True, timeout=60, check=False)
    result = json.loads(proc.stdout)
    assert result["failed"] and result["error_code"] == "auth_failed"
    assert PW not in proc.stdout and PW not in proc.stderr


def test_run_refuses_a_kept_free_vip_that_another_mac_holds_and_writes_nothing():
    vip = {"address": "192.168.88.60", "host": "all", "field": "k3s_registration_address",
           "what": "the kube-vip VIP the k3s servers hold"}  # fmt: skip
    with MikroTikSim(password=PW) as sim:
        # free: the reservation goes through in check mode and for real, and a re-run changes nothing
        assert task.apply(params(sim, keep_free=[vip]), check_mode=True)["changed"]
        assert task.apply(params(sim, keep_free=[vip]), check_mode=False)["changed"]
        assert task.apply(params(sim, keep_free=[vip]), check_mode=False)["changed"] is False
        sim.add_dynamic("bc:24:11:00:0b:02", "192.168.88.60", "laptop")
        before = [dict(x) for x in sim.leases]
        for check in (True, False):
            with pytest.raises(RouterError) as err:
                task.apply(params(sim, keep_free=[vip]), check_mode=check)
            assert str(err.value).startswith("all: k3s_registration_address = 192.168.88.60")
            assert "is leased to bc:24:11:00:0b:02 (laptop)" in str(err.value) and "Fix:" in str(err.value)
            assert err.value.code == "conflict" and sim.leases == before


def test_the_options_docs_are_the_kinds_table():
    """The module documents each kind's options as gpulab.routers.kinds has them (`make docs` writes them)."""
    import ast

    import yaml

    from gpulab.routers.kinds import option_docs

    tree = ast.parse(PATH.read_text())
    doc = next(
        n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "DOCUMENTATION"
    )
    assert yaml.safe_load(doc)["options"]["options"]["description"] == option_docs()


def test_each_kind_builds_its_class_and_its_options_are_the_classs_keyword_arguments():
    import inspect

    from gpulab.routers import KINDS

    for name, kind in KINDS.items():
        params = inspect.signature(kind.cls.__init__).parameters
        assert set(kind.options) <= set(params), name
        assert kind.cls.kind == name
        backend = make_backend({"kind": name, "address": "192.0.2.1", "ssh": {"local": True}})
        assert type(backend) is kind.cls
    assert OPTION_DEFAULTS["dnsmasq"]["hostsfile"] == "/etc/dnsmasq.gpulab-hosts"
    assert OPTION_DEFAULTS["kea"] == {
        "url": None,
        "service": "dhcp4",
        "subnet_id": None,
        "config_write": True,
    }


def test_a_run_that_finishes_a_cut_off_one_says_so_as_a_warning(tmp_path):
    from gpulab.routers.opnsense import PENDING
    from labsim.routers.opnsense import OPNsenseSim

    with OPNsenseSim(key="opn-key", secret=PW) as sim:
        subnet = next(iter(sim.subnets))
        # what a run cut off before reconfigure leaves: the entry saved, marked, not served
        sim.reservations["0b6c3f7e-0000-4000-8000-000000000001"] = {
            "subnet": subnet, "ip_address": "192.168.1.9", "hw_address": "bc:24:11:00:0a:01", "hostname": "vm-1",
            "description": PENDING,
        }  # fmt: skip
        args = {**params(sim), "kind": "opnsense", "subnet": "192.168.1.0/24", "user": "opn-key"}
        args["reservations"][0]["address"] = "192.168.1.9"
        f = tmp_path / "args.json"
        f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {k: v for k, v in args.items() if v is not None}}))
        proc = subprocess.run(command(PATH, str(f)), capture_output=True, text=True, timeout=60, check=False)
        result = json.loads(proc.stdout)
        assert result["changed"] and result["changes"] == [], result
        warned = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]
        assert warned == result["notes"] and "a cut-off run had saved" in result["notes"][0], result
        assert sim.running["kea"] == sim.rendered("kea") and sim.reconfigures["kea"] == 1
    assert PW not in proc.stdout
