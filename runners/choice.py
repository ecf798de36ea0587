"""Which runner a stage that runs candidate code gets, from the ``sandbox`` setting (docs/sandbox.md)."""

from __future__ import annotations

from runners.base import LocalRunner, Runner
from runners.docker import DockerRunner, engine_client, reap_containers
from runners.sandbox import LOCAL_WARNING, SandboxUnavailable
from shared.logs import get_logger
from shared.settings import Settings

log = get_logger("ftbus.sandbox")


def make_runner(settings: Settings, stage: str) -> Runner:
    """The runner for ``stage`` (data, train, bench), checked to work here.

    ``docker`` and ``auto`` need a reachable engine and the image: without them this raises
    :class:`SandboxUnavailable` (a worker must not fall back to running hostile code unisolated).
    ``local`` is taken only when configured, and says loudly what it gives up. ``kubernetes`` starts
    a pod per run through the Kubernetes API (:func:`make_kubernetes_runner`). On the way, sandbox
    containers (or pods) left behind by a dead worker are removed.
    """
    if settings.sandbox == "local":
        log.warning(LOCAL_WARNING, stage=stage)
        toolchain = settings.toolchain_path()
        return LocalRunner(settings.passthrough_env, path_prefix=[toolchain] if toolchain else [],
                           cpus=settings.sandbox_cpus)
    if settings.sandbox == "kubernetes":
        return make_kubernetes_runner(settings, stage)
    client = engine_client()
    runner = DockerRunner(
        settings.sandbox_stage_images.get(stage, settings.sandbox_image),
        stage=stage,
        memory=settings.sandbox_memory,
        cpus=settings.sandbox_cpus,
        pids=settings.sandbox_pids,
        shm=settings.sandbox_shm,
        tmp_size=settings.sandbox_tmp,
        gpus=settings.sandbox_gpus,
        client=client,
    )
    runner.check()
    removed = reap_containers(client)
    if removed:
        log.warning("removed sandbox containers left by a dead worker", containers=removed, stage=stage)
    return runner


def make_kubernetes_runner(settings: Settings, stage: str) -> Runner:
    """A pod per run through the Kubernetes API (the worker runs in a cluster: deploy/k8s), checked
    to be allowed; pods left by a replaced or dead worker are deleted on the way."""
    from runners.kubernetes import KubernetesRunner, gpu_count, kube_api, own_namespace, reap_pods

    if stage == "bench" and settings.bench_backend == "lm-eval" and settings.bench_engine == "warm":
        raise SandboxUnavailable(
            "the warm benchmark engine needs a folder it shares with its worker, which a pod of its own does "
            "not have: set FTBUS_BENCH_ENGINE=cold with FTBUS_SANDBOX=kubernetes (deploy/k8s/bench.yaml does)"
        )
    namespace = settings.sandbox_k8s_namespace or own_namespace()
    api = kube_api()
    runner = KubernetesRunner(
        settings.sandbox_stage_images.get(stage, settings.sandbox_image),
        stage=stage,
        namespace=namespace,
        api=api,
        memory=settings.sandbox_memory,
        cpus=settings.sandbox_cpus,
        shm=settings.sandbox_shm,
        tmp_size=settings.sandbox_tmp,
        gpus=gpu_count(settings.sandbox_gpus),
        gpu_resource=settings.sandbox_k8s_gpu_resource,
        runtime_class=settings.sandbox_k8s_runtime_class,
        volumes=settings.sandbox_k8s_volumes,
        node_selector=settings.sandbox_k8s_node_selector,
        tolerations=settings.sandbox_k8s_tolerations,
        start_timeout_s=settings.sandbox_k8s_start_timeout_s,
    )
    runner.check()
    removed = reap_pods(api, namespace)
    if removed:
        log.warning("removed sandbox pods left by a replaced or dead worker", pods=removed, stage=stage)
    return runner


def describe_sandbox(settings: Settings) -> str:
    """One line for `ftbus up` and operators: what candidate code will run under."""
    if settings.sandbox == "local":
        return "local (NO isolation: development only)"
    if settings.sandbox == "kubernetes":
        return f"kubernetes (a pod per run of {settings.sandbox_image})"
    return f"docker ({settings.sandbox_image})"


__all__ = ["SandboxUnavailable", "describe_sandbox", "make_runner"]
