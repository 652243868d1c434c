"""plugins/filter/router.py router_secrets: the router's secrets module dhcp_reservation gets, from its host."""

from __future__ import annotations

import plugin_files

router_secrets = plugin_files.filters("router")["router_secrets"]


def test_the_set_variables_of_the_routers_host_are_passed_by_option():
    router = {
        "host": "router",
        "secrets": {"ssh_password": "router_ssh_password", "api_token": "router_token"},
    }
    hostvars = {"router": {"router_ssh_password": "s3cret", "router_token": ""}}
    assert router_secrets(router, hostvars) == {"ssh_password": "s3cret"}


def test_a_router_without_secrets_passes_none():
    assert router_secrets({"host": "router", "secrets": {}}, {"router": {}}) == {}
    assert router_secrets({"host": "router", "secrets": {"ssh_password": "unset_var"}}, {"router": {}}) == {}
