"""Self-describing checkpoints (DESIGN.md rule 8): weights, config, vocabularies and tokenizer
models, optimizer/scheduler/RNG state and trainer position, under a format version. Writes are
atomic (temp file in the same folder, then rename), so an interrupted write never leaves a torn
file behind."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from cometnmt.atomic import atomic_write
from cometnmt.config import changed_keys, config_from_dict, to_dict
from cometnmt.errors import CheckpointError, ConfigError

# a run folder's files, as the trainer names them; every reader names them by these constants
from cometnmt.training.run_files import (BEST_CHECKPOINT, CONFIG_FILE, EPOCH_CHECKPOINT, EPOCH_CHECKPOINT_GLOB,  # noqa: F401
                                         LAST_CHECKPOINT, METRICS_FILE)

FORMAT_VERSION = 1
log = logging.getLogger(__name__)


def epoch_checkpoint_name(epoch: int) -> str:
    """The name of epoch ``epoch``'s checkpoint: epoch001.pt, ..., epoch1000.pt (EPOCH_CHECKPOINT's)."""
    return f"epoch{epoch:03d}.pt"


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    with atomic_write(path, "wb") as f:
        torch.save({"format_version": FORMAT_VERSION, **payload}, f)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load and sanity-check a checkpoint; every failure is a CheckpointError naming the file.
    ``mmap``: for a few of its fields (step, trainer state, config, workdir) or the weights alone
    (``Translator.from_checkpoint``), the tensors are mapped from the file, not read (a paper-size
    run's last.pt was read whole, 137 MB, for its step); a file in torch's legacy format, which
    cannot be mapped, is read whole."""
    path = Path(path)
    if path.is_dir():
        found = (path / BEST_CHECKPOINT).exists() or (path / LAST_CHECKPOINT).exists()
        hint = f" ({BEST_CHECKPOINT} or {LAST_CHECKPOINT} in it?)" if found else ""
        raise CheckpointError(f"{path}: is a folder, not a checkpoint file{hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip archive, or a legacy pickle
        shown = "is empty" if not head else f"begins with {head!r}"
        # a config where a checkpoint belongs (`translate configs/tiny.yaml`): say which file to give
        config = (f"; it is a YAML config: give the checkpoint that `cometnmt train {path}` writes, "
                  f"{BEST_CHECKPOINT} in its train.save_dir") if path.suffix in (".yaml", ".yml") else ""
        raise CheckpointError(f"{path}: not a checkpoint; a PyTorch checkpoint is a zip archive, this file {shown}{config}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap and head.startswith(b"PK"))
    except Exception as exc:  # torch raises several types for truncated/garbled files
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        first = first.split(". ")[0]  # its first sentence: torch's go on with advice for its own developers
        first = first if len(first) <= 160 else first[:157].rstrip() + "..."
        reason = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable cometnmt checkpoint (corrupt or truncated? {reason})") from exc
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{path}: not a cometnmt checkpoint (no format_version)")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {payload['format_version']} is not supported (this version reads {FORMAT_VERSION})")
    for key in ("config", "codec", "model"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint lacks '{key}'")
    try:  # named here, not as a config file's key ("config key 'model.arch': 'mine' is not allowed" named no file)
        config_from_dict(payload["config"])
    except ConfigError as exc:
        hint = (" (an architecture added to cometnmt.models.REGISTRY by the code that trained it? register it before "
                "loading; for the CLI, name its module in $COMETNMT_PLUGINS)" if "'model.arch'" in str(exc) else "")
        raise CheckpointError(f"{path}: its config does not load in this version of cometnmt: {exc}{hint}") from None
    return payload


def epoch_checkpoints(folder: str | Path, up_to: int | None = None) -> list[Path]:
    """A run folder's epoch checkpoints, oldest first: by epoch number, as epoch999.pt comes
    before epoch1000.pt (sorted by name, epoch1000.pt came first, and the last N were not the
    newest N); names the trainer does not write (``epoch_avg.pt``) are not its epochs. ``up_to``:
    only those of epochs up to that one."""
    found = [(int(m.group(1)), p) for p in Path(folder).glob(EPOCH_CHECKPOINT_GLOB) if (m := EPOCH_CHECKPOINT.fullmatch(p.name))]
    return [p for epoch, p in sorted(found) if up_to is None or epoch <= up_to]


def _model_config(payload: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``model`` config as a nested dict, every key filled (older checkpoints lack
    keys added since, which mean their defaults)."""
    return to_dict(config_from_dict(payload["config"]).model)


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """Element-wise mean of the model weights of ``paths`` (floating tensors; integer buffers from
    the last file). Config, codec and metadata come from the last file; training state is dropped.
    The checkpoints must share the weights' names and shapes, the model config (dropout aside) and
    the vocabularies: else a CheckpointError names the file and what differs. Two files of the same
    step and weights (best.pt and the epoch checkpoint it copies) are warned of: the mean counts that model twice;
    so are checkpoints of several training runs (their ``run_id``s differ)."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    loaded = [load_checkpoint(p) for p in paths]
    keys = loaded[-1]["model"].keys()
    last_model = _model_config(loaded[-1])
    for p, ck in zip(paths, loaded):
        if ck["model"].keys() != keys:
            raise CheckpointError(f"{p}: model weights do not match {paths[-1]} (different architecture?)")
        shapes = [k for k in keys if ck["model"][k].shape != loaded[-1]["model"][k].shape]
        if shapes:
            raise CheckpointError(f"{p}: weight {shapes[0]} is {tuple(ck['model'][shapes[0]].shape)} but "
                                  f"{tuple(loaded[-1]['model'][shapes[0]].shape)} in {paths[-1]} (a different size or vocabulary)")
        # Weights of equal shapes may still mean different models (n_heads 4 or 8 split one matrix
        # differently; a COMET's ffn1 and ffn2 units): averaged, then run under the last file's
        # config, they gave a model that is neither. Dropout does not change what the weights compute.
        differ = [f"model.{key} ({a!r}, {b!r} in {paths[-1]})" for key, a, b in changed_keys(_model_config(ck), last_model)
                  if not key.rsplit(".", 1)[-1].endswith("dropout")]
        if differ:
            raise CheckpointError(f"{p}: its model differs from that of {paths[-1]} in {', '.join(differ)}; only "
                                  "checkpoints of one run can be averaged")
        if ck["codec"] != loaded[-1]["codec"]:
            raise CheckpointError(f"{p}: its vocabularies differ from those of {paths[-1]}; only checkpoints of one run can be averaged")
    runs: dict[str, Path] = {}  # a run's id -> its first file (checkpoints from before ids were kept: unchecked)
    for p, ck in zip(paths, loaded):
        if ck.get("run_id"):
            runs.setdefault(ck["run_id"], Path(p))
    if len(runs) > 1:
        # separately trained models do not average into one that works (their units need not line up);
        # a warning, not a refusal: runs fine-tuned from one checkpoint (--init-from) may average well
        log.warning("the checkpoints are of %d training runs (%s are of different ones): the weights of separately "
                    "trained models do not in general average into a working model; average one run's checkpoints, "
                    "or decode the runs as an ensemble (translate A.pt B.pt)", len(runs),
                    " and ".join(str(p) for p in runs.values()))
    for i, j in ((i, j) for i in range(len(loaded)) for j in range(i)):
        if loaded[i].get("step") == loaded[j].get("step") and all(
                torch.equal(loaded[i]["model"][k], loaded[j]["model"][k]) for k in keys):
            log.warning("%s and %s hold the same weights (step %s; %s is a copy of its epoch's): the average "
                        "counts them twice", paths[j], paths[i], loaded[i].get("step"), BEST_CHECKPOINT)
    avg = {}
    for key in keys:
        last = loaded[-1]["model"][key]
        if last.is_floating_point():
            avg[key] = torch.stack([ck["model"][key].float() for ck in loaded]).mean(0).to(last.dtype)
        else:
            avg[key] = last
    out = {k: v for k, v in loaded[-1].items() if k in ("config", "codec", "step", "epoch", "workdir")}
    out["model"] = avg
    out["averaged_from"] = [str(p) for p in paths]
    return out


def load_weights(model: torch.nn.Module, state: dict, path: str | Path) -> None:
    """``model.load_state_dict(state)``, where a state that does not fit the model its own
    checkpoint's config describes (a damaged or hand-edited file, or one from another code
    version) is a CheckpointError naming ``path`` and the first mismatch, not torch's traceback."""
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: its weights do not fit the model its config describes ({weights_misfit(exc)}); "
                              "the file is damaged, or was written by another version of cometnmt") from None


def weights_misfit(exc: RuntimeError) -> str:
    """The first mismatch of a ``load_state_dict`` error, not its "Error(s) in loading ..." line."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    detail = lines[1] if len(lines) > 1 else lines[0]
    return detail if len(detail) <= 200 else detail[:197].rstrip() + "..."
