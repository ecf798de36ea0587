"""Every list the user sees of the stages comes from the pipeline table (ftbus/stages.py)."""

from __future__ import annotations

from ftbus import batch, progress_view
from ftbus.client import LOG_FILES, LOG_STAGE
from ftbus.dashboard import views
from ftbus.stages import PIPELINE


def test_logs_name_stages_of_the_table_and_every_sandboxed_stage_has_one() -> None:
    stages = {spec.stage for spec in PIPELINE}
    assert set(LOG_STAGE) == set(LOG_FILES)
    assert set(LOG_STAGE.values()) <= stages
    # A stage that runs candidate code leaves a log under its own name: `ftbus logs` shows it by default.
    assert {spec.stage for spec in PIPELINE if spec.sandboxed} <= set(LOG_FILES)


def test_progress_views_and_dashboard_take_order_and_labels_from_the_table() -> None:
    table = [(spec.stage, spec.label) for spec in PIPELINE]
    assert list(batch.STAGE_LABELS.items()) == table
    # `submit --wait` shows every stage but the last (the aggregator's work is the verdict itself).
    assert list(progress_view.STAGE_LABELS.items()) == table[:-1]
    assert list(views.STAGE_ORDER) == [s for s, _ in table]
