"""`make demo`: build the assets, start `ftbus up`, submit the LoRA example with live progress,
print the verdict, and stop everything it started. Exit code: that of `ftbus submit --wait`.

The LoRA example teaches the tiny model to tell positive from negative reviews (benchmark
tiny-sentiment): the base model never answers either word, the candidate does after a minute of
CPU training, and the last lines print both validation scores and their difference.

Run as ``python -m ftbus.demo [--example lora|full]``. It uses the normal settings (FTBUS_HOME,
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

from rich.console import Console

from ftbus.assets import AssetsError, build_assets
from ftbus.verdict_view import render_verdict
from runners.choice import describe_sandbox
from shared.events import Verdict
from shared.settings import Settings

REPO = Path(__file__).resolve().parent.parent
FTBUS = [sys.executable, "-m", "ftbus.cli"]
# example -> (benchmark, raw dataset it reads, description)
TASKS = {
    "lora": ("tiny-sentiment", "tiny-reviews", "Teach the tiny model to tell positive from negative reviews"),
    "full": ("tiny-arith", "tiny-qa", "Teach the tiny model to answer arithmetic questions"),
}


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
    parser.add_argument("--benchmark", default=None, help="default: tiny-sentiment for lora, tiny-arith for full")
    args = parser.parse_args()
    settings = Settings()
    verdict: Verdict | None = None
    toolchain = settings.toolchain_path()

    say(f"building the offline assets in {settings.assets} (tiny model, dataset, benchmark)")
    try:
        build_assets(settings.assets, (toolchain / "python") if toolchain else Path("python"))
    except AssetsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    say("starting `ftbus up` (embedded nats-server + all five services)")
    print(f"    candidate code runs in the sandbox: {describe_sandbox(settings)}", file=sys.stderr)
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
            benchmark, dataset, description = TASKS[args.example]
            benchmark = args.benchmark or benchmark
            say(f"submitting {example.relative_to(REPO)} (benchmark {benchmark}) and waiting for its verdict")
            submit = subprocess.run(
                [*FTBUS, "submit", str(example), "--base-model", "tiny-llama", "--benchmark", benchmark,
                 "--dataset", dataset, "--description", description, "--wait", "--json"],
                cwd=REPO,
                env={**env, "FTBUS_NATS_URL": url, "FTBUS_LOG_FORMAT": "console"},
                stdout=subprocess.PIPE,
                check=False,
            )
            verdict_code = submit.returncode
            verdict = _show_verdict(submit.stdout)
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
    if verdict is not None:
        for line in improvement_lines(verdict):
            print(line, flush=True)
    return verdict_code


def _show_verdict(stdout: bytes) -> Verdict | None:
    """Render the verdict `submit --wait --json` printed; None when it printed none (an error)."""
    try:
        verdict = Verdict.model_validate_json(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.stdout.write(stdout.decode(errors="replace"))
        return None
    render_verdict(Console(), verdict)
    return verdict


def improvement_lines(verdict: Verdict) -> list[str]:
    """The demo's last lines: each validation subset, then the candidate against the base model."""
    lines: list[str] = []
    result = verdict.result
    baseline = result.baseline
    if result.benchmark is None or baseline is None:
        return [f"no validation scores: {verdict.status}, failed stage {verdict.failed_stage}"]
    metric = baseline.primary_metric or result.benchmark.primary_metric or "score"
    base_summary = baseline.baseline.accuracy_summary
    for subset, metrics in result.benchmark.accuracy_summary.items():
        if metric in metrics:
            base = base_summary.get(subset, {}).get(metric)
            base_text = f"{base:.2f}" if base is not None else "n/a"
            lines.append(f"validation {subset:<12} {metric}: base model {base_text}  candidate {metrics[metric]:.2f}")
    if baseline.candidate_value is not None and baseline.baseline_value is not None:
        diff = baseline.difference
        if diff is None:
            diff = baseline.candidate_value - baseline.baseline_value
        lines.append(f"validation {'overall':<12} {metric}: base model {baseline.baseline_value:.2f}  "
                     f"candidate {baseline.candidate_value:.2f}  difference {diff:+.2f}")
    if baseline.summary:
        lines.append(f"paired over the same items: {baseline.summary}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
