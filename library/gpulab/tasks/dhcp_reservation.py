"""dhcp_reservation: DHCP reservations (MAC -> IPv4 address) on the lab's router, for every router kind."""

from __future__ import annotations

from gpulab.routers import RouterError, make_backend
from gpulab.routers.http import mask
from gpulab.tasks import Failed, Task


def apply(params: dict, check_mode: bool) -> dict:
    """Everything but Ansible: build the backend, stage, apply once. Raises RouterError/ValueError."""
    cfg = {k: params.get(k) for k in ("kind", "address", "subnet", "pool", "user", "password", "url")}
    cfg["validate_certs"] = params.get("validate_certs")
    cfg["ssh"] = params.get("ssh") or {}
    cfg["options"] = params.get("options") or {}
    cfg["name"] = f"the {params['kind']} router at {params['address']}"
    with make_backend(cfg) as router:
        for f in params.get("keep_free") or []:
            router.keep_free(f["address"], f.get("host"), f.get("field"), f.get("what"))
        for r in params["reservations"]:
            if params.get("state", "present") == "absent":
                router.remove(r["mac"])
            else:
                router.ensure(
                    r["mac"],
                    r.get("address"),
                    r.get("hostname"),
                    current_address=r.get("current_address"),
                    name=r.get("name"),
                    expect=r.get("expect"),
                )
        result = router.apply(check_mode=check_mode)
    out = result.as_dict()
    out["diff"] = result.diff()
    return out


def run(task: Task) -> dict:
    p = task.params
    secrets = [p.get("password"), (p.get("ssh") or {}).get("password")]
    try:
        out = apply(p, task.check_mode)
    except (RouterError, ValueError) as e:
        raise Failed(mask(str(e), secrets), {"error_code": getattr(e, "code", "invalid")}) from e
    except Exception as e:  # an unforeseen failure still must not leak a secret
        raise Failed(mask(f"{type(e).__name__}: {e}", secrets), {"error_code": "internal"}) from e
    for note in out["notes"]:  # a cut-off run's half-done write finished (or, in check mode, to finish)
        task.warn(mask(note, secrets))
    diff = out.pop("diff")
    if task.diff:
        out["diff"] = diff
    return out
