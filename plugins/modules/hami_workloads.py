#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Plan the GPU engines of the inventory as HAMi workloads: manifests, card shares and start order."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hami_workloads
short_description: Plan GPU engines as HAMi workloads pinned to cards by UUID
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Turns the inventory's engines into a Deployment (and a Service when a port is served) each. Cards are
    pinned by UUID (C(nvidia.com/use-gpuuuid)) from the GPU facts of the guests stage, with a number of cards
    (C(nvidia.com/gpu)) and a share of each (C(nvidia.com/gpumem-percentage)), the C(nvidia) RuntimeClass,
    and C(CUDA_DISABLE_CONTROL=true) for engines that size their own memory (vLLM).
  - Refuses a plan that puts a card above 100 % of its memory, or shares a card's cores in a way HAMi's scheduler
    would leave an engine Pending (all 100 cores beside another engine, more than 100, or all 100 taken beside an
    engine without C(gpu_cores)), before anything is applied.
  - Returns the engines in start order; an engine that shares a card with a later one is marked
    RV(engines[].wait_ready) so that the next one starts only once it is Ready.
  - The order also holds on every later start of the pods (a node reboot, an eviction, a reschedule), kept by
    the cluster itself. An engine that shares a card with earlier ones gets an init container,
    C(wait-for-earlier-engines), that polls each earlier engine's readiness path through its Service
    (RV(engines[].waits_for)) and ends only when every one answers. An engine that a later one waits for
    therefore needs C(port) and C(readiness_path).
  - A vLLM engine (C(kind=vllm), the default for an image named like C(*vllm*)) runs with HAMi-core off
    (C(cuda_disable_control), default true for vLLM), so its share is bookkeeping only. It gets
    C(--gpu-memory-utilization) equal to its share (45 % is C(0.45)). A value already in its C(args) or C(command)
    is kept when it is above 0 and not above the share, and refused otherwise.
extends_documentation_fragment:
  - gpulab.homelab.compute
  - gpulab.homelab.attributes
options:
  engines:
    description:
      - The engines, in start order. Keys are C(name), C(image), C(node) (required), C(gpus) (card indexes
        into the node's GPU facts or GPU UUIDs, default C([0])), C(gpu_memory_percent) (1-100, default 100),
        C(gpu_cores), C(cuda_disable_control) (default true for vLLM), C(kind) (C(vllm) or C(other)),
        C(namespace), C(replicas), C(command), C(args), C(env), C(port), C(readiness_path), C(resources),
        C(lan), C(lan_address), C(lan_port), C(model_cache_size), C(model_cache_path), C(hf_token).
      - An engine with C(lan=true) gets a LoadBalancer Service on C(lan_port) (default C(port)). It is served by
        k3s' ServiceLB on its node's address, or at C(lan_address) by kube-vip (C(loadBalancerClass)
        C(kube-vip.io/kube-vip-class), annotation C(kube-vip.io/loadbalancerIPs)).
      - C(model_cache_size) adds a PersistentVolumeClaim of that size (k3s' C(local-path) class), C(model_cache_path)
        a hostPath folder of the node; either is mounted at C(/root/.cache/huggingface), the image's Hugging Face
        cache, so a restarted pod reads its model from it. C(hf_token=true) sets C(HF_TOKEN) from the Secret
        C(gpulab-hf-token) (key C(token)).
    type: list
    elements: dict
    required: true
  gpus_by_node:
    description: Each GPU node's GPU facts (the C(gpus) list returned by gpu_facts), by inventory host.
    type: dict
    required: true
  k3s_version:
    description:
      - When set, every object is validated against that Kubernetes release's OpenAPI schema (needs the
        kubernetes-validate Python package on the controller).
    type: str
  wait_image:
    description:
      - Image of the init container that waits for the earlier engines on a card. It needs C(sh), C(sleep) and
        a C(wget) that fails on an HTTP error, as busybox has them. The default is C(busybox:1.37.0).
    type: str
  addresses:
    description:
      - Each GPU node's LAN address, by inventory host; a LAN engine without C(lan_address) answers on its node's
        address (RV(engines[].lan)).
    type: dict
  template:
    description:
      - The template that lays out each engine's objects from RV(engines[].objects); role workloads passes its own
        C(templates/engine.yaml.j2). The plan renders it (as Ansible's template lookup would) and validates that
        very text, RV(engines[].manifest). The default is the checkout's C(roles/workloads/templates/engine.yaml.j2).
    type: path
"""

EXAMPLES = r"""
- name: Plan the engines
  gpulab.homelab.hami_workloads:
    engines:
      - name: vllm
        image: vllm/vllm-openai:v0.11.0
        node: vm-gpu
        gpus: [0]
        gpu_memory_percent: 45
        cuda_disable_control: true
        port: 8000
        readiness_path: /health
    gpus_by_node:
      vm-gpu: "{{ hostvars['vm-gpu'].gpulab_gpus }}"
  delegate_to: localhost
  register: plan
"""

RETURN = r"""
engines:
  description: The engines in start order.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Engine (Deployment) name.
      type: str
    namespace:
      description: Namespace.
      type: str
    node:
      description: Inventory host of its cards.
      type: str
    cards:
      description: The pinned card UUIDs.
      type: list
      elements: str
    objects:
      description:
        - What the engine's objects hold, as plain data the template lays out (C(claim), C(wait), C(container),
          C(volume), C(service), ...); every decision is made by the plan.
      type: dict
    manifest:
      description: The objects as YAML text, the template rendered from RV(engines[].objects).
      type: str
    after:
      description: Earlier engines sharing a card with this one.
      type: list
      elements: str
    wait_ready:
      description: Whether a later engine shares a card, so this one must be Ready before it starts.
      type: bool
    waits_for:
      description:
        - Readiness URLs of the earlier engines on its cards (their Services), which its init container polls on
          every start of its pod. The list is empty when it waits for nobody.
      type: list
      elements: str
    gpu_memory_utilization:
      description: The C(--gpu-memory-utilization) added to a vLLM engine's args, or null when none is added.
      type: str
    lan:
      description:
        - Where a LAN engine answers (C(address), C(port), C(url), the OpenAI-compatible base URL, and C(kube_vip),
          whether kube-vip announces the address); null for an engine not on the LAN.
      type: dict
    hf_token:
      description: Whether the engine reads C(HF_TOKEN) from the Secret C(gpulab-hf-token).
      type: bool
cards:
  description: Each card's total memory share in percent.
  returned: success
  type: dict
"""

from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    engines=dict(type="list", elements="dict", required=True),
    gpus_by_node=dict(type="dict", required=True),
    k3s_version=dict(type="str"),
    wait_image=dict(type="str"),
    addresses=dict(type="dict"),
    template=dict(type="path"),
)
RULES = {}


def main():
    run_module(ARGUMENT_SPEC, RULES, "hami_workloads")  # AnsibleModule, then gpulab.tasks.hami_workloads


if __name__ == "__main__":
    main()
