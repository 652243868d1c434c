"""gpulab.k8s.image_pulls: the containers that wait for an image they cannot pull, with the kubelet's reason, the
registry's answer and the fix."""

from gpulab.k8s import image_pulls

TOO_MANY = (
    'rpc error: code = Unknown desc = failed to pull and unpack image "docker.io/library/busybox:1.37.0": failed to '
    "copy: httpReadSeeker: failed open: unexpected status code https://registry-1.docker.io/v2/library/busybox/"
    "manifests/sha256:ab: 429 Too Many Requests - Server message: toomanyrequests: You have reached your "
    "unauthenticated pull rate limit. https://www.docker.com/increase-rate-limit"
)
NOT_FOUND = (
    'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/vllm/vllm-openai:v9": failed to '
    'resolve reference "docker.io/vllm/vllm-openai:v9": docker.io/vllm/vllm-openai:v9: not found'
)
DENIED = (
    'rpc error: code = Unknown desc = failed to pull and unpack image "mirror.lan/x/y:1": failed to resolve '
    'reference "mirror.lan/x/y:1": pull access denied, repository does not exist or may require authorization: '
    "server message: insufficient_scope: authorization failed"
)


def pod(waiting, init=False, namespace="kube-system"):
    status = {"name": "c", "state": {"waiting": waiting}}
    spec = {"nodeName": "vm-2", "containers": [{"name": "c", "image": "busybox:1.37.0"}]}
    if init:
        spec["initContainers"] = spec.pop("containers")
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": "p", "namespace": namespace}, "spec": spec, "status": {key: [status]}}


def test_the_causes_the_registry_answers():
    assert image_pulls.cause_of(TOO_MANY) == image_pulls.RATE_LIMIT
    assert image_pulls.cause_of(NOT_FOUND) == image_pulls.NOT_FOUND
    assert image_pulls.cause_of(DENIED) == image_pulls.UNAUTHORIZED
    assert image_pulls.cause_of("401 Unauthorized") == image_pulls.UNAUTHORIZED
    assert image_pulls.cause_of("dial tcp: i/o timeout") == image_pulls.OTHER


def test_a_container_in_back_off_is_named_with_its_image_reason_and_fix():
    back_off = {
        "reason": "ImagePullBackOff",
        "message": f'Back-off pulling image "busybox:1.37.0": {TOO_MANY}',
    }
    [p] = image_pulls.problems({"items": [pod(back_off, init=True)]})
    assert p["host"] == "vm-2" and p["value"] == "busybox:1.37.0" and p["wait"] is False
    assert p["field"] == "pod kube-system/p container c image"
    assert "429 Too Many Requests" in p["cause"] and "ImagePullBackOff" in p["cause"]
    assert "k3s_registries" in p["fix"] and "hami_image_registry" in p["fix"]
    text = image_pulls.problems_text([p])
    assert text.startswith(
        "[1] vm-2: pod kube-system/p container c image = busybox:1.37.0: the registry refuses"
    )


def test_only_pull_reasons_and_the_namespaces_asked():
    running = pod({"reason": "ContainerCreating"})
    pulling = pod({"reason": "ErrImagePull", "message": NOT_FOUND}, namespace="default")
    assert image_pulls.problems({"items": [running]}) == []
    assert len(image_pulls.problems({"items": [running, pulling]})) == 1
    assert image_pulls.problems({"items": [pulling]}, namespaces=["kube-system"]) == []
    assert "k3s_registries" in image_pulls.problems([pulling])[0]["fix"]


def test_a_look_carries_the_pods_on_its_first_line():
    import json

    # kubectl prints its JSON over many lines; the stage's own document follows
    pods = json.dumps({"items": [pod({"reason": "ErrImagePull", "message": DENIED})]}, indent=4)
    look = '{"pulls": ' + pods + '}\n{\n    "nodes": 1\n}\n'
    assert [p["value"] for p in image_pulls.from_look(look)] == ["busybox:1.37.0"]
    assert json.loads(image_pulls.rest_of_look(look)) == {"nodes": 1}
    assert image_pulls.from_look('{"nodes": 1}') == [] and image_pulls.from_look("") == []
