"""A representative set of engines for the engine manifest template
(roles/workloads/templates/engine.yaml.j2): vLLM with a share, a model cache claim, hf_token and a kube-vip
LAN address; a second engine on its card that waits for it (hostPath cache, ClusterIP); a third that waits for
both (a long wait list PyYAML folds); a LAN engine on ServiceLB; an engine with no port, odd strings and
several cards. data/engines-python-dump.txt holds the manifests gpulab wrote for them when it dumped Python
dicts (before the template), byte for byte (text, not linted YAML: PyYAML's layout is what is recorded)."""

from __future__ import annotations

from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "engines-python-dump.txt"
CARD0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
CARD1 = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
GPUS = {
    "vm-gpu": [{"uuid": CARD0}, {"uuid": CARD1}],
    "vm-gpu2": [{"uuid": "GPU-11111111-2222-3333-4444-555555555555"}],
}
ADDRESSES = {"vm-gpu": "192.168.1.52", "vm-gpu2": "192.168.1.53"}
WAIT_IMAGE = "registry.lan:5000/busybox:1.37.0"

ENGINES = [
    {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "node": "vm-gpu",
        "namespace": "ai",
        "gpu_memory_percent": 40,
        "port": 8000,
        "readiness_path": "/health",
        "args": ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--max-model-len", 4096],
        "env": {"VLLM_LOGGING_LEVEL": "INFO", "ON": "on", "EMPTY": "", "NUM": 5},
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}},
        "model_cache_size": "50Gi",
        "hf_token": True,
        "lan": True,
        "lan_address": "192.168.1.240",
        "lan_port": 8080,
    },
    {
        "name": "vllm-small",
        "image": "vllm/vllm-openai:v0.11.0",
        "node": "vm-gpu",
        "namespace": "ai",
        "gpu_memory_percent": 30,
        "port": 8000,
        "readiness_path": "health",
        "args": ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu-memory-utilization=0.25"],
        "model_cache_path": "/var/lib/gpulab/model cache",
    },
    {
        "name": "ollama-with-a-rather-long-name",
        "image": "ollama/ollama:0.12.6",
        "node": "vm-gpu",
        "namespace": "inference-engines",
        "gpu_memory_percent": 20,
        "gpu_cores": 30,
        "port": 11434,
        "readiness_path": "/",
        "command": [
            "sh",
            "-c",
            "ollama serve & sleep 5 && ollama pull llama3.2:1b && wait; echo this line is long",
        ],
        "env": {"OLLAMA_HOST": "0.0.0.0:11434", "LONG": "words " * 20},
    },
    {
        "name": "webui",
        "image": "ghcr.io/open-webui/open-webui:v0.6.5",
        "node": "vm-gpu2",
        "kind": "other",
        "cuda_disable_control": False,
        "gpu_memory_percent": 50,
        "replicas": 2,
        "port": 8080,
        "lan": True,
    },
    {
        "name": "batch",
        "image": "registry.lan:5000/batch:1.0",
        "node": "vm-gpu",
        "gpus": [1, CARD0],
        "gpu_memory_percent": 10,
        "gpu_cores": 10,
        "replicas": 0,
        "cuda_disable_control": True,
        "args": [
            "yes",
            "0.5",
            "null",
            "- dash",
            "key: value",
            "#hash",
            "'quoted'",
            'x"y',
            "tab\there",
            "two\nlines",
        ],
        "env": {"A.B-c": "true", "Y": "1e3"},
        "resources": {"limits": {"cpu": 1}},
    },
]
