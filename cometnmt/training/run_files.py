"""A run folder's file names, as the trainer writes them; every reader names them by these
constants (re-exported by :mod:`cometnmt.training.checkpoint`), and metrics.jsonl's lines, as the
trainer writes and every reader reads them (:func:`metrics_line`, :func:`read_metrics_record`), and
the strict JSON of the records `reproduce` and `compare` keep (a run's done.json, report.json:
:func:`strict_json`, :func:`read_strict_json`). No torch here, so the CLI's ``--help`` spells them
without importing it."""

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
EVAL_SPLITS = ("valid", "test")  # the splits reproduce and compare decode and score for each run, in report order

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


def null_nonfinite(value, found: dict[str, str] | None = None, at: str = ""):
    """``value`` with every float that is not finite (NaN, infinities), at any depth, as None: for
    JSON that strict readers take (metrics.jsonl here, ``evaluate --json``). ``found``: each such
    value's spelling is put there under its JSON Pointer (``at``: the pointer of ``value``)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if found is not None:
            found[at] = _spelled(value)
        return None
    if isinstance(value, dict):
        return {k: null_nonfinite(v, found, f"{at}/{_pointer_token(k)}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [null_nonfinite(v, found, f"{at}/{i}") for i, v in enumerate(value)]
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


def _pointer_token(key) -> str:
    """A key as one token of a JSON Pointer (RFC 6901): "~" and "/" escaped."""
    return str(key).replace("~", "~0").replace("/", "~1")


def strict_json(value, **dumps_kwargs) -> str:
    """``value`` (an object) as strict JSON text, for the records `reproduce` and `compare` write
    (a run's done.json, report.json): every float that is not finite, at any depth (a diverged
    run's validation loss in its learning curve, a mean over such a run), is null, and named with
    its value under NONFINITE_KEY by its JSON Pointer, ``{"history": [{"val_loss": null}], ...,
    "nonfinite": {"/history/0/val_loss": "NaN"}}``, so that :func:`read_strict_json` gives the
    float back. As metrics.jsonl (:func:`metrics_line`) names a record's own keys; a pointer, as
    these records nest. ``allow_nan=False`` guards the rule: a value it missed is an error, not a
    bare NaN that strict readers (jq, ``JSON.parse``, ``cometnmt render``'s schema) refuse."""
    found: dict[str, str] = {}
    out = null_nonfinite(value, found)
    if found:
        if not isinstance(out, dict):
            raise TypeError(f"strict_json: a value that is not finite needs an object to be named in, not {type(value).__name__}")
        out[NONFINITE_KEY] = found
    return json.dumps(out, allow_nan=False, **dumps_kwargs)


def read_strict_json(text: str):
    """JSON text as :func:`strict_json` wrote it: each value named under NONFINITE_KEY (a JSON
    Pointer) that is null is that float again, and the key is gone. Text written before (bare NaN,
    Infinity, which json.loads takes) reads as it always did. A pointer that names no null value
    (the file edited by hand) is left alone. Not JSON: ValueError (json's JSONDecodeError)."""
    value = json.loads(text)
    named = value.pop(NONFINITE_KEY) if isinstance(value, dict) and isinstance(value.get(NONFINITE_KEY), dict) else {}
    for pointer, spelled in named.items():
        if spelled not in ("NaN", "Infinity", "-Infinity") or not isinstance(pointer, str) or not pointer.startswith("/"):
            continue
        *path, last = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
        holder = value
        try:
            for token in path:
                holder = holder[_index(holder, token)]
            key = _index(holder, last)
            if holder[key] is None:
                holder[key] = float(spelled)
        except (KeyError, IndexError, ValueError, TypeError):
            continue
    return value


def _index(holder, token: str):
    """A JSON Pointer token as the key of ``holder``: a list's index (digits only: "-1" names no
    item, as Python's index would name the last), else the token itself."""
    if isinstance(holder, list):
        if not token.isdigit():
            raise IndexError(token)
        return int(token)
    return token


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
