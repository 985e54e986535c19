"""A run folder's file names, as the trainer writes them; every reader names them by these
constants (re-exported by :mod:`cometnmt.training.checkpoint`), and metrics.jsonl's lines, as the
trainer writes and every reader reads them (:func:`metrics_line`, :func:`read_metrics_record`). No
torch here, so the CLI's ``--help`` spells them without importing it."""

from __future__ import annotations

import json
import math
import re

LAST_CHECKPOINT = "last.pt"  # the run's latest state: each epoch's end, train.save_every, max_steps, an interrupt
BEST_CHECKPOINT = "best.pt"  # the best validation under the stopping rule's measure
EPOCH_CHECKPOINT = re.compile(r"epoch(\d+)\.pt")  # epoch_checkpoint_name's names (train.keep_checkpoints)
EPOCH_CHECKPOINT_GLOB = "epoch*.pt"  # a glob finding them (and names the trainer does not write: epoch_avg.pt)
METRICS_FILE = "metrics.jsonl"  # the run folder's log of train and valid records, one JSON object a line
CONFIG_FILE = "config.yaml"  # the run's config, written by train() as the run starts

# metrics.jsonl has no NaN or Infinity: JSON has none, and json.dumps' bare NaN, Infinity and -Infinity
# (a diverged run's loss, an fp16 validation that overflowed) are refused by strict readers (jq,
# JavaScript's JSON.parse, Go's encoding/json). A record's number that is not finite is written as
# null, as `evaluate --json` and `serve` write one, and named under this key with its value as
# Python's and JavaScript's float parsers spell it ("NaN", "Infinity", "-Infinity"), so that
# nothing is lost: {"loss": null, ..., "nonfinite": {"loss": "NaN"}}. Readers take both that and the
# bare NaN of files written before (read_metrics_record).
NONFINITE_KEY = "nonfinite"


def _spelled(value: float) -> str:
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def null_nonfinite(value):
    """``value`` with every float that is not finite (NaN, infinities), at any depth, as None: for
    JSON that strict readers take (metrics.jsonl here, ``evaluate --json``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: null_nonfinite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [null_nonfinite(v) for v in value]
    return value


def metrics_line(record: dict) -> str:
    """``record`` as one line of metrics.jsonl (no newline), valid JSON: a top-level number that is
    not finite is null, its value named under NONFINITE_KEY (see above); one deeper down (no
    record of the trainer has any) is null alone."""
    spelled = {k: _spelled(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    out = {k: null_nonfinite(v) for k, v in record.items()}
    if spelled:
        out[NONFINITE_KEY] = spelled
    return json.dumps(out, allow_nan=False)


def read_metrics_record(line: str) -> dict:
    """One line of metrics.jsonl as the trainer logged it: a value written as null and named under
    NONFINITE_KEY is that float again, and the key is gone; a line of a file from before (bare NaN,
    Infinity) reads as it always did. A line that is not JSON raises ValueError (json's)."""
    record = json.loads(line)
    if isinstance(record, dict) and isinstance(record.get(NONFINITE_KEY), dict):
        for key, value in record.pop(NONFINITE_KEY).items():
            if record.get(key) is None and value in ("NaN", "Infinity", "-Infinity"):
                record[key] = float(value)
    return record


def read_metrics(path) -> list[dict]:
    """Every record of the metrics.jsonl at ``path`` (:func:`read_metrics_record`); [] where there is none."""
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return []
    return [read_metrics_record(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
