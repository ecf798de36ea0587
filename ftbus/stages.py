"""The pipeline: every stage's spec, in order. Nothing else lists the stages.

The CLI runs them from here (`ftbus up`, `ftbus worker STAGE`), each worker's consumer filters on
what its row reads and its results are routed by its row, the aggregator learns what the stages
read from it, the permission generator makes each stage's NATS user from it, and the progress views
take their order and labels from it (docs/architecture.md, "The pipeline table").
"""

from __future__ import annotations

from services.aggregator.main import SPEC as AGGREGATE
from services.benchmark.service import SPEC as BENCH
from services.data.service import SPEC as DATA
from services.judge.service import SPEC as JUDGE
from services.trainer.service import SPEC as TRAIN
from shared.events import Stage
from shared.stagespec import StageSpec

PIPELINE: tuple[StageSpec, ...] = (DATA, TRAIN, BENCH, JUDGE, AGGREGATE)
BY_STAGE: dict[Stage, StageSpec] = {spec.stage: spec for spec in PIPELINE}
#: Progress views: stage name -> label, in pipeline order.
LABELS: dict[str, str] = {spec.stage: spec.label for spec in PIPELINE}
