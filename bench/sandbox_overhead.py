"""What the sandbox costs per run: each stage's container start and teardown beside the local runner.

Each stage's run shape (its mounts; the data stage also with the LLM gateway's forwarder) runs
the same trivial command, ``python -c pass``, under both runners; the difference of the medians
is the sandbox's overhead per run of that stage. One more row imports the toolchain (torch,
transformers, peft), as every training and benchmark engine does first: the image's bytecode
(deploy/sandbox/build.sh) is what keeps that row near the local runner's. Prints one table.

    .venv/bin/python bench/sandbox_overhead.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runners.base import LocalRunner, Runner
from runners.docker import DockerRunner, engine_client
from runners.sandbox import Sandbox, SandboxUnavailable
from shared.settings import Settings

TRIVIAL = "pass"
TOOLCHAIN_IMPORT = "import torch, transformers, peft"


async def _median(runner: Runner, sandbox: Sandbox, folder: Path, runs: int, code: str = TRIVIAL) -> float:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        result = await runner.run(["python", "-c", code], cwd=folder, timeout_s=300,
                                  log_path=folder.parent / f"log-{i}.txt", sandbox=sandbox)
        times.append(time.perf_counter() - start)
        if result.exit_code != 0:
            raise SystemExit(f"the run failed ({result.exit_code}): {result.output_tail}")
    return statistics.median(times)


async def main(runs: int, as_json: bool = False) -> int:
    settings = Settings()
    try:
        engine_client()
    except SandboxUnavailable as exc:
        print(f"sandbox overhead: not measured ({exc})", file=sys.stderr)
        if as_json:
            print(json.dumps([{"measure": "sandbox overhead per run", "value": f"not measured: {exc}",
                               "target": None, "met": None}]))
        return 0
    toolchain = settings.toolchain_path()
    local = LocalRunner(settings.passthrough_env, path_prefix=[toolchain] if toolchain else [])
    with tempfile.TemporaryDirectory(prefix="ftbus-bench-sandbox-") as tmp:
        root = Path(tmp)
        model, datasets, socket_dir = root / "model", root / "datasets", root / "gw"
        for folder in (model, datasets, socket_dir):
            folder.mkdir()
        (socket_dir / "llm.sock").touch()
        # label -> (stage, the stage's run shape, the code it runs)
        shapes = {
            "data": ("data", Sandbox.reading(model, datasets), TRIVIAL),
            "data + LLM gateway": ("data", Sandbox.reading(model, datasets, llm_socket=socket_dir / "llm.sock"),
                                   TRIVIAL),
            "train": ("train", Sandbox.reading(model, datasets, gpus=True), TRIVIAL),
            "bench (one split)": ("bench", Sandbox.reading(model, root / "output", gpus=True), TRIVIAL),
            "train, importing torch, transformers, peft": ("train", Sandbox.reading(model, datasets, gpus=True),
                                                           TOOLCHAIN_IMPORT),
        }
        rows = []
        for label, (stage, sandbox, code) in shapes.items():
            docker = DockerRunner(settings.sandbox_stage_images.get(stage, settings.sandbox_image), stage=stage)
            docker.check()
            work = root / f"work-{stage}-{len(rows)}"
            work.mkdir()
            local_s = await _median(local, sandbox, work, runs, code)
            docker_s = await _median(docker, sandbox, work, runs, code)
            rows.append((label, local_s, docker_s))
    if as_json:
        print(json.dumps([{"measure": f"sandbox overhead per run, {label}", "value": f"{docker_s - local_s:+.3f} s",
                           "target": None, "met": None} for label, local_s, docker_s in rows]))
        return 0
    print(f"\nSandbox overhead per run (`python -c pass`, or the imports named; median of {runs}; "
          f"image {settings.sandbox_image})\n")
    print("| stage | local runner (s) | docker runner (s) | overhead (s) |")
    print("|---|---|---|---|")
    for label, local_s, docker_s in rows:
        print(f"| {label} | {local_s:.3f} | {docker_s:.3f} | {docker_s - local_s:+.3f} |")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per stage and runner (median)")
    parser.add_argument("--json", action="store_true", help="print rows for bench/table.py on stdout, no table")
    options = parser.parse_args()
    raise SystemExit(asyncio.run(main(options.runs, options.json)))
