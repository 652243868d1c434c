"""Preflight's check of k3s_registries (k3s' registries.yaml): unknown keys, endpoints that are not URLs, rewrites
that are not regex -> string, and credentials never shown."""

import pytest

GOOD = {
    "mirrors": {
        "docker.io": {
            "endpoint": ["https://mirror.lan:5000", "http://10.0.0.9:5000/v2"],
            "rewrite": {"^rancher/(.*)": "mirrorproject/rancher-images/$1"},
        },
        "*": {"endpoint": ["https://mirror.lan:5000"]},
    },
    "configs": {
        "mirror.lan:5000": {
            "auth": {"username": "lab", "password": "Vault-S3cret-pw"},
            "tls": {"ca_file": "/etc/ssl/mirror-ca.pem", "insecure_skip_verify": False},
        },
        "registry-1.docker.io": {"auth": {"identity_token": "Vault-T0ken"}},
    },
}


def test_a_mirror_with_credentials_passes(inv):
    inv.globals["k3s_registries"] = GOOD
    assert inv.messages() == []


BAD = [
    (
        "unknown-top",
        {"mirror": {}},
        "all: k3s_registries.mirror='mirror': unknown key: k3s reads only mirrors, configs here and ignores the "
        "rest. Fix: rename it to mirrors.",
    ),
    (
        "endpoints-typo",
        {"mirrors": {"docker.io": {"endpoints": ["https://mirror.lan"]}}},
        "k3s_registries.mirrors[\"docker.io\"].endpoints='endpoints': unknown key: k3s reads only endpoint, rewrite "
        "here and ignores the rest. Fix: rename it to endpoint.",
    ),
    (
        "endpoint-not-url",
        {"mirrors": {"docker.io": {"endpoint": ["mirror.lan:5000"]}}},
        "k3s_registries.mirrors[\"docker.io\"].endpoint[0]='mirror.lan:5000': not a URL: containerd needs http:// "
        "or https://",
    ),
    (
        "endpoint-string",
        {"mirrors": {"docker.io": {"endpoint": "https://mirror.lan"}}},
        "k3s reads endpoint as a list of URLs",
    ),
    (
        "rewrite-bad-regex",
        {"mirrors": {"docker.io": {"endpoint": ["https://m.lan"], "rewrite": {"^rancher/(.*": "x/$1"}}}},
        'k3s_registries.mirrors["docker.io"].rewrite["^rancher/(.*"]=\'^rancher/(.*\': not a regular expression',
    ),
    (
        "rewrite-not-map",
        {"mirrors": {"docker.io": {"endpoint": ["https://m.lan"], "rewrite": ["^rancher/(.*)"]}}},
        "expected a map of regex -> replacement, got list",
    ),
    (
        "rewrite-value-not-string",
        {"mirrors": {"docker.io": {"endpoint": ["https://m.lan"], "rewrite": {"^a/(.*)": 3}}}},
        "the replacement must be a string",
    ),
    (
        "identitytoken",
        {"configs": {"mirror.lan": {"auth": {"identitytoken": "Vault-T0ken"}}}},
        "Fix: rename it to identity_token.",
    ),
    (
        "cert-without-key",
        {"configs": {"mirror.lan": {"tls": {"cert_file": "/etc/ssl/c.pem"}}}},
        "cert_file and key_file go together",
    ),
    ("bad-host", {"mirrors": {"https://docker.io": {"endpoint": []}}}, "not a registry as an image names it"),
]


@pytest.mark.parametrize("changes, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_mistake_names_the_field_value_why_and_fix(inv, changes, expected):
    inv.globals["k3s_registries"] = changes
    messages = inv.messages()
    assert len(messages) == 1, messages
    assert expected in messages[0]


def test_credentials_are_never_shown(inv):
    inv.globals["k3s_registries"] = {
        "configs": {
            "mirror.lan": {"auth": {"username": "lab", "passwd": "Vault-S3cret-pw", "password": 1234}}
        }
    }
    messages = inv.messages()
    assert len(messages) == 2, messages
    assert not any("Vault-S3cret-pw" in m or "1234" in m for m in messages)
    assert "<hidden>" in " ".join(messages)
