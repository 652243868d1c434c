"""Engines the k3s tests run: the reference pair that shares the RTX 3090 (vLLM first, ollama waiting for
it), and the reference vLLM engine as the lab stack and the workloads plan use it."""

SHARED_CARD = [
    {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "node": "vm-gpu", "gpu_memory_percent": 45,
     "port": 8000, "readiness_path": "/health"},
    {"name": "ollama", "image": "ollama/ollama:0.12.6", "node": "vm-gpu", "gpu_memory_percent": 45,
     "port": 11434},
]  # fmt: skip

VLLM = {
    "name": "vllm",
    "image": "vllm/vllm-openai:v0.11.0",
    "node": "vm-gpu",
    "gpus": [0],
    "gpu_memory_percent": 45,
    "cuda_disable_control": True,
    "port": 8000,
    "readiness_path": "/health",
}
