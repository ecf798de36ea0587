"""`ftbus pull` and ``Client.pull``: a request's trained model, in a folder that ``transformers`` and
``peft`` load as it is.

The files are the training outputs the verdict references (``output/...`` of the workspace: the
adapter or the full weights, the tokenizer and config files, ``trainer_state.json`` and the loss
history), read from the models store (the one store an agent may read) and checked against the
sha256 the verdict carries. They are written into a hidden folder beside the destination, which
takes the destination's name only once every file is in and verified: a failed pull leaves nothing.

``what="merged"`` merges a LoRA adapter into its base model with ``peft`` (``merge_and_unload``),
in a Python that has it (the toolchain's, by default): ftbus's own environment does not carry
torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from shared.artifacts import ArtifactCorrupt, ArtifactMissing, ArtifactStore
from shared.events import WorkspaceFile
from shared.paths import UnsafePath, safe_join
from shared.retention import EXPIRED_MARKER, ExpiredMarker

if TYPE_CHECKING:
    from ftbus.client import Client

What = Literal["adapter", "merged"]
OUTPUT_PREFIX = "output/"
MERGE_SCRIPT = Path(__file__).resolve().parent / "toolchain" / "merge_adapter.py"

#: Called as the pull goes: (file path in the model folder, bytes of it written so far, its size).
PullProgress = Callable[[str, int, int], None]


class PullError(Exception):
    """The model cannot be pulled; the message says why and what to do."""


class ModelExpired(PullError):
    """The request's trained outputs were removed by the retention sweep."""


@dataclass(frozen=True)
class Pulled:
    request_id: str
    path: Path
    what: What
    #: ``lora`` (an adapter) or ``full`` (the model's own weights).
    model_kind: str
    files: list[str]
    bytes: int


def _outputs(verdict_artifacts: list[WorkspaceFile]) -> list[WorkspaceFile]:
    return [a for a in verdict_artifacts if a.path.startswith(OUTPUT_PREFIX) and a.path != OUTPUT_PREFIX]


def _staging(dest: Path, what: str) -> Path:
    return dest.parent / f".{dest.name}.ftbus-pull-{what}-{secrets.token_hex(4)}"


def _check_destination(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise PullError(f"{dest} exists and is not an empty folder: choose another --to, or remove it")


async def expiry_message(store: ArtifactStore, request_id: str) -> str | None:
    """What the retention sweep left when it removed ``request_id``'s outputs, in words; None if it
    did not remove them."""
    ref = await store.stat(f"{request_id}/{EXPIRED_MARKER}")
    if ref is None:
        return None
    marker = ExpiredMarker.model_validate_json(await store.get_bytes(ref))
    return marker.describe(request_id)


async def _download(store: ArtifactStore, request_id: str, files: list[WorkspaceFile], staging: Path,
                    on_progress: PullProgress | None) -> None:
    for item in files:
        rel = item.path[len(OUTPUT_PREFIX):]
        try:  # the verdict's paths name where files go on the user's disk: none may leave the folder
            target = safe_join(staging, rel)
        except UnsafePath as exc:
            raise PullError(f"{item.path} of {request_id}: {exc}; nothing was written") from exc
        if await store.stat(item.ref.name) is None:
            expired = await expiry_message(store, request_id)
            if expired:
                raise ModelExpired(expired)
            raise PullError(f"{item.path} of {request_id} is not in the models store (deleted, or stored before "
                            "ftbus kept trained outputs there): nothing was written")
        watcher = None
        if on_progress is not None:
            on_progress(rel, 0, item.ref.size)
            watcher = asyncio.create_task(_watch_size(staging, target, rel, item.ref.size, on_progress))
        try:
            await store.get_to_file(item.ref, target)
        except ArtifactCorrupt as exc:
            raise PullError(
                f"{rel}: the bytes read do not match the stored digest (sha256 {item.ref.sha256}, "
                f"{item.ref.size} bytes); nothing was written. Pull again; if it repeats, the stored copy is "
                f"damaged ({exc})"
            ) from exc
        except ArtifactMissing as exc:
            raise PullError(f"{rel}: removed while it was read ({exc}); nothing was written") from exc
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        if on_progress is not None:
            on_progress(rel, item.ref.size, item.ref.size)


async def _watch_size(staging: Path, target: Path, rel: str, size: int, on_progress: PullProgress) -> None:
    """The progress of one file: the size of its temporary file beside the target, twice a second."""
    prefix = f".{target.name}.ftbus-tmp-"
    while True:
        await asyncio.sleep(0.5)
        with contextlib.suppress(OSError):
            written = max((p.stat().st_size for p in target.parent.iterdir() if p.name.startswith(prefix)),
                          default=0)
            on_progress(rel, written, size)


def default_python() -> str:
    """A Python with peft and transformers: the toolchain's when there is one."""
    from shared.settings import Settings

    toolchain = Settings().toolchain_path()
    if toolchain is not None and (toolchain / "python").exists():
        return str(toolchain / "python")
    return sys.executable


def _base_model_of(adapter_dir: Path, given: Path | None, assets: Path) -> Path:
    if given is not None:
        if not given.is_dir():
            raise PullError(f"--base-model {given} is not a folder")
        return given
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    named = Path(str(config.get("base_model_name_or_path") or ""))
    for candidate in (named, assets / "models" / named.name):
        if str(candidate) not in ("", ".") and candidate.is_dir():
            return candidate
    raise PullError(f"the adapter's base model {str(named)!r} is not on this machine (nor under {assets}/models): "
                    "give its folder with --base-model PATH")


async def _merge(adapter_dir: Path, base: Path, out_dir: Path, python: str) -> None:
    from evaluation.engine import vllm_support

    engine_dir = Path(vllm_support.__file__).resolve().parent
    proc = await asyncio.create_subprocess_exec(
        python, str(MERGE_SCRIPT), str(engine_dir), str(adapter_dir), str(base), str(out_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await proc.communicate()
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-2000:]
        raise PullError(f"merging the adapter into {base} failed (exit {proc.returncode}, {python}); peft and "
                        f"transformers must be importable there (--python):\n{tail}")


async def pull(
    conn: Client,
    request_id: str,
    to: Path,
    *,
    what: What = "adapter",
    base_model: Path | None = None,
    python: str | None = None,
    on_progress: PullProgress | None = None,
) -> Pulled:
    """Download ``request_id``'s trained model into ``to`` (created; it must not hold anything)."""
    if what not in ("adapter", "merged"):
        raise PullError(f"unknown --what {what!r}: adapter or merged")
    dest = Path(to).absolute()
    _check_destination(dest)
    verdict = await conn.get(request_id)
    if verdict is None:
        raise PullError(f"no verdict for {request_id} yet: its model can be pulled once it has one "
                        f"(`ftbus status {request_id}`)")
    files = _outputs(verdict.artifacts)
    store = await conn.bus.guard(conn.bus.models_artifacts())
    if not files:
        expired = await expiry_message(store, request_id)
        if expired:
            raise ModelExpired(expired)
        stage = f" ({verdict.failed_stage})" if verdict.failed_stage else ""
        raise PullError(f"{request_id} has no trained model: its verdict references no training outputs{stage}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = _staging(dest, "files")
    merged_dir: Path | None = None
    try:
        await conn.bus.guard(_download(store, request_id, files, staging, on_progress))
        kind = "lora" if (staging / "adapter_config.json").is_file() else "full"
        final = staging
        if what == "merged" and kind == "lora":
            base = _base_model_of(staging, base_model, conn.bus.settings.assets)
            merged_dir = _staging(dest, "merged")
            await _merge(staging, base, merged_dir, python or default_python())
            final = merged_dir
        names = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
        total = sum((final / n).stat().st_size for n in names)
        if dest.is_dir():
            dest.rmdir()  # empty (checked above): the staging folder takes its place
        os.replace(final, dest)
    finally:
        for leftover in (staging, merged_dir):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return Pulled(request_id=request_id, path=dest, what=what, model_kind=kind, files=names, bytes=total)
