"""Where a base model lives: a folder under the assets' ``models/``, or an absolute path."""

from __future__ import annotations

from pathlib import Path


class ModelNotFound(ValueError):
    pass


def available_models(assets_dir: Path) -> list[str]:
    models = assets_dir / "models"
    return sorted(p.name for p in models.iterdir() if p.is_dir()) if models.is_dir() else []


def resolve_base_model(assets_dir: Path, name: str) -> Path:
    """``name`` is a folder name under ``<assets>/models`` or an absolute path to a model folder."""
    candidate = Path(name)
    if candidate.is_absolute():
        if candidate.is_dir():
            return candidate
        raise ModelNotFound(f"base model {name} does not exist on this worker")
    if "/" not in name.strip("/") and (assets_dir / "models" / name).is_dir():
        return (assets_dir / "models" / name).resolve()
    known = ", ".join(available_models(assets_dir)) or "none (run `ftbus assets init`)"
    raise ModelNotFound(
        f"base model {name!r} is neither a folder under {assets_dir / 'models'} nor an absolute path; "
        f"available models: {known}"
    )
