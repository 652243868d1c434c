#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Check HAMi chart values against the pinned chart version and render the k3s HelmChart manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hami_values
short_description: Check HAMi chart values and render the k3s HelmChart that installs HAMi
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Builds the values of the HAMi chart from the options, checks every key against the key facts of the
    pinned chart version (kept in the gpulab package, generated from that version's C(values.yaml)), and
    returns the C(helm.cattle.io/v1) C(HelmChart) manifest for k3s's auto-deploy manifests directory.
  - Refuses a key the chart version does not have, because Helm silently ignores it.
  - Refuses a node selector value that is not a string (YAML 1.1 reads a bare C(on) as V(true)).
extends_documentation_fragment:
  - gpulab.homelab.compute
  - gpulab.homelab.attributes
options:
  chart_version:
    description: HAMi chart version; key facts must exist for it in the gpulab package.
    type: str
    required: true
  device_split_count:
    description: C(devicePlugin.deviceSplitCount), the tasks that may share one card.
    type: int
    default: 10
  device_memory_scaling:
    description: C(devicePlugin.deviceMemoryScaling); above 1 oversubscribes card memory.
    type: float
    default: 1
  runtime_class_name:
    description: C(devicePlugin.runtimeClassName), the RuntimeClass of the device plugin and of GPU pods.
    type: str
    default: nvidia
  node_selector:
    description: C(devicePlugin.nvidiaNodeSelector), the labels of the GPU nodes.
    type: dict
    default: {gpu: "on"}
  kube_scheduler_image:
    description:
      - C(scheduler.kubeScheduler.image); empty or missing keys are left to the chart.
      - Leave O(kube_scheduler_image.tag) empty to take O(kube_version)'s, or with that empty too to let the
        chart derive it from the cluster's version.
    type: dict
    default: {}
    suboptions:
      registry:
        description: Image registry.
        type: str
      repository:
        description: Image repository.
        type: str
      tag:
        description: Image tag.
        type: str
  extra_values:
    description: More chart values, merged last; each key is checked like the others.
    type: dict
    default: {}
  kube_version:
    description:
      - The cluster's k3s release, e.g. V(v1.33.5+k3s1). With O(kube_scheduler_image.tag) empty the tag is this
        release without its C(+k3s) suffix, as the chart derives it, so that the HelmChart changes with a k3s
        upgrade (k3s' helm controller runs helm again only when the HelmChart changes).
      - Empty leaves the tag to the chart.
    type: str
    default: ""
  image_registry:
    description:
      - The registry of every image of the chart (its C(global.imageRegistry)), for a mirror the nodes can reach;
        empty keeps each image's own registry.
    type: str
    default: ""
  name:
    description: HelmChart name, which is also the Helm release name.
    type: str
    default: hami
  namespace:
    description: Namespace of the HelmChart and of the chart's objects.
    type: str
    default: kube-system
  repo:
    description: Chart repository URL.
    type: str
    default: https://project-hami.github.io/HAMi/
  timeout:
    description: Helm timeout of the install job (Go duration).
    type: str
    default: 10m0s
notes:
  - Write RV(manifest) with M(ansible.builtin.copy) to install it.
"""

EXAMPLES = r"""
- name: Render the HAMi HelmChart
  gpulab.homelab.hami_values:
    chart_version: 2.10.0
    device_split_count: 10
    node_selector:
      gpu: "on"
  delegate_to: localhost
  register: hami_chart

- name: Install it through k3s's manifests directory
  ansible.builtin.copy:
    content: "{{ hami_chart.manifest }}"
    dest: /var/lib/rancher/k3s/server/manifests/hami.yaml
    mode: "0600"
"""

RETURN = r"""
values:
  description: The chart values, as checked.
  returned: success
  type: dict
values_content:
  description: The values as YAML text (the HelmChart's C(valuesContent)).
  returned: success
  type: str
manifest:
  description: The HelmChart manifest as YAML text, with a header comment.
  returned: success
  type: str
keys_known:
  description: How many value keys the chart version's facts list.
  returned: success
  type: int
"""

from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    chart_version=dict(type="str", required=True),
    device_split_count=dict(type="int", default=10),
    device_memory_scaling=dict(type="float", default=1),
    runtime_class_name=dict(type="str", default="nvidia"),
    node_selector=dict(type="dict", default=dict(gpu="on")),
    kube_scheduler_image=dict(
        type="dict",
        default={},
        options=dict(registry=dict(type="str"), repository=dict(type="str"), tag=dict(type="str")),
    ),
    image_registry=dict(type="str", default=""),
    kube_version=dict(type="str", default=""),
    extra_values=dict(type="dict", default={}),
    name=dict(type="str", default="hami"),
    namespace=dict(type="str", default="kube-system"),
    repo=dict(type="str", default="https://project-hami.github.io/HAMi/"),
    timeout=dict(type="str", default="10m0s"),
)
RULES = {}


def main():
    run_module(ARGUMENT_SPEC, RULES, "hami_values")  # AnsibleModule, then gpulab.tasks.hami_values


if __name__ == "__main__":
    main()
