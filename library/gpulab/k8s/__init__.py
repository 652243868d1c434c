"""Kubernetes manifests for the k3s stages: generation (workloads) and validation against the API schema."""
