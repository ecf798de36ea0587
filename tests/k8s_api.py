"""A local stand-in for the Kubernetes API server, for the calls the Kubernetes runner makes.

No Kubernetes can run here, so the runner's tests point the real ``kubernetes`` client at this
HTTP server on 127.0.0.1. It speaks the API's wire formats for: create, read, list (label and field
selectors), watch (a chunked stream of JSON events), delete a pod; a container's log (follow: a
chunked stream); exec (a websocket with the ``v5.channel.k8s.io``/``v4.channel.k8s.io`` channel
protocol: stdin 0, stdout 1, stderr 2, the status on 3, a v5 close of stdin); and create, read,
replace a Secret (``stringData`` stored as base64 ``data``, a stale ``resourceVersion`` refused).

Its "kubelet" runs each container of a pod in one of two ways:

- ``runtime="process"``: as a local process; each volume is a folder, and every mount path in the
  container's command, working folder and environment is rewritten to its folder. What runs is
  real (the runner's tar streams, the candidate's shell), but nothing is isolated and no image is
  used. A container killed by SIGKILL reports ``OOMKilled``, as the kubelet does for a container
  the kernel killed for memory;
- ``runtime="docker"``: as a container of the local Docker engine, from the pod's image, as the
  kubelet would ask a container runtime: its user and fsGroup, read-only root, every capability
  dropped, no privilege escalation, its memory limit (an OOM kill is the kernel's), its mounts at
  their paths (read-only where asked), no network (what the deny-all NetworkPolicy gives a run's
  pod); exec is `docker exec`, the log `docker logs`. An exit by SIGKILL (137) reports ``OOMKilled``
  here too: Docker's own flag can lag the exit.

Neither is a kubelet: scheduling, image pulls, a network plugin's policies, RuntimeClasses and
device plugins are Kubernetes' own and are proven only on a real cluster (docs/sandbox.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    return web.json_response(body, status=code)


def _matches(pod: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    have = pod["metadata"].get("labels") or {}
    for term in filter(None, (labels or "").split(",")):
        key, _, value = term.partition("=")
        if key not in have or (value and have[key] != value):
            return False
    for term in filter(None, (fields or "").split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and pod["metadata"]["name"] != value:
            return False
    return True


class Container:
    """One container of a pod, run as a local process."""

    def __init__(self, pod: FakePod, spec: dict[str, Any]) -> None:
        self.pod = pod
        self.spec = spec
        self.name: str = spec["name"]
        self.log = pod.root / f"{self.name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.container_id = ""
        self.mounts = sorted(self._mounts(), key=lambda m: -len(m[0]))
        names = "|".join(re.escape(m) for m, _ in self.mounts)
        self._pattern = re.compile(rf"(?<![\w.-])({names})(?=/|$|[^\w.-])") if self.mounts else None

    def _mounts(self) -> Iterator[tuple[str, Path]]:
        volumes = {v["name"]: v for v in self.pod.body["spec"].get("volumes", [])}
        for mount in self.spec.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:
                base = self.pod.server.claims[volume["persistentVolumeClaim"]["claimName"]]
            else:
                base = self.pod.root / "volumes" / mount["name"]
                base.mkdir(parents=True, exist_ok=True)
            yield mount["mountPath"], base / mount.get("subPath", "")

    def host(self, text: str) -> str:
        """``text`` with every mount path of this container replaced by its folder here."""
        if self._pattern is None:
            return text
        folders = dict(self.mounts)
        return self._pattern.sub(lambda m: str(folders[m.group(1)]), text)

    def environment(self) -> dict[str, str]:
        env = {"PATH": self.pod.server.path}  # the image's PATH
        env.update({e["name"]: self.host(e.get("value", "")) for e in self.spec.get("env", [])})
        return env

    def cwd(self) -> str:
        return self.host(self.spec.get("workingDir", str(self.pod.root)))

    def docker_run_argv(self) -> list[str]:
        """`docker run` of this container, as a kubelet would ask a container runtime."""
        pod_context = self.pod.body["spec"].get("securityContext", {})
        context = {**pod_context, **self.spec.get("securityContext", {})}
        argv = ["docker", "run", "-d", "--network", "none", "--label", f"ftbus.test-kubelet={self.pod.server.tag}"]
        if "runAsUser" in context:
            argv += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', context['runAsUser'])}"]
        if "fsGroup" in pod_context:
            argv += ["--group-add", str(pod_context["fsGroup"])]
        if context.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        if "ALL" in context.get("capabilities", {}).get("drop", []):
            argv += ["--cap-drop", "ALL"]
        if context.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        memory = self.spec.get("resources", {}).get("limits", {}).get("memory")
        if memory and str(memory).isdigit():
            argv += ["--memory", str(memory), "--memory-swap", str(memory)]
        read_only = {m["mountPath"]: m.get("readOnly", False) for m in self.spec.get("volumeMounts", [])}
        for mount_path, folder in self.mounts:
            argv += ["-v", f"{folder}:{mount_path}" + (":ro" if read_only.get(mount_path) else "")]
        for item in self.spec.get("env", []):
            argv += ["-e", f"{item['name']}={item.get('value', '')}"]
        if self.spec.get("workingDir"):
            argv += ["-w", self.spec["workingDir"]]
        command = [*self.spec.get("command", []), *self.spec.get("args", [])]
        return [*argv, "--entrypoint", command[0], self.spec["image"], *command[1:]]

    async def start(self) -> None:
        if self.pod.server.runtime == "docker":
            await self._start_in_docker()
            return
        argv = [self.host(a) for a in [*self.spec.get("command", []), *self.spec.get("args", [])]]
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, cwd=self.cwd(), env=self.environment(), stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True,
            )
        self.pod.set_state(self.name, {"running": {"startedAt": _now()}})
        self.pod.server.tasks.append(asyncio.ensure_future(self._wait()))

    async def _start_in_docker(self) -> None:
        for _, folder in self.mounts:
            if self.pod.root in folder.parents:
                folder.chmod(0o777)  # as a kubelet makes an emptyDir
        try:
            self.container_id = (await _run(*self.docker_run_argv())).strip()
        except RuntimeError as exc:
            self.pod.set_state(self.name, {"waiting": {"reason": "CreateContainerError", "message": str(exc)}})
            return
        with self.log.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                "docker", "logs", "-f", self.container_id, stdout=log, stderr=log, start_new_session=True)
        self.pod.set_state(self.name, {"running": {"startedAt": _now()}})
        self.pod.server.tasks.append(asyncio.ensure_future(self._wait_in_docker()))

    async def _wait_in_docker(self) -> None:
        code = int((await _run("docker", "wait", self.container_id)).strip() or -1)
        # Docker's OOMKilled comes from containerd's OOM event, which may land after the exit that
        # `docker wait` returns (the flag then reads false for a kernel kill). Nothing but the kernel
        # SIGKILLs a container of this stand-in while its pod lives (a deleted pod returns below),
        # so an exit of 137 is an OOM kill too, as for the process runtime's SIGKILL.
        flag = (await _run("docker", "inspect", "-f", "{{.State.OOMKilled}}", self.container_id)).strip()
        oom = flag == "true" or code == 128 + signal.SIGKILL
        assert self.proc is not None
        await self.proc.wait()  # `docker logs -f` ends with the container: the log file is complete
        if self.pod.deleted:
            return
        reason = "OOMKilled" if oom else "Completed" if code == 0 else "Error"
        self.pod.set_state(self.name, {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _now()}})

    def exec_argv(self, command: list[str], with_stdin: bool) -> list[str]:
        if self.pod.server.runtime == "docker":
            return ["docker", "exec", *(["-i"] if with_stdin else []), self.container_id, *command]
        return [self.host(c) for c in command]

    async def _wait(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self.pod.deleted:
            return
        if code < 0:
            reason, code = ("OOMKilled" if -code == signal.SIGKILL else "Error"), 128 - code
        else:
            reason = "Completed" if code == 0 else "Error"
        self.pod.set_state(self.name, {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _now()}})

    def kill(self) -> None:
        if self.container_id:
            subprocess.run(["docker", "rm", "-f", self.container_id], capture_output=True, timeout=120, check=False)
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class FakePod:
    def __init__(self, server: FakeKubernetes, namespace: str, body: dict[str, Any]) -> None:
        self.server = server
        self.body = body
        self.name: str = body["metadata"]["name"]
        self.namespace = namespace
        self.root = server.root / f"{namespace}-{self.name}"
        self.root.mkdir(parents=True)
        self.deleted = False
        meta = body["metadata"]
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
        body["status"] = {"phase": "Pending", "containerStatuses": [
            {"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0, "imageID": "",
             "state": {"waiting": {"reason": "ContainerCreating"}}} for c in body["spec"]["containers"]]}
        self.containers = {c["name"]: Container(self, c) for c in body["spec"]["containers"]}

    def set_state(self, container: str, state: dict[str, Any]) -> None:
        statuses = self.body["status"]["containerStatuses"]
        for status in statuses:
            if status["name"] == container:
                status["state"] = state
                status["ready"] = "running" in state
        states = [s["state"] for s in statuses]
        if all("terminated" in s for s in states):
            failed = any(s["terminated"]["exitCode"] != 0 for s in states)
            self.body["status"]["phase"] = "Failed" if failed else "Succeeded"
        elif any("running" in s for s in states):
            self.body["status"]["phase"] = "Running"
        self.server.publish("MODIFIED", self)

    async def start(self) -> None:
        images = {c["image"] for c in self.body["spec"]["containers"]}
        if images & self.server.missing_images:
            for name in self.containers:
                self.set_state(name, {"waiting": {"reason": "ErrImagePull",
                                                  "message": "pull access denied, repository does not exist"}})
            return
        for container in self.containers.values():
            await container.start()

    def evict(self, message: str) -> None:
        """What the kubelet does to a pod over its ephemeral storage: kill it, mark it Failed/Evicted."""
        for container in self.containers.values():
            container.kill()
        self.body["status"].update(phase="Failed", reason="Evicted", message=message)
        self.server.publish("MODIFIED", self)

    def delete(self) -> None:
        self.deleted = True
        for container in self.containers.values():
            container.kill()


class FakeKubernetes:
    """The server; ``url`` for the client's ``Configuration.host``. ``claims``: PVC name -> folder;
    ``path``: the PATH every container gets (an image's own, e.g. with its toolchain first)."""

    def __init__(self, root: Path, claims: dict[str, Path] | None = None, path: str | None = None,
                 runtime: str = "process") -> None:
        self.root = root
        self.runtime = runtime
        self.tag = uuid.uuid4().hex[:12]  # labels its Docker containers
        self.claims = dict(claims or {})
        self.path = path or os.environ.get("PATH", "/usr/bin:/bin")
        self.missing_images: set[str] = set()
        self.pods: dict[tuple[str, str], FakePod] = {}
        self.created: list[dict[str, Any]] = []  # every pod body as the client sent it
        self.execs: list[list[str]] = []
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.tasks: list[asyncio.Future[None]] = []  # each container's wait for its process
        self._watchers: list[asyncio.Queue[tuple[str, dict[str, Any]]]] = []
        self._version = 0
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, name="fake-kubernetes", daemon=True)
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeKubernetes:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(60)  # a hang guard
        return self

    def stop(self) -> None:
        async def down() -> None:
            for pod in self.pods.values():
                await asyncio.to_thread(pod.delete)
            for queue in self._watchers:
                queue.put_nowait(("STOP", {}))  # end every open watch: the server is going away
            # Hang guards: the killed processes end at once.
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 60)
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(90)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(60)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's loop (the pods live there)."""
        async def run() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)  # a hang guard

    async def _serve(self) -> None:
        app = web.Application()
        base = "/api/v1/namespaces/{ns}/pods"
        app.router.add_post(base, self._create)
        app.router.add_get(base, self._list)
        app.router.add_get(base + "/{name}", self._read)
        app.router.add_delete(base + "/{name}", self._delete)
        app.router.add_get(base + "/{name}/log", self._log)
        app.router.add_get(base + "/{name}/exec", self._exec)
        app.router.add_post(base + "/{name}/exec", self._exec)
        app.router.add_post("/api/v1/namespaces/{ns}/secrets", self._secret_create)
        app.router.add_get("/api/v1/namespaces/{ns}/secrets/{name}", self._secret_read)
        app.router.add_put("/api/v1/namespaces/{ns}/secrets/{name}", self._secret_replace)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------------ events

    def publish(self, kind: str, pod: FakePod) -> None:
        self._version += 1
        pod.body["metadata"]["resourceVersion"] = str(self._version)
        snapshot = json.loads(json.dumps(pod.body))
        for queue in self._watchers:
            queue.put_nowait((kind, snapshot))

    def _pod(self, request: web.Request) -> FakePod | None:
        return self.pods.get((request.match_info["ns"], request.match_info["name"]))

    # ------------------------------------------------------------------ handlers

    async def _create(self, request: web.Request) -> web.Response:
        namespace = request.match_info["ns"]
        body = await request.json()
        self.created.append(json.loads(json.dumps(body)))
        name = body["metadata"]["name"]
        if (namespace, name) in self.pods:
            return _status(409, "AlreadyExists", f'pods "{name}" already exists')
        pod = FakePod(self, namespace, body)
        self.pods[(namespace, name)] = pod
        self.publish("ADDED", pod)
        self.tasks.append(asyncio.ensure_future(pod.start()))
        return web.json_response(pod.body, status=201)

    async def _read(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        return web.json_response(pod.body)

    async def _delete(self, request: web.Request) -> web.Response:
        pod = self.pods.pop((request.match_info["ns"], request.match_info["name"]), None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        await asyncio.to_thread(pod.delete)
        self.publish("DELETED", pod)
        shutil.rmtree(pod.root, ignore_errors=True)
        return web.json_response(pod.body)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["ns"]
        labels, fields = request.query.get("labelSelector"), request.query.get("fieldSelector")
        pods = [p for (ns, _), p in self.pods.items() if ns == namespace and _matches(p.body, labels, fields)]
        if request.query.get("watch") not in ("true", "1", "True"):
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                    "items": [p.body for p in pods]}
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            for pod in pods:
                await response.write(json.dumps({"type": "ADDED", "object": pod.body}).encode() + b"\n")
            timeout = float(request.query.get("timeoutSeconds", "300"))
            deadline = self.loop.time() + timeout
            while (left := deadline - self.loop.time()) > 0:
                try:
                    kind, body = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if kind == "STOP":
                    break
                if body["metadata"]["namespace"] == namespace and _matches(body, labels, fields):
                    await response.write(json.dumps({"type": kind, "object": body}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(queue)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _log(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        container = pod.containers[request.query.get("container") or next(iter(pod.containers))]
        if container.proc is None:
            return _status(400, "BadRequest", f'container "{container.name}" in pod "{pod.name}" is waiting to start')
        follow = request.query.get("follow") in ("true", "1", "True")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError), container.log.open("rb") as log:
            while True:
                # Whether it had ended before this read: then the read saw all it wrote. (A check
                # after the read could meet output written in between, and drop it.)
                ended = container.proc.returncode is not None
                data = log.read(65536)
                if data:
                    await response.write(data)
                    continue
                if not follow or pod.deleted or ended:
                    break
                await asyncio.sleep(0.02)  # a kubelet tails the file the same way
            await response.write_eof()
        return response

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        container = pod.containers[request.query.get("container") or next(iter(pod.containers))]
        command = request.query.getall("command")
        self.execs.append(command)
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        with_stdin = request.query.get("stdin") in ("true", "1", "True")
        proc = await asyncio.create_subprocess_exec(
            *container.exec_argv(command, with_stdin),
            cwd=container.cwd() if self.runtime == "process" else None,
            env=container.environment() if self.runtime == "process" else None,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )

        async def relay(stream: asyncio.StreamReader, channel: int) -> None:
            while data := await stream.read(65536):
                await ws.send_bytes(bytes([channel]) + data)

        async def feed() -> None:
            assert proc.stdin is not None
            async for message in ws:
                if message.type != WSMsgType.BINARY or not message.data:
                    continue
                data: bytes = message.data
                if data[0] == 255 and data[1:2] == b"\x00":  # v5: the client closed stdin
                    proc.stdin.close()
                    return
                if data[0] == 0:
                    proc.stdin.write(data[1:])
                    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                        await proc.stdin.drain()

        assert proc.stdout is not None and proc.stderr is not None
        feeding = asyncio.ensure_future(feed()) if with_stdin else None
        await asyncio.gather(relay(proc.stdout, 1), relay(proc.stderr, 2))
        code = await proc.wait()
        if feeding is not None:
            feeding.cancel()
        if code == 0:
            status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        else:
            status = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                      "message": f"command terminated with non-zero exit code: exit code {code}",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        await ws.send_bytes(b"\x03" + json.dumps(status).encode())
        await ws.close()
        return ws

    # ------------------------------------------------------------------ secrets

    def _stored(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        data = dict(body.get("data") or {})
        data.update({k: base64.b64encode(v.encode()).decode() for k, v in (body.pop("stringData", None) or {}).items()})
        self._version += 1
        body["data"] = data
        body["metadata"].update(namespace=namespace, resourceVersion=str(self._version))
        body["metadata"].setdefault("uid", str(uuid.uuid4()))
        return body

    async def _secret_create(self, request: web.Request) -> web.Response:
        namespace = request.match_info["ns"]
        body = await request.json()
        key = (namespace, body["metadata"]["name"])
        if key in self.secrets:
            return _status(409, "AlreadyExists", f'secrets "{key[1]}" already exists')
        self.secrets[key] = self._stored(namespace, body)
        return web.json_response(self.secrets[key], status=201)

    async def _secret_read(self, request: web.Request) -> web.Response:
        secret = self.secrets.get((request.match_info["ns"], request.match_info["name"]))
        if secret is None:
            return _status(404, "NotFound", f'secrets "{request.match_info["name"]}" not found')
        return web.json_response(secret)

    async def _secret_replace(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        body = await request.json()
        if key not in self.secrets:
            return _status(404, "NotFound", f'secrets "{key[1]}" not found')
        if body["metadata"].get("resourceVersion") != self.secrets[key]["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified: apply your changes to the latest version")
        body["metadata"]["uid"] = self.secrets[key]["metadata"]["uid"]
        self.secrets[key] = self._stored(key[0], body)
        return web.json_response(self.secrets[key])


async def _run(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {err.decode(errors='replace').strip()}")
    return out.decode()
