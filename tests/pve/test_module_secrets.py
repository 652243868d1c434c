"""The PVE modules' secrets: no_log, with environment fallbacks (tests/test_module_docs.py checks the docs)."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_secrets_are_no_log_and_have_env_fallbacks():
    mod = load(ROOT / "plugins" / "modules" / "gpulab_pve_vm.py", "gpulab_pve_vm")
    marker = object()
    spec = mod.build_argument_spec(marker)
    assert spec["api_token_secret"]["no_log"] and spec["api_password"]["no_log"]
    assert spec["api_token_id"]["no_log"] is False
    assert spec["cloudinit"]["options"]["password"]["no_log"]
    assert spec["api_validate_certs"]["default"] is True
    assert spec["api_token_secret"]["fallback"] == (marker, ["PVE_API_TOKEN_SECRET"])
