"""`make demo`: build the assets, start `ftbus up`, submit the LoRA example with live progress,
print the verdict, and stop everything it started. Exit code: that of `ftbus submit --wait`.

Run as ``python -m shared.demo [--example lora|full]``. It uses the normal settings (FTBUS_HOME,
default ~/.ftbus), so the assets it builds serve later `ftbus submit` commands too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shared.assets import AssetsError, build_assets
from shared.settings import Settings

REPO = Path(__file__).resolve().parent.parent
FTBUS = [sys.executable, "-m", "shared.cli"]


def say(text: str) -> None:
    print(f"\n==> {text}", file=sys.stderr, flush=True)


def wait_for_url(url_file: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`ftbus up` exited with code {proc.returncode} before it was ready")
        if url_file.is_file() and url_file.read_text().strip():
            return url_file.read_text().strip()
        time.sleep(0.1)
    raise RuntimeError(f"`ftbus up` did not record its URL in {url_file} within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--example", choices=["lora", "full"], default="lora", help="which example workspace")
    args = parser.parse_args()
    settings = Settings()
    toolchain = settings.toolchain_path()

    say(f"building the offline assets in {settings.assets} (tiny model, dataset, benchmark)")
    try:
        build_assets(settings.assets, (toolchain / "python") if toolchain else Path("python"))
    except AssetsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    say("starting `ftbus up` (embedded nats-server + all five services)")
    settings.home.mkdir(parents=True, exist_ok=True)
    settings.url_file.unlink(missing_ok=True)  # a stale file from a crashed run would mislead us
    log_path = settings.home / "demo-services.log"
    env = {**os.environ, "FTBUS_HOME": str(settings.home), "FTBUS_LOG_FORMAT": "json"}
    env.pop("FTBUS_NATS_URL", None)
    with log_path.open("ab") as services_log:
        up = subprocess.Popen([*FTBUS, "up"], cwd=REPO, env=env, stdout=services_log, stderr=services_log)
        try:
            url = wait_for_url(settings.url_file, up)
            print(f"    NATS at {url}; service logs in {log_path}", file=sys.stderr)
            example = REPO / "examples" / args.example
            say(f"submitting {example.relative_to(REPO)} and waiting for its verdict")
            submit = subprocess.run(
                [*FTBUS, "submit", str(example), "--base-model", "tiny-llama", "--benchmark", "tiny-arith",
                 "--dataset", "tiny-qa", "--description", "Teach the tiny model to answer arithmetic questions",
                 "--wait"],
                cwd=REPO,
                env={**env, "FTBUS_NATS_URL": url, "FTBUS_LOG_FORMAT": "console"},
                check=False,
            )
            verdict_code = submit.returncode
        finally:
            say("stopping `ftbus up`")
            up.send_signal(signal.SIGINT)
            try:
                up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
    meaning = {0: "final_decision true", 1: "final_decision false", 2: "error"}.get(verdict_code, "interrupted")
    say(f"demo finished: {meaning} (exit code {verdict_code})")
    return verdict_code


if __name__ == "__main__":
    sys.exit(main())
