"""Human-readable verdict for the terminal (`--json` prints the model instead); in a pipe, the
same lines without the box."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from shared.decision import POLICY_MEANING
from shared.events import Report, Verdict


def render_verdict(console: Console, verdict: Verdict | Report) -> None:
    colour = "green" if verdict.final_decision else ("yellow" if verdict.status == "completed" else "red")
    head = f"[{colour}]final_decision: {verdict.final_decision}[/]  status: {verdict.status}"
    if verdict.failed_stage:
        head += f"  failed_stage: {verdict.failed_stage}"
    if verdict.judge:
        judge = verdict.judge
        who = f"llm ({judge.model})" if judge.kind == "llm" else f"rules ({judge.reason or 'no LLM configured'})"
        head += f"\njudge: {who}"
        if judge.policy is not None and verdict.final_decision:
            head += f"\njudge_policy {judge.policy}: final_decision true means {POLICY_MEANING.get(judge.policy, '?')}"
    if verdict.result.decision is not None:
        d = verdict.result.decision
        colour = "green" if d.better else ("red" if d.answer == "worse" else "yellow")
        head += f"\n[{colour}]decision: {d.answer}[/]: {escape(d.summary)}"
    lines = [
        head,
        "",
        f"[bold]execution[/]: {escape(verdict.execution)}",
        f"[bold]return_checking[/]: {escape(verdict.return_checking)}",
        f"[bold]code[/]: {escape(verdict.code)}",
    ]
    result = verdict.result
    if result.benchmark and result.benchmark.accuracy_summary:
        lines.append("")
        lines.append(f"[bold]validation[/] (protocol {result.benchmark.protocol}): "
                     + _scores(result.benchmark.accuracy_summary))
    if result.baseline:
        b = result.baseline
        diff = f"{b.difference:+.4f}" if b.difference is not None else "n/a"
        lines.append(
            f"[bold]vs baseline[/] ({b.primary_metric}): candidate {b.candidate_value} "
            f"baseline {b.baseline_value} difference {diff}"
        )
        if b.summary:
            lines.append(f"[bold]paired[/]: {escape(b.summary)}")
    if result.campaign is not None:
        c = result.campaign
        state = "became the incumbent" if c.accepted else "refused"
        lines.append(f"[bold]campaign {escape(c.campaign)}[/] ({state}): {escape(c.summary)}")
    metrics = result.training_metrics
    if metrics.final_loss is not None:
        lines.append(f"[bold]loss[/]: initial {metrics.initial_loss:.4f} -> final {metrics.final_loss:.4f} "
                     f"({len(metrics.loss_history.train)} points)")
    if result.data_stats:
        lines.append(f"[bold]data[/]: {result.data_stats.total_samples} samples"
                     + (" (cached)" if result.data_cached else ""))
    if verdict.llm_usage is not None:
        usage = verdict.llm_usage
        lines.append(
            f"[bold]LLM calls in data processing[/]: {usage.requests} of {usage.budget_requests} allowed, "
            f"{usage.prompt_tokens + usage.completion_tokens} tokens"
            + (f", {usage.refused} refused over budget" if usage.refused else "")
        )
    if verdict.sandbox:
        warn = " [red](no isolation)[/]" if verdict.sandbox == "local" else ""
        lines.append(f"[bold]sandbox[/]: {verdict.sandbox}{warn}")
    if isinstance(verdict, Report):
        if verdict.benchmark_test:
            lines.append(f"[bold]test (hidden)[/] (protocol {verdict.benchmark_test.protocol}): "
                         + _scores(verdict.benchmark_test.accuracy_summary))
        elif verdict.benchmark_test_error:
            lines.append(f"[bold]test (hidden)[/]: {escape(verdict.benchmark_test_error)}")
    if not console.is_terminal:
        # In a pipe: the lines as they are (no box, no wrapping at 80 columns), for grep and less.
        console.print(f"verdict {verdict.request_id}", *lines, sep="\n", soft_wrap=True, highlight=False)
        return
    console.print(Panel("\n".join(lines), title=f"verdict {verdict.request_id}", expand=False))


def _scores(summary: dict[str, dict[str, float]]) -> str:
    return "; ".join(
        f"{dataset}: " + ", ".join(f"{metric}={value:.4f}" for metric, value in metrics.items())
        for dataset, metrics in summary.items()
    )
