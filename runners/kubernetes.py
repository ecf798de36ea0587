"""The Kubernetes runner: each run of candidate code in a Pod of its own (docs/sandbox.md).

For workers that run in a Kubernetes cluster, where no Docker engine is at hand and paths of the
worker's pod do not exist on the node. Written with the official ``kubernetes`` client (blocking
calls, each in a thread), through the API server only: no host path, no engine, no privilege.

A run's pod has two containers:

- **main** runs the candidate's command, in the stage's image, at the worker's working folder
  path (an ``emptyDir``), with the stage's declared paths read-only at their own paths: from a
  shared volume (the assets claim, ``sandbox_k8s_volumes``) by ``subPath``, or copied in. It waits
  for a ready mark before it runs anything;
- **porter** (the same image, ``sleep``) holds the volumes: the worker copies the working folder
  and the declared paths in through ``exec`` (a tar stream on stdin), sets the ready mark, and,
  once main has exited, copies the working folder out the same way. Nothing of the candidate runs
  in it, and it shares no process namespace with main.

Isolation: no service-account token, no service links, a non-root user, every capability dropped,
``no-new-privileges``, a read-only root filesystem, ``/tmp`` and ``/dev/shm`` in memory, limits of
memory, CPU and ephemeral storage, the GPUs it requests (the device plugin gives the pod exactly
those), an optional RuntimeClass (gVisor), and a NetworkPolicy of the namespace that denies every
packet to and from pods labelled ``ftbus.io/sandbox`` (deploy/k8s/sandbox.yaml). Output streams
from the pod's log as it is printed; a timeout or a cancel deletes the pod (exit 124 / 130); an
OOM kill comes back as 137. The pod names its worker's pod as owner (Kubernetes' garbage
collector deletes it with a replaced worker pod) and carries its worker's identity, so a worker
starting removes what a dead one left (:func:`reap_pods`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import os
import re
import secrets
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from runners.base import EXIT_CANCELLED, EXIT_OOM_KILLED, EXIT_TIMEOUT, LineCallback, RunOutput, RunResult, check_run
from runners.docker import _pump, parse_size, sandbox_env  # the same output pump as a container's
from runners.quota import EXIT_QUOTA
from runners.sandbox import ALL_GPUS, Sandbox, SandboxUnavailable, gpu_selection, host_identity, owner_alive
from shared.logs import get_logger

log = get_logger("ftbus.sandbox")

LABEL_SANDBOX = "ftbus.io/sandbox"
LABEL_STAGE = "ftbus.io/stage"
LABEL_REQUEST = "ftbus.io/request-id"
ANNOTATION_OWNER = "ftbus.io/owner"          # the worker process: host:pid:start-time
ANNOTATION_OWNER_POD = "ftbus.io/owner-pod"  # the worker's pod, and its uid
ANNOTATION_OWNER_UID = "ftbus.io/owner-uid"
#: The sandbox user (the image's ``ftbus`` user).
SANDBOX_UID = 1000
PORTER = "porter"
MAIN = "main"
_BASE = "/ftbus"  # the porter's view of the volumes; main sees only the ready mark under it
_READY = f"{_BASE}/ctl/ready"
_CHUNK = 256 * 1024
#: Waiting reasons of a container that will not start without someone's help.
_STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
          "CreateContainerError", "RunContainerError"}


def kube_api() -> Any:
    """A CoreV1Api of the cluster this process runs in (its service account), else of the kubeconfig."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import
        except Exception as exc:
            raise SandboxUnavailable(
                f"no Kubernetes API is reachable ({exc}): sandbox=kubernetes is for workers in a cluster "
                "(deploy/k8s); elsewhere set FTBUS_SANDBOX=docker"
            ) from None
    return client.CoreV1Api()


def own_namespace() -> str:
    """The namespace of the pod this runs in (POD_NAMESPACE, else the service account's), else ``default``."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    with contextlib.suppress(OSError):
        return path.read_text().strip() or "default"
    return "default"


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 of [A-Za-z0-9-_.], starting and ending alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63]
    return value.strip("-_.")


def gpu_count(spec: str | None) -> int:
    """How many GPUs a run's pod requests: ``sandbox_gpus`` as a count (device ids count as many)."""
    selection = gpu_selection(spec)
    if selection == ALL_GPUS:
        raise SandboxUnavailable(
            "sandbox_gpus=all cannot be requested from Kubernetes: set a count (FTBUS_SANDBOX_GPUS=1)"
        )
    return len(selection) if isinstance(selection, list) else int(selection)


class KubernetesRunner:
    """Runs each command in a fresh pod of ``image`` (see the module docstring)."""

    def __init__(
        self,
        image: str,
        *,
        stage: str,
        namespace: str,
        api: Any,
        memory: str = "8g",
        cpus: float = 0.0,
        shm: str = "1g",
        tmp_size: str = "2g",
        gpus: int = 0,
        gpu_resource: str = "nvidia.com/gpu",
        runtime_class: str | None = None,
        volumes: Mapping[str, str] | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
        start_timeout_s: float = 900.0,
        kill_grace_s: float = 5.0,
        max_line_chars: int = 64 * 1024,
    ) -> None:
        self.image = image
        self.stage = stage
        self.namespace = namespace
        self.api = api
        self.memory = parse_size(memory)
        self.cpus = cpus
        self.shm = parse_size(shm)
        self.tmp_size = parse_size(tmp_size)
        self.gpus = gpus
        self.gpu_resource = gpu_resource
        self.runtime_class = runtime_class or None
        # Longest prefix first: a path under two shared volumes comes from the closer one.
        self.volumes = dict(sorted((volumes or {}).items(), key=lambda kv: -len(kv[0])))
        self.node_selector = dict(node_selector or {})
        self.tolerations = [dict(t) for t in tolerations]
        self.start_timeout_s = start_timeout_s
        self.kill_grace_s = kill_grace_s
        self.max_line_chars = max_line_chars
        self.owner = host_identity()
        self.owner_pod = os.environ.get("POD_NAME", "")
        self.owner_uid = os.environ.get("POD_UID", "")

    @property
    def name(self) -> str:
        runtime = f"{self.runtime_class}:" if self.runtime_class else ""
        return f"kubernetes:{runtime}{self.image}"

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` unless this worker may list pods in its namespace."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.api.list_namespaced_pod(self.namespace, label_selector=LABEL_SANDBOX, limit=1,
                                         _request_timeout=30)
        except ApiException as exc:
            raise SandboxUnavailable(
                f"the Kubernetes API refused to list pods in namespace {self.namespace!r} ({exc.status} "
                f"{exc.reason}): the worker's service account needs the role of deploy/k8s/sandbox.yaml"
            ) from None
        except Exception as exc:  # connection refused, DNS, TLS
            raise SandboxUnavailable(f"the Kubernetes API is not reachable: {exc}") from None

    # ------------------------------------------------------------------ the pod

    def pod_manifest(self, name: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str], sandbox: Sandbox,
                     request_id: str, copied: Sequence[Path], max_file_bytes: int | None = None,
                     timeout_s: float = math.inf) -> dict[str, Any]:
        """The pod of one run. ``copied``: the declared paths that the worker copies in (the others
        come from shared volumes or the working folder)."""
        main_mounts: list[dict[str, Any]] = [
            {"name": "work", "mountPath": str(cwd)},
            {"name": "ctl", "mountPath": f"{_BASE}/ctl", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ]
        # The disk quota (the per-file cap is the quota): past it the kubelet evicts the pod.
        work: dict[str, Any] = {"sizeLimit": _quantity(max_file_bytes)} if max_file_bytes else {}
        volumes: list[dict[str, Any]] = [
            {"name": "work", "emptyDir": work},
            {"name": "ctl", "emptyDir": {"sizeLimit": "1Mi"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(self.tmp_size)}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(self.shm)}},
        ]
        porter_mounts: list[dict[str, Any]] = [
            {"name": "work", "mountPath": f"{_BASE}/work"},
            {"name": "ctl", "mountPath": f"{_BASE}/ctl"},
        ]
        claims: dict[str, str] = {}
        for target, (kind, where) in self.placements(cwd, sandbox, copied):
            if kind == "copy":
                # A volume of its own (not a subPath of one: a subPath the kubelet creates is root's).
                volumes.append({"name": f"input-{where}", "emptyDir": {}})
                porter_mounts.append({"name": f"input-{where}", "mountPath": f"{_BASE}/inputs/{where}"})
                main_mounts.append({"name": f"input-{where}", "mountPath": target, "readOnly": True})
                continue
            claim, sub = where.split("\0", 1)
            volume = claims.setdefault(claim, f"claim-{len(claims)}")
            mount = {"name": volume, "mountPath": target, "readOnly": True}
            if sub:
                mount["subPath"] = sub
            main_mounts.append(mount)
        for claim, volume in claims.items():
            volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})

        limits: dict[str, str] = {"memory": str(self.memory)}
        requests: dict[str, str] = {"memory": str(self.memory)}
        if self.cpus > 0:
            limits["cpu"] = requests["cpu"] = f"{int(self.cpus * 1000)}m"
        if sandbox.gpus and self.gpus:
            limits[self.gpu_resource] = requests[self.gpu_resource] = str(self.gpus)
        wait = f"while [ ! -e {_READY} ]; do sleep 0.1; done"
        if max_file_bytes:
            wait += f"; ulimit -f {max(1, math.ceil(max_file_bytes / 512))}"  # RLIMIT_FSIZE, in 512-byte blocks
        env_list = [{"name": k, "value": v} for k, v in sandbox_env(self.cpus, env).items()]
        if sandbox.gpus and not self.gpus:
            env_list.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"})  # no GPU: not even through the runtime
        hardened = {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        }
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": int(self.kill_grace_s),
            "securityContext": {
                "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID, "fsGroup": SANDBOX_UID,
                # Never a recursive chown of the assets claim at every run's start.
                "fsGroupChangePolicy": "OnRootMismatch",
                "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": MAIN,
                    "image": self.image,
                    "command": ["/bin/sh", "-c", f'{wait}; exec "$@"', "ftbus-sandbox", *argv],
                    "workingDir": str(cwd),
                    "env": env_list,
                    "resources": {"limits": limits, "requests": requests},
                    "securityContext": hardened,
                    "volumeMounts": main_mounts,
                },
                {
                    "name": PORTER,
                    "image": self.image,
                    "command": ["sleep", "infinity"],
                    "resources": {"limits": {"memory": "256Mi"}, "requests": {"cpu": "50m", "memory": "64Mi"}},
                    "securityContext": hardened,
                    "volumeMounts": porter_mounts,
                },
            ],
            "volumes": volumes,
        }
        if not math.isinf(timeout_s):
            # A safety net for a worker that died: the kubelet ends the pod after this long.
            spec["activeDeadlineSeconds"] = int(self.start_timeout_s + timeout_s + 300)
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        if self.node_selector:
            spec["nodeSelector"] = self.node_selector
        if self.tolerations:
            spec["tolerations"] = self.tolerations
        metadata: dict[str, Any] = {
            "name": name,
            "labels": {
                LABEL_SANDBOX: "true",
                LABEL_STAGE: label_value(self.stage),
                LABEL_REQUEST: label_value(request_id),
                "app.kubernetes.io/name": "ftbus-sandbox",
                "app.kubernetes.io/part-of": "ftbus",
            },
            "annotations": {ANNOTATION_OWNER: self.owner, ANNOTATION_OWNER_POD: self.owner_pod,
                            ANNOTATION_OWNER_UID: self.owner_uid},
        }
        if self.owner_pod and self.owner_uid and self.namespace == own_namespace():
            # Deleted by the garbage collector with the worker's pod (a replaced or deleted worker).
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": self.owner_pod,
                                            "uid": self.owner_uid}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def placements(self, cwd: Path, sandbox: Sandbox,
                   copied: Sequence[Path]) -> list[tuple[str, tuple[str, str]]]:
        """Where each declared path comes from: ``(target, (kind, where))`` with kind ``claim``
        (``claim\\0subPath`` of a shared volume) or ``copy`` (the index, in ``copied``, of a path
        the worker copies in). A path inside the working folder is there already (writable)."""
        out: list[tuple[str, tuple[str, str]]] = []
        seen = {str(cwd)}
        for mount in sandbox.mounts:
            path = Path(mount.path).absolute()
            if str(path) in seen:
                continue
            seen.add(str(path))
            if path.is_relative_to(cwd):
                continue
            shared = self.shared_source(path)
            if shared is not None:
                out.append((str(path), ("claim", f"{shared[0]}\0{shared[1]}")))
            elif path in copied:
                out.append((str(path), ("copy", str(copied.index(path)))))
        return out

    def shared_source(self, path: Path) -> tuple[str, str] | None:
        """``(claim, subPath)`` of the shared volume that holds ``path``, if any."""
        for prefix, claim in self.volumes.items():
            root = Path(prefix)
            if path == root or path.is_relative_to(root):
                return claim, ("" if path == root else str(path.relative_to(root)))
        return None

    def to_copy(self, cwd: Path, sandbox: Sandbox) -> tuple[list[Path], list[str]]:
        """The declared paths the worker must copy in (directories outside the working folder and
        the shared volumes), and a note for each declared path that cannot be shown."""
        copied: list[Path] = []
        notes: list[str] = []
        for mount in sandbox.mounts:
            path = Path(mount.path).absolute()
            if path == cwd or path.is_relative_to(cwd) or self.shared_source(path) is not None or path in copied:
                continue
            if path.is_dir():
                copied.append(path)
            elif path.exists():
                notes.append(f"{path} is a file outside the working folder and the shared volumes: not shown")
        return copied, notes

    # ------------------------------------------------------------------ one run

    async def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float,
                  log_path: Path, on_line: LineCallback | None = None, tail_chars: int = 20000,
                  sandbox: Sandbox | None = None, cancel: asyncio.Event | None = None,
                  request_id: str = "", max_file_bytes: int | None = None) -> RunResult:
        cwd = check_run(argv, cwd, timeout_s)
        sandbox = sandbox or Sandbox()
        request_id = request_id or str(structlog.contextvars.get_contextvars().get("request_id", ""))
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        copied, notes = self.to_copy(cwd, sandbox)
        if sandbox.llm_socket is not None:
            notes.append("no LLM gateway in a Kubernetes sandbox pod: the run has no network at all")
        name = f"ftbus-sbx-{label_value(self.stage)[:20]}-{secrets.token_hex(5)}"
        manifest = self.pod_manifest(name, argv, cwd, dict(env or {}), sandbox, request_id, copied,
                                     max_file_bytes, timeout_s)

        log_file = await asyncio.to_thread(log_path.open, "wb")
        output = RunOutput(log_file, on_line, tail_chars, self.max_line_chars)
        watch = PodWatch(self.api, self.namespace, name)
        created = False
        start = time.monotonic()

        def result(exit_code: int, *, how: str = "exited", oom: bool = False) -> RunResult:
            return RunResult(exit_code=exit_code, timed_out=how == "timeout", cancelled=how == "cancel",
                             duration_s=round(time.monotonic() - start, 3), timeout_s=timeout_s,
                             log_path=log_path, output_tail=output.tail, oom_killed=oom, sandbox=self.name)

        try:
            for note in notes:
                output.note(note)
            await asyncio.to_thread(self.api.create_namespaced_pod, self.namespace, manifest, _request_timeout=60)
            created = True
            watch.start()
            if not await self._started(watch, cancel):
                output.note("killed on request: the run was cancelled")
                return result(EXIT_CANCELLED, how="cancel")
            await asyncio.to_thread(self._copy_in, name, cwd, copied)
            start = time.monotonic()
            how, state = await self._supervise(name, watch, output, timeout_s, cancel)
            if how == "timeout":
                output.note(f"killed after {timeout_s:g} seconds: the stage timeout")
                return result(EXIT_TIMEOUT, how=how)
            if how == "cancel":
                output.note("killed on request: the run was cancelled")
                return result(EXIT_CANCELLED, how=how)
            if how == "evicted":
                output.note(f"evicted by the kubelet: {state} (exit {EXIT_QUOTA}, as for a run over its disk quota)")
                return result(EXIT_QUOTA)
            exit_code = int(state.exit_code)
            oom = state.reason == "OOMKilled"
            try:
                skipped = await asyncio.to_thread(self._copy_out, name, cwd)
            except Exception:
                # An eviction kills both containers; its status may come after main's exit.
                pod = await asyncio.to_thread(self.api.read_namespaced_pod, name, self.namespace,
                                              _request_timeout=30)
                evicted = _evicted(pod)
                if evicted is None:
                    raise
                output.note(f"evicted by the kubelet: {evicted} (exit {EXIT_QUOTA}, as for a run over its disk quota)")
                return result(EXIT_QUOTA)
            if skipped:
                output.note(f"not brought back from the sandbox (links out of the working folder, devices): "
                            f"{', '.join(skipped[:10])}")
            if oom:
                output.note(f"killed by the kernel: out of memory (the sandbox's limit is "
                            f"{self.memory / 2**30:.2f} GiB; exit code 137)")
                exit_code = EXIT_OOM_KILLED
            return result(exit_code, oom=oom)
        finally:
            watch.stop()
            if created:
                await asyncio.shield(asyncio.to_thread(delete_pod, self.api, self.namespace, name))
            log_file.close()

    async def _started(self, watch: PodWatch, cancel: asyncio.Event | None) -> bool:
        """Wait until both containers run (False: cancelled first). Raises when the pod cannot start:
        our trouble (the image, the node, the quota), not the candidate's, so the message is retried."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            pod = watch.latest
            if pod is not None:
                statuses = {s.name: s for s in (pod.status.container_statuses or [])}
                if pod.status.phase in ("Failed", "Succeeded"):
                    raise RuntimeError(f"sandbox pod {watch.name} ended before it ran anything: "
                                       f"{pod.status.reason or pod.status.phase} {pod.status.message or ''}")
                if all(s in statuses and statuses[s].state and statuses[s].state.running for s in (MAIN, PORTER)):
                    return True
                for status in statuses.values():
                    waiting = status.state.waiting if status.state else None
                    if waiting is not None and waiting.reason in _STUCK:
                        raise RuntimeError(f"sandbox pod {watch.name} cannot start {status.name}: {waiting.reason}: "
                                           f"{waiting.message or ''} (the image is {self.image})")
            if cancel is not None and cancel.is_set():
                return False
            if time.monotonic() > deadline:
                why = ""
                if pod is not None:
                    why = "; ".join(f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
                                    for c in (pod.status.conditions or []))
                raise RuntimeError(f"sandbox pod {watch.name} did not start within {self.start_timeout_s:g} s "
                                   f"({why or 'no status'}): is a node with the resources it asks for free?")
            await watch.changed(0.5)

    async def _supervise(self, name: str, watch: PodWatch, output: RunOutput, timeout_s: float,
                         cancel: asyncio.Event | None) -> tuple[str, Any]:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        stop_reading = threading.Event()
        reader = threading.Thread(target=self._stream_log, args=(name, loop, chunks, stop_reading),
                                  name=f"log-{name}", daemon=True)
        reader.start()
        pump = asyncio.ensure_future(_pump(chunks, output))
        deadline = None if math.isinf(timeout_s) else time.monotonic() + timeout_s
        how, state = "exited", None
        try:
            while True:
                evicted = _evicted(watch.latest)
                if evicted is not None:
                    how, state = "evicted", evicted
                    break
                state = watch.terminated(MAIN)
                if state is not None:
                    break
                if cancel is not None and cancel.is_set():
                    how = "cancel"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    how = "timeout"
                    break
                if pump.done() and pump.exception() is not None:
                    pump.result()  # the on_line callback failed
                pod = watch.latest
                if pod is not None and pod.status.phase == "Failed" and watch.terminated(MAIN) is None:
                    raise RuntimeError(f"sandbox pod {name} failed: {pod.status.reason} {pod.status.message}")
                wait = 0.5 if deadline is None else min(0.5, max(deadline - time.monotonic(), 0.01))
                await watch.changed(wait)
            if how in ("timeout", "cancel"):
                await asyncio.to_thread(delete_pod, self.api, self.namespace, name, 0)
            # The log ends when main stops (or its pod goes); give it a moment to deliver the tail.
            await asyncio.wait({pump}, timeout=10)
            return how, state
        finally:
            stop_reading.set()
            if not pump.done():
                pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    def _stream_log(self, name: str, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[bytes | None],
                    stop: threading.Event) -> None:
        try:
            response = self.api.read_namespaced_pod_log(name, self.namespace, container=MAIN, follow=True,
                                                        _preload_content=False)
            try:
                for chunk in response.stream(_CHUNK, decode_content=False):
                    if stop.is_set():
                        break
                    if chunk:
                        loop.call_soon_threadsafe(chunks.put_nowait, bytes(chunk))
            finally:
                response.release_conn()
        except Exception:  # the pod was deleted under us: the run is over
            pass
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
                loop.call_soon_threadsafe(chunks.put_nowait, None)

    # ------------------------------------------------------------------ files in and out

    def _copy_in(self, name: str, cwd: Path, copied: Sequence[Path]) -> None:
        """The working folder and each copied path into the porter's volumes (an exec each), then
        the ready mark with the last one."""
        folders = [(cwd, f"{_BASE}/work"), *((path, f"{_BASE}/inputs/{i}") for i, path in enumerate(copied))]
        for index, (folder, target) in enumerate(folders):
            last = index == len(folders) - 1
            # On the worker's scratch disk, not /tmp: a model's weights do not fit a small /tmp.
            with tempfile.TemporaryFile(dir=cwd.parent) as archive:
                with tarfile.open(fileobj=archive, mode="w") as tar:
                    for child in sorted(folder.iterdir()):  # the contents: the volume's root is not ours
                        tar.add(str(child), arcname=child.name)
                size = archive.tell()
                archive.seek(0)
                # `head -c`: the exact length, so the end of stdin needs no support from the API server.
                script = f"head -c {size} | tar -x -f - -C {target}" + (f" && touch {_READY}" if last else "")
                code, _, err = exec_in(self.api, self.namespace, name, PORTER, ["/bin/sh", "-c", script],
                                       stdin=archive)
            if code != 0:
                raise RuntimeError(f"copying {folder} into sandbox pod {name} failed (exit {code}): "
                                   f"{err.decode(errors='replace')[-500:]}")

    def _copy_out(self, name: str, cwd: Path) -> list[str]:
        """The working folder as main left it, back into ``cwd``; returns the members skipped."""
        with tempfile.TemporaryFile(dir=cwd.parent) as archive:
            code, _, err = exec_in(self.api, self.namespace, name, PORTER,
                                   ["tar", "-c", "-f", "-", "-C", f"{_BASE}/work", "."], stdout=archive)
            if code != 0:
                raise RuntimeError(f"copying the working folder out of sandbox pod {name} failed (exit {code}): "
                                   f"{err.decode(errors='replace')[-500:]}")
            archive.seek(0)
            skipped: list[str] = []

            def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
                # The candidate wrote these files: nothing may land outside cwd, nor be a link out of it.
                try:
                    return tarfile.data_filter(member, dest)
                except tarfile.FilterError:
                    skipped.append(member.name)
                    return None

            with tarfile.open(fileobj=archive, mode="r|") as tar:
                tar.extractall(cwd, filter=keep)
            return skipped


class PodWatch:
    """The latest state of one pod, kept by a watch in a thread (re-opened when the server ends it)."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.latest: Any = None
        self._stop = threading.Event()
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: Any = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._follow, name=f"watch-{self.name}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    async def changed(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        self._changed.clear()

    def terminated(self, container: str) -> Any:
        """The container's terminated state (exit_code, reason), or None while it has not ended."""
        pod = self.latest
        for status in (pod.status.container_statuses or []) if pod is not None else []:
            if status.name == container and status.state is not None and status.state.terminated is not None:
                return status.state.terminated
        return None

    def _set(self, pod: Any) -> None:
        self.latest = pod
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._changed.set)

    def _follow(self) -> None:
        from kubernetes import watch

        selector = f"metadata.name={self.name}"
        while not self._stop.is_set():
            try:
                self._watch = watch.Watch()
                for event in self._watch.stream(self.api.list_namespaced_pod, self.namespace,
                                                field_selector=selector, timeout_seconds=60,
                                                _request_timeout=90):
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._set(event["object"])
                    elif event["type"] == "DELETED":
                        return  # gone: nothing more will happen to it
            except Exception:
                if self._stop.wait(1.0):
                    return
                # The watch broke (a restarted API server): read the pod once, then watch again.
                with contextlib.suppress(Exception):
                    self._set(self.api.read_namespaced_pod(self.name, self.namespace, _request_timeout=30))


# ------------------------------------------------------------------ helpers (blocking: run in threads)


def exec_in(api: Any, namespace: str, pod: str, container: str, command: Sequence[str], *,
            stdin: io.BufferedIOBase | Any = None, stdout: Any = None,
            frame_timeout_s: float = 900.0) -> tuple[int, bytes, bytes]:
    """Run ``command`` in a container of ``pod`` (the API's exec, a websocket): feed it ``stdin``
    (a file, read to its end), write its stdout into ``stdout`` (a file) or return it; returns the
    exit code, stdout (when not written to a file) and stderr.

    The frames are read here, one at a time, straight into ``stdout``: the client's own buffering
    joins every frame that has arrived into one bytes object, which for gigabytes of weights is
    memory and time the worker does not have."""
    from kubernetes import client
    from kubernetes.stream import stream

    # A client of its own: stream() swaps the transport of the ApiClient it is given while it
    # connects, and any call that another thread makes through that ApiClient meanwhile (the other
    # split's create, delete, watch) would go out as a websocket.
    own = client.ApiClient(api.api_client.configuration)
    out = io.BytesIO()
    err = io.BytesIO()
    try:
        ws = stream(client.CoreV1Api(own).connect_get_namespaced_pod_exec, pod, namespace, container=container,
                    command=list(command), stdin=stdin is not None, stdout=True, stderr=True, tty=False,
                    _preload_content=False, binary=True)
    except BaseException:
        own.close()
        raise
    try:
        if stdin is not None:
            while block := stdin.read(_CHUNK):
                ws.write_stdin(block)
            ws.close_channel(0)  # the v5 protocol's end of stdin (the command reads a known length anyway)
        status = _read_frames(ws.sock, stdout if stdout is not None else out, err, frame_timeout_s)
    finally:
        ws.close()
        own.close()
    if status.get("status") == "Success":
        return 0, out.getvalue(), err.getvalue()
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
            return int(cause["message"]), out.getvalue(), err.getvalue()
    err.write(f"\n[ftbus] exec failed: {status.get('message') or status or 'no status from the API server'}".encode())
    return -1, out.getvalue(), err.getvalue()


def _read_frames(sock: Any, stdout: Any, err: io.BytesIO, timeout_s: float) -> dict[str, Any]:
    """Channel frames until the server closes: 1 stdout, 2 stderr, 3 the exec's status (JSON)."""
    from websocket import ABNF, WebSocketTimeoutException

    sock.settimeout(timeout_s)
    status: dict[str, Any] = {}
    while True:
        try:
            opcode, frame = sock.recv_data_frame(True)
        except WebSocketTimeoutException:
            raise RuntimeError(f"exec: nothing from the API server for {timeout_s:g} s") from None
        if opcode == ABNF.OPCODE_CLOSE:
            return status
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
            continue
        data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
        channel, payload = data[0], data[1:]
        if channel == 1:
            stdout.write(payload)
        elif channel == 2:
            err.write(payload)
        elif channel == 3 and payload:
            status = json.loads(payload)


def _evicted(pod: Any) -> str | None:
    """The kubelet's message when it evicted ``pod`` for going over its own limits (its working
    volume's size: the candidate's doing); raises when the node itself ran low (retried elsewhere)."""
    if pod is None or pod.status.reason != "Evicted":
        return None
    message = pod.status.message or "evicted"
    if "node was low on resource" in message:
        raise RuntimeError(f"sandbox pod {pod.metadata.name} was evicted: {message}")
    return message


def _quantity(size: int) -> str:
    return f"{max(1, size // 2**20)}Mi"


def delete_pod(api: Any, namespace: str, name: str, grace_s: int | None = 0) -> None:
    """Delete a pod now (gone already is fine)."""
    from kubernetes.client.exceptions import ApiException

    try:
        api.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s, _request_timeout=60)
    except ApiException as exc:
        if exc.status != 404:
            raise


def reap_pods(api: Any, namespace: str) -> list[str]:
    """Delete sandbox pods whose worker is gone: its pod deleted or replaced (another uid), or, in
    this same pod, an earlier incarnation of the worker process (a restarted container).

    Called when a worker starts, like :func:`runners.docker.reap_containers` on a host. (The
    garbage collector also deletes a sandbox pod with its owner pod; this catches the rest.)"""
    from kubernetes.client.exceptions import ApiException

    me = os.environ.get("POD_NAME", "")
    removed: list[str] = []
    pods = api.list_namespaced_pod(namespace, label_selector=f"{LABEL_SANDBOX}=true", _request_timeout=60)
    for pod in pods.items:
        notes = pod.metadata.annotations or {}
        owner = notes.get(ANNOTATION_OWNER, "")
        owner_pod = notes.get(ANNOTATION_OWNER_POD, "")
        if owner_pod and owner_pod != me:
            try:
                alive = api.read_namespaced_pod(owner_pod, namespace, _request_timeout=30).metadata.uid == \
                    notes.get(ANNOTATION_OWNER_UID, "")
            except ApiException as exc:
                if exc.status != 404:
                    raise
                alive = False
        else:
            alive = owner_alive(owner)  # this pod (or no pod): the process must still run here
        if alive:
            continue
        delete_pod(api, namespace, pod.metadata.name)
        removed.append(pod.metadata.name)
    return removed
