"""The access room (labsim.pve_access): roles, users, API tokens and ACLs under /access, kept in the lab's
state and read at every request, and the node's certificate info."""

from __future__ import annotations

from unit.labsim.pve_sim_client import Api


def test_a_role_is_made_changed_and_removed_and_builtin_ones_stay(root):
    root.data("POST", "/access/roles", roleid="Watcher", privs="VM.Audit")
    r = root.post("/access/roles", roleid="Watcher", privs="VM.Audit")
    assert r.status_code == 500 and r.json()["message"].strip() == "role 'Watcher' already exists"
    root.data("PUT", "/access/roles/Watcher", privs="Sys.Audit", append=1)
    assert root.data("GET", "/access/roles/Watcher") == {"Sys.Audit": 1, "VM.Audit": 1}
    r = root.post("/access/roles", roleid="Typo", privs="VM.Audti")
    assert r.status_code == 400 and r.json()["errors"] == {"privs": "invalid privilege 'VM.Audti'"}
    r = root.put("/access/roles/PVEAuditor", privs="VM.Audit")
    assert (
        r.status_code == 500 and r.json()["message"].strip() == "cannot modify predefined role 'PVEAuditor'"
    )
    listed = {r["roleid"]: r for r in root.data("GET", "/access/roles")}
    assert listed["Administrator"]["special"] == 1 and listed["Watcher"]["special"] == 0
    root.data("DELETE", "/access/roles/Watcher")
    r = root.get("/access/roles/Watcher")
    assert r.status_code == 500 and r.json()["message"].strip() == "role 'Watcher' does not exist"


def test_a_new_token_gets_its_privileges_from_the_acl_at_each_request(lab, root):
    root.data("POST", "/access/users", userid="ops@pve", comment="operators")
    made = root.data("POST", "/access/users/ops@pve/token/cli", privsep=1)
    assert made["full-tokenid"] == "ops@pve!cli" and made["info"] == {"privsep": "1"}
    token = Api(lab.url, headers={"Authorization": f"PVEAPIToken=ops@pve!cli={made['value']}"})
    r = token.get("/nodes/pve/hardware/pci")
    assert r.status_code == 403
    root.data("POST", "/access/roles", roleid="HwRead", privs="Sys.Audit")
    root.data("PUT", "/access/acl", path="/", roles="HwRead", users="ops@pve")
    assert (
        token.get("/nodes/pve/hardware/pci").status_code == 403
    )  # privilege separation: the token's own ACL
    root.data("PUT", "/access/acl", path="/", roles="HwRead", tokens="ops@pve!cli")
    assert token.get("/nodes/pve/hardware/pci").status_code == 200
    acl = root.data("GET", "/access/acl")
    assert {"path": "/", "type": "token", "ugid": "ops@pve!cli", "roleid": "HwRead"}.items() <= next(
        e for e in acl if e["ugid"] == "ops@pve!cli"
    ).items()
    tokens = root.data("GET", "/access/users/ops@pve/token")
    assert tokens == [{"tokenid": "cli", "privsep": 1, "expire": 0}]
    assert "value" not in root.data("GET", "/access/users/ops@pve/token/cli")  # the secret is shown once
    root.data("DELETE", "/access/users/ops@pve")
    assert token.get("/nodes/pve/hardware/pci").status_code == 401
    assert all(not e["ugid"].startswith("ops@pve") for e in root.data("GET", "/access/acl"))


def test_user_refusals(root):
    r = root.post("/access/users", userid="x@nowhere")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "create user failed: domain 'nowhere' does not exist"
    r = root.delete("/access/users/root@pam")
    assert r.status_code == 500
    assert r.json()["message"].strip() == "delete user failed: cannot delete the root@pam user"
    r = root.get("/access/users/nobody@pve")
    assert r.status_code == 500 and r.json()["message"].strip() == "no such user ('nobody@pve')"


def test_the_bootstrapped_project_access_is_listed(root):
    roles = {r["roleid"]: r for r in root.data("GET", "/access/roles")}
    assert "Mapping.Use" in roles["gpulab"]["privs"].split(",")
    user = root.data("GET", "/access/users/gpulab@pve")
    assert user["tokens"] == {"ansible": {"privsep": 1, "expire": 0}}


def test_certificate_info_is_the_labs_certificate(lab, root):
    (info,) = root.data("GET", "/nodes/pve/certificates/info")
    assert info["fingerprint"] == lab.desc["fingerprint"]
