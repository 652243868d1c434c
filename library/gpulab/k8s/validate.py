"""Validate manifests against the Kubernetes OpenAPI schema before anything is applied.

Core kinds are checked with kubernetes-validate (the JSON schemas of each Kubernetes release, shipped offline
in the package) in strict mode, so a misspelt field fails instead of being dropped by the API server. The
HelmChart kind of k3s's helm-controller has no published schema there; `HELMCHART_SCHEMA` below describes
helm.cattle.io/v1 HelmChart from the controller's API types (fields listed in shared/reference/guest-stack.md
section 5.1), again refusing unknown fields.
"""

from __future__ import annotations

import re

import jsonschema

_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_INT = {"type": "integer"}

HELMCHART_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "helm.cattle.io/v1"},
        "kind": {"const": "HelmChart"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 53},
                "namespace": _STR,
                "labels": {"type": "object", "additionalProperties": _STR},
                "annotations": {"type": "object", "additionalProperties": _STR},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "anyOf": [{"required": ["chart"]}, {"required": ["chartContent"]}],
            "properties": {
                "chart": _STR,
                "repo": _STR,
                "version": _STR,
                "targetNamespace": _STR,
                "createNamespace": _BOOL,
                "valuesContent": _STR,
                "set": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}},
                "values": {"type": "object"},
                "valuesSecrets": {"type": "array", "items": {"type": "object"}},
                "bootstrap": _BOOL,
                "helmVersion": {"enum": ["", "v3"]},
                "jobImage": _STR,
                "timeout": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"},
                "failurePolicy": {"enum": ["abort", "reinstall", "retry"]},
                "backOffLimit": _INT,
                "chartContent": _STR,
                "repoCA": _STR,
                "repoCAConfigMap": {"type": "object"},
                "authSecret": {"type": "object"},
                "authPassCredentials": _BOOL,
                "insecureSkipTLSVerify": _BOOL,
                "plainHTTP": _BOOL,
                "dockerRegistrySecret": {"type": "object"},
                "podSecurityContext": {"type": "object"},
                "securityContext": {"type": "object"},
                "takeOwnership": _BOOL,
                "driver": {"enum": ["secret", "configmap"]},
            },
        },
    },
}


class ManifestError(ValueError):
    """A manifest does not validate; the message names the object, the field and the reason."""


def kubernetes_version(k3s_version):
    """`v1.33.5+k3s1` (or `1.33`) as the `1.33` minor release whose schema applies."""
    m = re.match(r"^v?(\d+)\.(\d+)", str(k3s_version))
    if not m:
        raise ValueError(f"{k3s_version!r} is not a Kubernetes/k3s version (v1.MM.P+k3sN)")
    return f"{m.group(1)}.{m.group(2)}"


def _where(doc):
    meta = doc.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{doc.get('kind', '?')} {ns}{meta.get('name', '?')}"


def validate_manifest(doc, k3s_version):
    """Raise ManifestError unless `doc` is valid for that Kubernetes release (strict: unknown fields fail)."""
    if not isinstance(doc, dict):
        raise ManifestError(f"a manifest must be a mapping, not {type(doc).__name__}")
    if doc.get("apiVersion", "").startswith("helm.cattle.io/"):
        errors = sorted(
            jsonschema.Draft7Validator(HELMCHART_SCHEMA).iter_errors(doc), key=lambda e: list(e.path)
        )
        if errors:
            e = errors[0]
            raise ManifestError(f"{_where(doc)}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}")
        return
    try:
        import kubernetes_validate
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ManifestError(
            "kubernetes-validate is needed to check Kubernetes manifests: pip install kubernetes-validate"
        ) from exc
    try:
        kubernetes_validate.validate(doc, kubernetes_version(k3s_version), strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path) or "(top)"
        raise ManifestError(f"{_where(doc)}: {path}: {exc.message}") from None
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        raise ManifestError(f"{_where(doc)}: {exc}") from None
