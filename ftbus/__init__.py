"""ftbus: evaluate LLM fine-tuning candidates over NATS JetStream.

    from ftbus import Client
    verdict = Client().evaluate("examples/lora", base_model="tiny-llama", benchmark="tiny-sentiment")

See ftbus.client for the async API; ftbus.rdagent (extra ``ftbus[rdagent]``) for RD-Agent.
"""

from ftbus.client import LOG_FILES, Client, EvalTask, WaitTimeout
from shared.events import Progress, Report, TaskSpec, Timeouts, Verdict
from shared.records import RequestStatusView

__all__ = [
    "LOG_FILES",
    "Client",
    "EvalTask",
    "Progress",
    "Report",
    "RequestStatusView",
    "TaskSpec",
    "Timeouts",
    "Verdict",
    "WaitTimeout",
]
