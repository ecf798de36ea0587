"""The Docker sandbox on a real engine: a hostile candidate tries every escape, and each one fails.

The runner-level tests run the container runner directly (fast, one container each); the
pipeline tests run the data stage in the sandbox on a real nats-server and check that the request
still ends with exactly one verdict that names what happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path

import docker
import docker.models.containers
import pytest

from ftbus.embedded import EmbeddedServer
from runners.base import EXIT_OOM_KILLED, EXIT_TIMEOUT, thread_env
from runners.docker import LABEL_OWNER, DockerRunner, engine_client, reap_containers
from runners.sandbox import Sandbox
from shared.events import Stage, TaskSpec, Verdict
from shared.logs import bound
from shared.settings import Settings
from tests.integration.conftest import Pipeline, write_workspace
from tests.sandbox_support import require_sandbox

HOSTILE = Path(__file__).resolve().parents[1] / "fixtures" / "hostile" / "process_data.py"
ATTEMPT = re.compile(r"^ATTEMPT (\S+) (BLOCKED|ESCAPED) (.*)$", re.MULTILINE)
EXPECTED_ATTEMPTS = {
    "environment", "proc-environ", "bus-connect", "network-interfaces", "read-benchmark",
    "read-jetstream_store", "read-worker_secret", "read-dataset", "write-root", "write-model",
    "write-home", "privileges",
}


@pytest.fixture
def image() -> str:
    return require_sandbox()


@pytest.fixture
def runner(image: str) -> DockerRunner:
    return DockerRunner(image, stage="data", memory="512m", pids=256, tmp_size="64m")


def _containers(label_value: str | None = None) -> list[object]:
    """The engine's ftbus containers (of one request). The SDK lists, then inspects each: one removed
    in between (another test's, running at the same time) is looked for again, not an error."""
    client = engine_client()
    filters = {"label": f"ftbus.request_id={label_value}"} if label_value else {"label": LABEL_OWNER}
    for _ in range(10):
        try:
            return client.containers.list(all=True, filters=filters)
        except docker.errors.NotFound:
            continue
    return client.containers.list(all=True, filters=filters)


def _hostile_workspace(root: Path, nats_server: EmbeddedServer, assets_dir: Path, **extra: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(HOSTILE, root / "process_data.py")
    home = root.parent / "worker-home"  # the worker's own files, beside the workspace on the host
    home.mkdir(exist_ok=True)
    (home / "credentials").write_text(os.environ["FTBUS_TEST_SECRET"])
    targets = {
        "secrets": [os.environ["FTBUS_TEST_SECRET"], "sk-real-secret-key"],
        "nats_port": int(nats_server.url.rsplit(":", 1)[1]),
        "benchmark": str(next((assets_dir / "benchmarks").rglob("*.jsonl"))),
        "jetstream_store": str(nats_server.store_dir),
        "worker_secret": str(home / "credentials"),
        "dataset": str(next((assets_dir / "datasets").rglob("*.jsonl"))),
        "model": str(assets_dir / "models" / "tiny-standin"),
        "marker": "ftbus-daemon-" + secrets.token_hex(4),
        **extra,
    }
    (root / "targets.json").write_text(json.dumps(targets))
    return root


def _attempts(text: str) -> dict[str, tuple[str, str]]:
    return {name: (verdict, detail) for name, verdict, detail in ATTEMPT.findall(text)}


def _daemon_alive(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0


@pytest.fixture(autouse=True)
def worker_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """A credential in the worker's own environment, as a real worker holds its NATS password."""
    value = "nats-password-" + secrets.token_hex(8)
    monkeypatch.setenv("FTBUS_TEST_SECRET", value)
    monkeypatch.setenv("FTBUS_NATS_URL_SECRET", f"nats://data:{value}@127.0.0.1:4222")
    return value


# ---------------------------------------------------------------------------- the runner


async def test_every_escape_of_a_hostile_candidate_fails(
    runner: DockerRunner, nats_server: EmbeddedServer, assets_dir: Path, tmp_path: Path
) -> None:
    ws = _hostile_workspace(tmp_path / "ws", nats_server, assets_dir)
    marker = json.loads((ws / "targets.json").read_text())["marker"]
    result = await runner.run(
        ["python", "process_data.py"], cwd=ws, env={"PYTHONPATH": "./"}, timeout_s=120,
        log_path=tmp_path / "log.txt", sandbox=Sandbox.reading(assets_dir / "models" / "tiny-standin"),
        )
    log = (tmp_path / "log.txt").read_text()
    attempts = _attempts(log)
    assert set(attempts) == EXPECTED_ATTEMPTS, log
    escaped = {name: detail for name, (verdict, detail) in attempts.items() if verdict == "ESCAPED"}
    assert not escaped, escaped
    assert result.exit_code == 0 and result.sandbox == "docker:" + runner.image
    # What the candidate saw: only its own processes, no interface but loopback, and its own user.
    assert "interfaces ['lo'], routes 0" in attempts["network-interfaces"][1]
    assert "uid 1000 CapEff 0000000000000000" in attempts["privileges"][1]
    # The daemon it left behind died with the container, and the container is gone.
    assert not _daemon_alive(marker)
    assert not [c for c in _containers() if c.labels.get(LABEL_OWNER) == runner.owner]
    # Its files belong to the sandbox user, and the worker can remove them.
    assert (ws / "data.json").stat().st_uid == (1000 if os.getuid() == 0 else os.getuid())
    shutil.rmtree(ws)


async def test_memory_hog_is_killed_and_named(runner: DockerRunner, tmp_path: Path) -> None:
    result = await runner.run(
        ["python", "-c", "blocks = []\nwhile True: blocks.append(bytearray(50 * 2**20))"],
        cwd=tmp_path, timeout_s=120, log_path=tmp_path / "log.txt",
    )
    assert result.exit_code == EXIT_OOM_KILLED and result.oom_killed
    assert "out of memory" in result.output_tail and "0.50 GiB" in result.output_tail


async def test_torch_in_a_container_runs_one_thread_per_cpu_it_is_given(image: str, tmp_path: Path) -> None:
    """torch sizes its pools by the host's cores, not by the container's CPU limit: the runner says
    how many threads (settings.sandbox_cpus), and the stage's own count wins."""
    probe = ["python", "-c", "import torch; print('threads', torch.get_num_threads())"]

    async def threads(cpus: float, env: dict[str, str] | None = None) -> str:
        runner = DockerRunner(image, stage="train", memory="1g", cpus=cpus, tmp_size="64m")
        result = await runner.run(probe, cwd=tmp_path, env=env, timeout_s=120, log_path=tmp_path / "log.txt")
        assert result.exit_code == 0, result.output_tail
        return re.findall(r"^threads (\d+)$", result.output_tail, re.MULTILINE)[-1]

    assert await threads(1) == "1"
    assert await threads(1, thread_env(2)) == "2"
    # Not set: torch's own choice, every core the host has (not the quota's).
    assert await threads(0) == str(len(os.sched_getaffinity(0)))


async def test_no_file_in_the_container_outgrows_its_cap(runner: DockerRunner, tmp_path: Path) -> None:
    script = "with open('big', 'wb') as f:\n    for _ in range(4096):\n        f.write(b'x' * 2**20)\n"
    result = await runner.run(["python", "-c", script], cwd=tmp_path, timeout_s=120, log_path=tmp_path / "log.txt",
                              max_file_bytes=4 * 2**20)
    assert result.exit_code != 0 and "File too large" in result.output_tail, result.output_tail
    assert (tmp_path / "big").stat().st_size <= 4 * 2**20


async def test_fork_bomb_hits_the_pids_limit(runner: DockerRunner, tmp_path: Path) -> None:
    script = (
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    while children < 100000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        children += 1\n"
        "except OSError as exc:\n"
        "    print('fork refused after', children, 'children:', exc, flush=True)\n"
    )
    result = await runner.run(["python", "-c", script], cwd=tmp_path, timeout_s=120, log_path=tmp_path / "log.txt")
    match = re.search(r"fork refused after (\d+) children", result.output_tail)
    assert match and int(match.group(1)) < runner.pids, result.output_tail
    assert result.exit_code == 0
    assert not [c for c in _containers() if c.labels.get(LABEL_OWNER) == runner.owner]


async def test_timeout_kills_the_container(runner: DockerRunner, tmp_path: Path) -> None:
    result = await runner.run(["sleep", "600"], cwd=tmp_path, timeout_s=2, log_path=tmp_path / "log.txt")
    assert result.exit_code == EXIT_TIMEOUT and result.timed_out
    assert "killed after 2 seconds" in result.output_tail
    assert not [c for c in _containers() if c.labels.get(LABEL_OWNER) == runner.owner]


async def test_output_streams_live_and_cancel_removes_the_container(runner: DockerRunner, tmp_path: Path) -> None:
    lines: list[str] = []
    seen = asyncio.Event()

    def on_line(line: str) -> None:
        lines.append(line)
        if line == "tick 2":
            seen.set()

    script = "import time\nfor i in range(600):\n    print('tick', i, flush=True); time.sleep(0.2)\n"
    with bound(request_id="rid-live", stage="data"):  # as the stage runtime binds every request
        task = asyncio.create_task(runner.run(["python", "-c", script], cwd=tmp_path, timeout_s=300,
                                              log_path=tmp_path / "log.txt", on_line=on_line))
    await asyncio.wait_for(seen.wait(), timeout=60)  # lines arrive while the run goes on
    assert not task.done()
    labelled = _containers("rid-live")
    assert len(labelled) == 1 and labelled[0].labels["ftbus.stage"] == "data"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lines[:3] == ["tick 0", "tick 1", "tick 2"]
    assert not [c for c in _containers() if c.labels.get(LABEL_OWNER) == runner.owner]


async def test_a_cancel_while_the_engine_creates_the_container_leaves_no_container(
    runner: DockerRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine goes on creating a container after the run that asked for it was cancelled (the
    creation runs in a thread): that container is removed once it exists, not left behind."""
    collection = docker.models.containers.ContainerCollection  # client.containers is a new one each time
    real_create = collection.create
    creating, cancelled, created = threading.Event(), threading.Event(), threading.Event()

    def slow_create(self: object, *args: object, **spec: object) -> object:
        creating.set()
        cancelled.wait(60)  # the cancel lands in here: the engine creates only once the run was cancelled
        container = real_create(self, *args, **spec)  # type: ignore[arg-type]
        created.set()
        return container

    monkeypatch.setattr(collection, "create", slow_create)
    with bound(request_id="rid-creating", stage="data"):
        task = asyncio.create_task(runner.run(["sleep", "600"], cwd=tmp_path, timeout_s=300,
                                              log_path=tmp_path / "log.txt"))
    try:
        assert await asyncio.to_thread(creating.wait, 60)  # hang guard
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        cancelled.set()
    assert await asyncio.to_thread(created.wait, 60), "the engine never created the container"  # hang guard
    deadline = time.monotonic() + 60  # hang guard: it is removed as soon as it exists
    while _containers("rid-creating") and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _containers("rid-creating"), "the container created after the cancel was left behind"


async def test_read_only_mounts_and_nothing_else(runner: DockerRunner, tmp_path: Path, assets_dir: Path) -> None:
    model = assets_dir / "models" / "tiny-standin"
    script = (
        "import os, sys\n"
        f"print('model', sorted(os.listdir({str(model)!r}))[:2])\n"
        f"print('other model', os.path.exists({str(assets_dir / 'models')!r} + '/other'))\n"
        f"print('benchmarks', os.path.exists({str(assets_dir / 'benchmarks')!r}))\n"
        "open('/tmp/scratch', 'w').write('tmpfs is writable')\n"
        "print('tmp ok')\n"
    )
    result = await runner.run(["python", "-c", script], cwd=tmp_path, timeout_s=60, log_path=tmp_path / "log.txt",
                              sandbox=Sandbox.reading(model))
    assert result.exit_code == 0, result.output_tail
    assert "model ['config.json'" in result.output_tail or "model [" in result.output_tail
    assert "benchmarks False" in result.output_tail and "tmp ok" in result.output_tail


async def test_a_dead_workers_containers_are_reaped(image: str, tmp_path: Path) -> None:
    client = engine_client()
    # A worker that died: its pid is gone (a child we started and reaped).
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    owner = f"{os.uname().nodename}:{dead.pid}:0"
    orphan = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none",
                                   labels={LABEL_OWNER: owner, "ftbus.stage": "train"})
    alive_owner = DockerRunner(image, stage="train").owner  # this process: alive
    kept = client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none",
                                 labels={LABEL_OWNER: alive_owner, "ftbus.stage": "train"})
    try:
        removed = reap_containers(client)
        assert orphan.name in removed and kept.name not in removed
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(orphan.id)
        assert client.containers.get(kept.id).status == "running"
    finally:
        for container in (orphan, kept):
            with pytest.raises(docker.errors.NotFound) if container is orphan else _noop():
                container.remove(force=True)


class _noop:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


# ---------------------------------------------------------------------------- the pipeline

DATA_ONLY = [Stage.data, Stage.judge, Stage.aggregate]
TASK = TaskSpec(base_model="tiny-standin", benchmark="tiny-arith", description="double numbers")


@pytest.fixture
def docker_settings(settings: Settings, image: str) -> Settings:
    return settings.model_copy(update={
        "sandbox": "docker", "sandbox_image": image, "sandbox_memory": "512m", "sandbox_tmp": "64m",
        "openai_api_key": "sk-real-secret-key",
    })


async def _verdict_of_data_failure(settings: Settings, ws: Path) -> Verdict:
    """The verdict of a request that ends in the data stage (only data, judge and aggregator run)."""
    pipeline = Pipeline(settings)
    try:
        await pipeline.start(DATA_ONLY)
        assert pipeline.client is not None
        rid = await pipeline.client.submit(ws, TASK)
        verdict = await pipeline.client.wait(rid, timeout_s=180)
    finally:
        await pipeline.stop()
    assert isinstance(verdict, Verdict)
    return verdict


async def test_hostile_candidate_through_the_pipeline_gets_one_verdict(
    docker_settings: Settings, nats_server: EmbeddedServer, assets_dir: Path, tmp_path: Path
) -> None:
    """data.json is a link to the hidden test split: refused, and every escape on the way failed."""
    hidden = next((assets_dir / "benchmarks").rglob("*.jsonl"))
    ws = _hostile_workspace(tmp_path / "ws", nats_server, assets_dir, link_data_to=str(hidden))
    (ws / "train.yaml").write_text("model_name_or_path: tiny-standin\ndataset: processed_data\n")
    (ws / "dataset_info.json").write_text('{"processed_data": {"file_name": "data.json"}}')
    verdict = await _verdict_of_data_failure(docker_settings, ws)
    assert verdict.failed_stage == "data_processing" and verdict.final_decision is False
    assert "data.json refused" in verdict.execution + verdict.return_checking + verdict.raw_execution
    attempts = _attempts(verdict.raw_execution)
    assert set(attempts) == EXPECTED_ATTEMPTS
    assert all(v == "BLOCKED" for v, _ in attempts.values()), attempts
    assert verdict.sandbox == "docker:" + docker_settings.sandbox_image


async def test_out_of_memory_in_the_pipeline_is_named_in_the_verdict(
    docker_settings: Settings, tmp_path: Path
) -> None:
    script = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n"
    verdict = await _verdict_of_data_failure(docker_settings, write_workspace(tmp_path / "ws", script=script))
    assert verdict.failed_stage == "data_processing"
    text = verdict.execution + verdict.return_checking + verdict.raw_execution
    assert "137" in text and "out of memory" in text


LLM_SCRIPT = """
import json, os, socket
from openai import OpenAI

print("key is a gateway token:", os.environ["OPENAI_API_KEY"].startswith("ftbus-"), flush=True)
print("base url:", os.environ["OPENAI_BASE_URL"], flush=True)
client = OpenAI(max_retries=0)
answers = []
for i in range(3):
    try:
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"q{i}"}])
        answers.append(reply.choices[0].message.content)
        print("call", i, "answered", flush=True)
    except Exception as exc:
        print("call", i, "refused:", type(exc).__name__, getattr(exc, "status_code", None), str(exc)[:160], flush=True)
try:
    socket.create_connection(("127.0.0.1", REAL_PORT), timeout=3)
    print("direct to the real endpoint: reached", flush=True)
except OSError as exc:
    print("direct to the real endpoint: blocked", exc, flush=True)
rows = [{"instruction": f"q{i}", "input": "", "output": a} for i, a in enumerate(answers)]
json.dump(rows * 30, open("data.json", "w"))
"""


async def test_process_data_calls_the_llm_through_the_gateway_within_its_budget(
    docker_settings: Settings, tmp_path: Path
) -> None:
    """The script gets a token and a local address, never the key; two calls pass, the third is
    over budget; the data stage's result records the calls."""
    from shared import codec
    from shared.events import DataResult
    from tests.fakes.openai_server import FakeOpenAIServer, answer

    with FakeOpenAIServer(default=answer("an answer")) as fake:
        port = int(fake.base_url.rsplit(":", 1)[1].split("/")[0])
        settings = docker_settings.model_copy(update={"openai_base_url": fake.base_url, "llm_budget_requests": 2})
        ws = write_workspace(tmp_path / "ws", script=LLM_SCRIPT.replace("REAL_PORT", str(port)))
        pipeline = Pipeline(settings)
        try:
            await pipeline.start([Stage.data])
            assert pipeline.bus is not None and pipeline.client is not None
            sub = await pipeline.bus.js.subscribe(pipeline.bus.subjects.completed("data"), ordered_consumer=True)
            rid = await pipeline.client.submit(ws, TASK)
            msg = await sub.next_msg(timeout=180)
            result = codec.decode(msg.data, DataResult)
            await sub.unsubscribe()
        finally:
            await pipeline.stop()
        assert result.request_id == rid and result.ok, result.error
        log = result.outcome.log_tail if result.outcome else ""
        assert "key is a gateway token: True" in log and "base url: http://127.0.0.1:8080/v1" in log
        assert "call 0 answered" in log and "call 1 answered" in log
        assert "call 2 refused: RateLimitError 429" in log and "budget of this run is spent" in log
        assert "direct to the real endpoint: blocked" in log
        # The upstream saw the real key, twice; the sandbox never did.
        assert len(fake.requests) == 2
        assert all(r.headers.get("authorization") == "Bearer sk-real-secret-key" for r in fake.requests)
        usage = result.data.llm_usage
        assert usage is not None and usage.requests == 2 and usage.refused == 1
        assert [c.model for c in usage.calls] == ["gpt-4o-mini"] * 2 and all(c.status == 200 for c in usage.calls)
        assert usage.prompt_tokens == 2 and usage.completion_tokens == 2


async def test_without_an_llm_the_sandbox_has_no_network_and_no_key(docker_settings: Settings, tmp_path: Path) -> None:
    settings = docker_settings.model_copy(update={"openai_base_url": None})
    script = (
        "import json, os\n"
        "print('key:', os.environ.get('OPENAI_API_KEY'), 'url:', os.environ.get('OPENAI_BASE_URL'), flush=True)\n"
        "print('interfaces:', [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]])\n"
        "json.dump([{'instruction': 'a', 'input': '', 'output': 'b'}] * 60, open('data.json', 'w'))\n"
    )
    ws = write_workspace(tmp_path / "ws", script=script)
    pipeline = Pipeline(settings)
    from shared import codec
    from shared.events import DataResult

    try:
        await pipeline.start([Stage.data])
        assert pipeline.bus is not None and pipeline.client is not None
        sub = await pipeline.bus.js.subscribe(pipeline.bus.subjects.completed("data"), ordered_consumer=True)
        await pipeline.client.submit(ws, TASK)
        result = codec.decode((await sub.next_msg(timeout=180)).data, DataResult)
        await sub.unsubscribe()
    finally:
        await pipeline.stop()
    log = result.outcome.log_tail if result.outcome else ""
    assert "key: None url: None" in log and "interfaces: ['lo']" in log
    assert result.data.llm_usage is None


async def test_a_killed_workers_container_is_reaped_by_the_next_worker(
    docker_settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL a data worker mid-run: its container outlives it (the engine owns it) until the next
    worker on the host starts and removes it; the request then ends with exactly one verdict."""
    from tests.integration.test_delivery import ftbus_env, ftbus_exe, verdicts_on

    # The candidate runs until the test releases it (a file `release` in its working folder): the
    # orphan is certainly still running when it is looked at, however slow the machine, and the
    # redelivered run ends (exit 3) once the test lets it.
    script = ("import os, time\nprint('working', flush=True)\n"
              "while not os.path.exists('release'):\n    time.sleep(0.1)\nraise SystemExit(3)\n")
    ws = write_workspace(tmp_path / "ws", script=script)
    pipeline = Pipeline(docker_settings)
    workers: list[asyncio.subprocess.Process] = []

    async def start_worker() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            ftbus_exe(), "worker", "data", env=ftbus_env(docker_settings),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
        )
        workers.append(proc)
        return proc

    async def containers_of(rid: str) -> list[object]:
        return await asyncio.to_thread(_containers, rid)

    try:
        await pipeline.start([Stage.judge, Stage.aggregate])
        assert pipeline.client is not None and pipeline.bus is not None
        first = await start_worker()
        rid = await pipeline.client.submit(ws, TASK)
        # Wait until the candidate's process runs (it has printed), not only until its container exists:
        # CI once killed the worker between the engine's create and start, and read 'created'.
        async def running_containers() -> list[object]:
            found = await containers_of(rid)
            return [c for c in found if b"working" in await asyncio.to_thread(c.logs)]

        for _ in range(600):
            if await running_containers():
                break
            await asyncio.sleep(0.1)
        orphans = await running_containers()
        assert len(orphans) == 1, "the first worker never started the candidate's container"
        first.kill()
        await first.wait()  # dead: nothing of the worker can remove its container from here on
        await asyncio.to_thread(orphans[0].reload)
        assert orphans[0].status == "running"  # the engine, not the worker, owns it

        await start_worker()  # reaps at start, then takes the redelivered message
        for _ in range(600):
            if orphans[0].id not in {c.id for c in await containers_of(rid)}:
                break
            await asyncio.sleep(0.1)
        assert orphans[0].id not in {c.id for c in await containers_of(rid)}, "the orphan was not reaped"
        # The redelivered run, released through its working folder (the one read-write bind mount).
        for _ in range(600):
            if again := await running_containers():
                break
            await asyncio.sleep(0.1)
        assert len(again) == 1 and again[0].id != orphans[0].id, "the second worker never ran the candidate"
        (folder,) = [m["Source"] for m in again[0].attrs["Mounts"] if m["Type"] == "bind" and m["RW"]]
        Path(folder, "release").touch()
        verdict = await pipeline.client.wait(rid, timeout_s=180)
        assert verdict.failed_stage == "data_processing" and "exited with code 3" in verdict.execution
        assert await verdicts_on(pipeline.bus, rid) == 1
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await pipeline.stop()
    assert not await containers_of(rid)
