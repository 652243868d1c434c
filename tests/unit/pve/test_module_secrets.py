"""The PVE modules' secrets: no_log, with environment fallbacks (tests/unit/test_module_docs.py checks the docs)."""

from __future__ import annotations

from ansible.module_utils.basic import env_fallback
from plugin_files import argument_spec


def test_secrets_are_no_log_and_have_env_fallbacks():
    spec = argument_spec("pve_vm")
    assert spec["api_token_secret"]["no_log"] and spec["api_password"]["no_log"]
    assert spec["api_token_id"]["no_log"] is False
    assert spec["cloudinit"]["options"]["password"]["no_log"]
    assert spec["api_validate_certs"]["default"] is True
    assert spec["api_token_secret"]["fallback"] == (env_fallback, ["PVE_API_TOKEN_SECRET"])
