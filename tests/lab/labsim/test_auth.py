"""Authentication, tickets and CSRF, and the schema's permission checks of every call (labsim.pve_auth and
the dispatch of labsim.pve_api); the hostpci rules of a config write are in test_pve_qemu.py."""

from __future__ import annotations

import requests
from unit.labsim.pve_sim_client import MAP, Api, create_vm

from labsim.pve_schema import load_schema


def test_no_credentials_is_401(lab):
    r = Api(lab.url).get("/version")
    assert r.status_code == 401
    assert r.json()["message"].strip() == "No ticket"


def test_wrong_token_secret_is_401(lab):
    r = lab.token_api(secret="00000000-0000-0000-0000-000000000000").get("/version")
    assert r.status_code == 401
    assert r.json()["message"].strip() == "authentication failure"


def test_token_header_with_space_form_is_accepted(lab):
    api = Api(
        lab.url, headers={"Authorization": f"PVEAPIToken {lab.desc['token_id']}={lab.desc['token_secret']}"}
    )
    assert api.data("GET", "/version")["release"] == "9.2"


def test_password_login_gives_ticket_and_csrf(lab):
    r = requests.post(
        lab.url + "/api2/json/access/ticket",
        data={"username": "root", "password": lab.desc["password"], "realm": "pam"},
        verify=False,
        timeout=10,
    )
    d = r.json()["data"]
    assert r.status_code == 200
    assert d["username"] == "root@pam"
    assert d["ticket"].startswith("PVE:root@pam:")
    assert d["CSRFPreventionToken"]


def test_wrong_password_is_401(lab):
    r = requests.post(
        lab.url + "/api2/json/access/ticket",
        data={"username": "root@pam", "password": "wrong"},
        verify=False,
        timeout=10,
    )
    assert r.status_code == 401
    assert r.json()["message"].strip() == "authentication failure"


def test_ticket_write_without_csrf_is_refused_but_read_works(lab, root):
    cookie = root.session.cookies.get("PVEAuthCookie")
    no_csrf = Api(lab.url, cookies={"PVEAuthCookie": cookie})
    assert no_csrf.get("/version").status_code == 200
    r = no_csrf.post("/cluster/mapping/pci", id="x1", map=MAP)
    assert r.status_code == 401
    assert "csrf" in r.json()["message"]


def test_forged_ticket_is_refused(lab, root):
    cookie = root.session.cookies.get("PVEAuthCookie")
    forged = cookie.replace("root@pam", "admin@pam", 1)
    assert Api(lab.url, cookies={"PVEAuthCookie": forged}).get("/version").status_code == 401


def test_permission_denied_names_path_and_privilege(lab):
    ro = lab.token_api("auditor@pve!ro", "ro-secret")
    r = ro.post("/nodes/pve/qemu", vmid=150)
    assert r.status_code == 403
    assert r.json()["message"].strip() == "Permission check failed (/vms/150, VM.Allocate)"
    r = ro.post("/nodes/pve/qemu/150/status/start")
    assert r.status_code == 403
    assert r.json()["message"].strip() == "Permission check failed (/vms/150, VM.PowerMgmt)"


def test_privilege_separation_limits_the_token_to_its_own_acl(lab):
    r = lab.token_api("nomap@pve!tk", "nomap-secret").post("/cluster/mapping/pci", id="nomapx", map=MAP)
    assert r.status_code == 403
    assert r.json()["message"].strip() == "Permission check failed (/mapping/pci, Mapping.Modify)"


def test_listings_are_filtered_by_privilege(lab, api):
    create_vm(api, 160)
    ro = lab.token_api("auditor@pve!ro", "ro-secret")
    assert [v["vmid"] for v in ro.data("GET", "/nodes/pve/qemu")] == [160]
    assert ro.data("GET", "/nodes/pve/storage") == []  # no Datastore.Audit
    assert ro.data("GET", "/cluster/mapping/pci") == []


def test_every_served_method_validates_over_http(root):
    """Conformance over HTTP: an unknown parameter is refused by every served endpoint with PVE's 400."""
    concrete = {"node": "pve", "vmid": "100", "storage": "local", "id": "gpu", "upid": "x"}
    for path, methods in load_schema().endpoints.items():
        url = path
        for k, v in concrete.items():
            url = url.replace("{" + k + "}", v)
        for method in methods:
            if path == "/access/ticket" and method == "POST":
                continue  # the login call is answered before authentication
            r = root.request(method, url, **{"no-such-param": "1"})
            assert r.status_code == 400, (method, path, r.text)
            body = r.json()
            assert body["message"].strip() == "Parameter verification failed."
            assert "no-such-param" in body["errors"], (method, path, body)


def test_world_readable_call_needs_no_credentials(lab):
    r = Api(lab.url).get("/access/ticket")
    assert r.status_code == 200 and r.json() == {"data": None}


def test_unknown_path_is_501(api):
    r = api.get("/nodes/pve/no-such-thing")
    assert r.status_code == 501
    assert r.json()["message"].strip() == "Method 'GET /nodes/pve/no-such-thing' not implemented"
