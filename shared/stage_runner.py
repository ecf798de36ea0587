"""Which runner a stage that runs candidate code gets, from the ``sandbox`` setting (docs/sandbox.md)."""

from __future__ import annotations

from shared.docker_runner import DockerRunner, engine_client, reap_containers
from shared.logs import get_logger
from shared.runner import LocalRunner, Runner
from shared.sandbox import LOCAL_WARNING, SandboxUnavailable
from shared.settings import Settings

log = get_logger("ftbus.sandbox")


def make_runner(settings: Settings, stage: str) -> Runner:
    """The runner for ``stage`` (data, train, bench), checked to work here.

    ``docker`` and ``auto`` need a reachable engine and the image: without them this raises
    :class:`SandboxUnavailable` (a worker must not fall back to running hostile code unisolated).
    ``local`` is taken only when configured, and says loudly what it gives up. On the way, sandbox
    containers left behind by a dead worker on this host are removed.
    """
    if settings.sandbox == "local":
        log.warning(LOCAL_WARNING, stage=stage)
        toolchain = settings.toolchain_path()
        return LocalRunner(settings.passthrough_env, path_prefix=[toolchain] if toolchain else [])
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


def describe_sandbox(settings: Settings) -> str:
    """One line for `ftbus up` and operators: what candidate code will run under."""
    if settings.sandbox == "local":
        return "local (NO isolation: development only)"
    return f"docker ({settings.sandbox_image})"


__all__ = ["SandboxUnavailable", "describe_sandbox", "make_runner"]
