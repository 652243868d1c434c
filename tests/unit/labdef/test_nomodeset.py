"""pve_host_nomodeset in the lab definition (issue 43): `gpulab plan` says what stage host does about nomodeset on
each node and why, and preflight refuses a value stage host cannot read."""

from __future__ import annotations

from gpulab import labdef


def test_the_plan_says_auto_turns_nomodeset_on_only_for_a_boot_display_card(inv):
    definition, found = inv.check()
    assert found == []
    plan = labdef.plan_text(definition)
    # the reference's RTX 3090 is the boot display: on, unless the node shows another display adapter
    assert "  nomodeset: auto, on if rtx3090 (the boot display) is the node's only display adapter" in plan
    inv.hosts["pve"]["pve_gpus"][0]["boot_display"] = False
    plan = labdef.plan_text(inv.check()[0])
    assert (
        "nomodeset: off (auto: no card of pve_gpus is the boot display; the NVIDIA blacklist is enough)"
        in plan
    )


def test_the_owners_choice_is_said_and_kept(inv):
    inv.hosts["pve"]["pve_host_nomodeset"] = True
    definition, found = inv.check()
    assert found == []
    assert "nomodeset: on (pve_host_nomodeset: true; any other display adapter" in labdef.plan_text(
        definition
    )
    inv.hosts["pve"]["pve_host_nomodeset"] = "false"
    assert "nomodeset: off (pve_host_nomodeset: false)" in labdef.plan_text(inv.check()[0])


def test_a_value_stage_host_cannot_read_is_refused(inv):
    inv.hosts["pve"]["pve_host_nomodeset"] = "sometimes"
    [problem] = [p for p in inv.check()[1] if p.field == "pve_host_nomodeset"]
    assert (problem.host, problem.value) == ("pve", "sometimes")
    assert "auto" in problem.why and "leave pve_host_nomodeset unset" in problem.fix
