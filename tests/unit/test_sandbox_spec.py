"""What a sandbox container is created with, and the checks on files it wrote (no engine needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runners.docker import DockerRunner, gateway_command, gpu_request, parse_size
from runners.sandbox import Sandbox, owner_alive
from services.benchmark.models import drop_pickled_weights
from shared.paths import UnsafePath, regular_file_in


class _NoEngine:
    """Any call on it fails the test: building a spec must not talk to the engine."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the engine was called ({name})")


def _spec(tmp_path: Path, sandbox: Sandbox, env: dict[str, str] | None = None) -> dict:
    runner = DockerRunner("img:1", stage="train", memory="1g", cpus=1.5, pids=100, shm="64m", tmp_size="32m",
                          gpus="0,1", client=_NoEngine())  # type: ignore[arg-type]
    return runner._container_spec(["llamafactory-cli", "train", "train.yaml"], tmp_path, env or {}, sandbox, "rid-1")


def test_the_container_is_locked_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTBUS_NATS_URL", "nats://data:secret@127.0.0.1:4222")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real")
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "ws").mkdir()
    spec = _spec(tmp_path / "ws", Sandbox.reading(model), env={"HF_HUB_OFFLINE": "1"})
    assert spec["network_mode"] == "none"
    assert spec["read_only"] is True and spec["cap_drop"] == ["ALL"]
    assert spec["security_opt"] == ["no-new-privileges"] and spec["init"] is True
    assert spec["user"] != "0" and not spec["user"].startswith("0:")
    assert spec["mem_limit"] == spec["memswap_limit"] == 2**30
    assert spec["nano_cpus"] == 1_500_000_000 and spec["pids_limit"] == 100 and spec["shm_size"] == 64 * 2**20
    assert spec["tmpfs"] == {"/tmp": f"rw,nosuid,nodev,size={32 * 2**20},mode=1777"}
    # Only what the stage gave: nothing of the worker's environment.
    assert "FTBUS_NATS_URL" not in spec["environment"] and "OPENAI_API_KEY" not in spec["environment"]
    assert spec["environment"]["HF_HUB_OFFLINE"] == "1" and spec["environment"]["HOME"] == "/tmp"
    # The working folder read-write, the model read-only, at the same paths; nothing else.
    mounts = {m["Target"]: m["ReadOnly"] for m in spec["mounts"]}
    assert mounts == {str(tmp_path / "ws"): False, str(model): True}
    assert spec["labels"] == {"ftbus.owner": spec["labels"]["ftbus.owner"], "ftbus.request_id": "rid-1",
                              "ftbus.stage": "train"}
    # GPUs only when the stage asks (training, benchmarks), as device ids from the settings.
    assert spec["device_requests"] == []
    gpu_spec = _spec(tmp_path / "ws", Sandbox.reading(model, gpus=True))
    assert gpu_spec["device_requests"][0]["DeviceIDs"] == ["0", "1"]


def test_a_container_gets_the_thread_counts_of_its_cpus_and_the_stage_may_set_its_own(tmp_path: Path) -> None:
    threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    env = _spec(tmp_path, Sandbox())["environment"]  # 1.5 CPUs: one whole CPU, one thread
    assert {name: env[name] for name in threads} == dict.fromkeys(threads, "1")
    assert _spec(tmp_path, Sandbox(), env={"OMP_NUM_THREADS": "4"})["environment"]["OMP_NUM_THREADS"] == "4"
    host = DockerRunner("img:1", stage="train", client=_NoEngine())  # type: ignore[arg-type]
    spec = host._container_spec(["true"], tmp_path, {}, Sandbox(), "rid-1")
    assert not set(threads) & set(spec["environment"])  # all the host's CPUs: the libraries choose


def test_a_missing_path_is_not_mounted_and_links_are_mounted_where_they_lead(tmp_path: Path) -> None:
    real = tmp_path / "real-model"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    spec = _spec(tmp_path, Sandbox.reading(tmp_path / "absent", tmp_path / "link"))
    sources = {m["Target"]: m["Source"] for m in spec["mounts"]}
    assert str(tmp_path / "absent") not in sources
    assert sources[str(tmp_path / "link")] == str(real) and sources[str(real)] == str(real)


def test_the_llm_gateway_is_the_only_address(tmp_path: Path) -> None:
    sock = tmp_path / "gw" / "llm.sock"
    spec = _spec(tmp_path, Sandbox.reading(llm_socket=sock))
    assert spec["network_mode"] == "none"  # still no network: the socket is a file
    gateway_mount = next(m for m in spec["mounts"] if m["Target"] == "/run/ftbus-llm")
    assert gateway_mount["Source"] == str(sock.parent) and gateway_mount["ReadOnly"] is True
    command = spec["command"]
    assert command[:2] == ["/bin/sh", "-c"] and "UNIX-CONNECT:/run/ftbus-llm/llm.sock" in command[2]
    assert command[-3:] == ["llamafactory-cli", "train", "train.yaml"]
    assert "TCP-LISTEN:8080,bind=127.0.0.1" in gateway_command(["x"], 8080)[2]


def test_gpu_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_request("") == [] and gpu_request("none") == []
    assert gpu_request("all")[0]["Count"] == -1
    assert gpu_request("2")[0]["Count"] == 2
    assert gpu_request("1, 3")[0]["DeviceIDs"] == ["1", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpu_request(None)[0]["DeviceIDs"] == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpu_request(None) == ([] if not Path("/dev/nvidia0").exists() else gpu_request("all"))


def test_sizes() -> None:
    assert parse_size("8g") == 8 * 2**30 and parse_size("512m") == 512 * 2**20
    assert parse_size("1.5G") == int(1.5 * 2**30) and parse_size("1024") == 1024


def test_owner_alive() -> None:
    import psutil

    host = os.uname().nodename
    assert owner_alive(f"{host}:{os.getpid()}:{psutil.Process().create_time():.2f}")
    assert not owner_alive(f"{host}:{os.getpid()}:1")  # same pid, another process (reused)
    assert not owner_alive(f"{host}:999999999:1")
    assert owner_alive("another-host:1:1")  # not ours to judge


def test_files_the_sandbox_wrote_are_read_only_in_place(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text("[]")
    assert regular_file_in(tmp_path, "data.json") == tmp_path / "data.json"
    secret = tmp_path.parent / f"{tmp_path.name}-secret.jsonl"
    secret.write_text("hidden")
    (tmp_path / "linked.json").symlink_to(secret)
    (tmp_path / "sub").symlink_to(tmp_path.parent)
    os.mkfifo(tmp_path / "fifo.json")
    for name, message in (("linked.json", "symlink"), ("sub/x.json", "symlink"), ("fifo.json", "not a regular file"),
                          ("../x.json", "'..'")):
        with pytest.raises(UnsafePath, match=message):
            regular_file_in(tmp_path, name)
    with pytest.raises(FileNotFoundError):
        regular_file_in(tmp_path, "absent.json")


def test_pickled_weights_are_never_loaded(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "adapter_model.safetensors").write_bytes(b"x")
    (out / "training_args.bin").write_bytes(b"pickle")
    (out / "extra.pt").write_bytes(b"pickle")
    assert drop_pickled_weights(out) is None
    assert sorted(p.name for p in out.iterdir()) == ["adapter_model.safetensors"]
    (out / "adapter_model.safetensors").unlink()
    (out / "pytorch_model.bin").write_bytes(b"pickle")
    reason = drop_pickled_weights(out)
    assert reason is not None and "pytorch_model.bin" in reason and "safetensors" in reason
    assert not (out / "pytorch_model.bin").exists()


def test_without_an_engine_a_worker_refuses_to_run_candidate_code(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """auto and docker never fall back to running hostile code unisolated; local must be chosen."""
    from runners.base import LocalRunner
    from runners.choice import make_runner
    from runners.sandbox import SandboxUnavailable
    from shared.settings import Settings

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    for choice in ("auto", "docker"):
        with pytest.raises(SandboxUnavailable, match=r"no Docker engine is reachable.*FTBUS_SANDBOX=local"):
            make_runner(Settings(home=tmp_path, sandbox=choice), "data")
    runner = make_runner(Settings(home=tmp_path, sandbox="local"), "data")
    assert isinstance(runner, LocalRunner) and runner.name == "local"
