"""The models a benchmark run scores: a request's trained outputs, fetched from the models store with
every pickle dropped, on top of the base model. The candidate's, and in a campaign its incumbent's
(services/benchmark/confirm.py runs the incumbent on the confirmation pool's items)."""

from __future__ import annotations

from pathlib import Path

from evaluation.models import ModelSelection, select_model
from services.benchmark.confirm import Reference
from shared.artifacts import ArtifactStore, materialise
from shared.events import WorkspaceFile
from shared.handling import StageContext

#: Weight formats that torch.load unpickles: loading one runs whatever code the pickle names.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def drop_pickled_weights(output_dir: Path) -> str | None:
    """Remove pickle-format files from the candidate's output, so no loader can unpickle them.

    Weights are data: the benchmark loads safetensors only. Returns the reason to refuse when
    nothing loadable is left (the candidate saved its model only as pickles)."""
    if not output_dir.is_dir():
        return None
    pickled = [p for p in output_dir.rglob("*") if p.suffix in PICKLE_SUFFIXES and (p.is_file() or p.is_symlink())]
    for path in pickled:
        path.unlink()
    weights = [p.name for p in pickled if p.name != "training_args.bin"]
    if weights and not any(output_dir.glob("*.safetensors")):
        return (
            f"the trained model was saved only in pickle format ({', '.join(sorted(weights)[:5])}); the benchmark "
            "never unpickles candidate files: save safetensors (LlamaFactory's default, save_safetensors: true)"
        )
    return None


async def trained_model(models: ArtifactStore, outputs: list[WorkspaceFile], folder: Path,
                        base_model: Path) -> ModelSelection | str:
    """A request's trained outputs under ``folder`` (its ``output/``), pickles dropped, as the model to
    score; or why it cannot be scored (it was saved only as pickles)."""
    await materialise(models, outputs, folder)
    refused = drop_pickled_weights(folder / "output")
    return refused if refused is not None else select_model(base_model, folder / "output")


class Incumbents:
    """Campaign incumbents' models for one handling: each fetched once, under the work folder."""

    def __init__(self, ctx: StageContext, base_model: Path) -> None:
        self.ctx = ctx
        self.base_model = base_model
        self.models: dict[str, ModelSelection] = {}

    async def model(self, reference: Reference) -> ModelSelection:
        """The incumbent's model. Its outputs were scored once already, so a refusal now (pickles only)
        means they changed in the store: an infrastructure error, not the candidate's."""
        rid = reference.incumbent
        assert rid is not None, "the base model is no incumbent"
        if rid not in self.models:
            models = await self.ctx.bus.models_artifacts()
            chosen = await trained_model(models, reference.outputs, self.ctx.workdir / "incumbent" / rid,
                                         self.base_model)
            if isinstance(chosen, str):
                raise RuntimeError(f"the incumbent {rid}'s trained outputs cannot be scored: {chosen}")
            self.models[rid] = chosen
        return self.models[rid]
