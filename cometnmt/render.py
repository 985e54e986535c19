"""`cometnmt render`: rewrite a `reproduce` or `compare` report folder's ``report.md`` and figures
from its ``report.json``, without training, decoding or scoring.

A committed report keeps its ``report.json`` but not the run folders (``runs/``, checkpoints and
all), so ``--report-only`` cannot rebuild it; the JSON holds every number the report shows (the
table, every run's scores and learning curve, the bootstrap rows, Figure 4's differences, the
examples). Rendering it with today's code gives today's headers and wording over the numbers the
runs recorded; report.md's first line says that it was re-rendered, from which file, by which
command and commit, and keeps the original call's commit, command, hardware and date below it.
``report.json`` itself is not rewritten (copied as it is where ``--out`` is another folder).

The file is checked whole first (:func:`check_report_shape`) against what this commit's report
reads from it: one of older code without a key today's report shows is refused naming the key's
path (``table[1].seeds is missing``), before anything is drawn, so that an error raised while
rendering is a bug of this code, raised as one.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path
from typing import Optional

from cometnmt.atomic import atomic_write
from cometnmt.data.corpus import write_text_file
from cometnmt.errors import CometNMTError


def read_report(path: Path) -> dict:
    """A reproduce or compare report.json; an error names the file and what is wrong with it."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CometNMTError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CometNMTError(f"{path}: is a folder; name its report.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CometNMTError(f"{path}: not JSON ({exc})") from None
    if not isinstance(report, dict) or not {"provenance", "table", "runs"} <= set(report):
        raise CometNMTError(f"{path}: not a cometnmt reproduce or compare report.json (it needs the keys provenance, "
                            "table and runs)")
    return report


# -- what this commit's renderer reads from a report.json ---------------------------------------
#
# A spec is: a type or tuple of types (the value is one of them; True is no number); ``[spec]``, a
# list of such values; a dict, an object with those keys (one ending in "?" may be absent: the
# renderer reads it with .get); :class:`_Map`, an object of any keys; :class:`_List`, a list of at
# least some items; :class:`_Choice`, one of some values; or a function of the value giving its
# spec, for what the renderer reads only in some cases (a run's ``epochs`` where a budget ended it).
# Keep it beside reproduce.render and compare.render: a key they come to read goes in here too.


class _Map:
    """An object of any keys (seeds, run names, loss names), each value of ``spec``."""

    def __init__(self, spec):
        self.spec = spec


class _List:
    """A list of ``spec``, at least ``at_least`` long (the renderer reads its first item)."""

    def __init__(self, spec, at_least: int = 0, what: str = ""):
        self.spec, self.at_least, self.what = spec, at_least, what


class _Choice:
    """One of ``values`` (``what`` names them in the error)."""

    def __init__(self, values, what: str):
        self.values, self.what = set(values), what


_NUM = (int, float)
_MEAN_SD = _List((int, float, type(None)), 2, "a [mean, sd] pair of numbers or null")
_CI = _List(_NUM, 2, "a [low, high] pair of numbers")
_POINT = _List(_NUM, 2, "a [step, loss] pair of numbers")
_HISTORY = {"epoch": _NUM, "val_loss": _NUM, "val_bleu?": _NUM, "val_bleu_sentences?": int}


def _history(hist):
    """A run's validations: the BLEU curve is drawn where the first has val_bleu, from every one."""
    with_bleu = isinstance(hist, list) and hist and isinstance(hist[0], dict) and "val_bleu" in hist[0]
    return [{**_HISTORY, "val_bleu": _NUM} if with_bleu else _HISTORY]


def _run(extra: dict):
    """A run's record: ``epochs`` is read where a budget ended it before its stopping rule
    (:func:`cometnmt.experiments.capped_lines`), and a compare report shows every run's."""
    def spec(run):
        capped = isinstance(run, dict) and run.get("stopped_by") in ("max_epochs", "max_steps") \
            and run.get("stopping") not in (None, "none")
        return {"row": str, "seed": int, "command": str, "history": _history, "stopped_by?": str,
                "stopping?": (str, type(None)), "checkpoint?": _List(str, 1, "a list of checkpoint files"),
                "best_behind?": {"held_step": int, "stopping": str, "best_epoch": int, "best_step": int,
                                 "measure": str, "value": _NUM},
                **({"epochs": _NUM} if capped else {}), **extra}
    return spec


def _provenance(prov):
    """provenance_lines' keys; ``merged_runs`` where the report was merged from an earlier one, and
    both splits' sentence counts where any is given."""
    merged = isinstance(prov, dict) and prov.get("merged_from")
    counts = isinstance(prov, dict) and isinstance(prov.get("sentences"), dict) and any(prov["sentences"].values())
    return {"commit": str, "run_commits": [str], "command": str, "hardware": str, "torch": str, "date": str,
            "wall_seconds": _NUM, "train_hours": _NUM, "overrides": ([str], type(None)), "missing_runs": [str],
            "eval_limit": (int, type(None)), "runs_without_overrides?": _Map([str]), "merged_from?": (str, type(None)),
            **({"merged_runs": int} if merged else {}),
            "sentences?": {"valid": [int], "test": [int]} if counts else _Map([int])}


def _reproduce_spec(report: dict) -> dict:
    from cometnmt.reproduce import ROWS

    pair = {"metric": str, "a": _NUM, "b": _NUM, "delta": _NUM, "p_value": _NUM, "n_samples?": int}
    test = {"bleu_signature?": str, "not_computed?": str, "sentence_bleu?": [_NUM], "n_sentences?": int}
    return {
        "provenance": _provenance,
        "candidate?": _Choice(ROWS, "a row of this commit's Table 1 (cometnmt reproduce --rows)"),
        "table": [{"row": str, "label": str, "seeds": [int], "epochs": _MEAN_SD, "paper_dev": (*_NUM, type(None)),
                   "paper_test": (*_NUM, type(None)), **{f"{split}_{metric}": _MEAN_SD for split in ("valid", "test")
                                                       for metric in ("paper_bleu", "bleu", "chrf")}}],
        "runs": [_run({"test": test})],
        "significance?": ([lambda s: {**pair, "seed": str, "seeds": [int]} if isinstance(s, dict) and s.get("seed") == "pooled"
                           else {**pair, "seed": int}], type(None)),
        "figure4?": [{"length": int, "diff": _NUM}],
        "figure4_left_out?": ([int], type(None)),
        "examples?": [{"index": int, "comet_bleu": _NUM, "transformer_bleu": _NUM, "source": str, "reference": str,
                       "transformer": str, "comet": str, "seed?": int}],
    }


def _compare_spec(report: dict) -> dict:
    paper = isinstance(report.get("metrics"), list) and "paper" in report["metrics"]
    scores = {"bleu": _NUM, "paper_bleu?": _NUM}
    checkpoint = _List(str, 1, "a list of checkpoint files")
    return {
        "provenance": _provenance,
        "systems": _List(str, 1, "a list of system names"),
        "metrics?": [str],
        "table": [{"system": str, "seeds": [int], "epochs": _MEAN_SD, "train_tokens_per_s": _MEAN_SD,
                   "parameters?": _NUM, "arch?": str, "search?": str, "checkpoints?": _Map(checkpoint),
                   "checkpoint?": checkpoint, "valid_bleu": _MEAN_SD, "test_bleu": _MEAN_SD, "test_chrf": _MEAN_SD,
                   **({"valid_paper_bleu": _MEAN_SD, "test_paper_bleu": _MEAN_SD} if paper else {})}],
        "runs": [_run({"epochs": _NUM, "valid": scores, "test": {**scores, "chrf": _NUM, "bleu_signature?": str},
                       "aux_losses?": _Map([_POINT])})],
        "significance": [{"seeds": [int], "metric": str, "a_system": str, "b_system": str, "a": _NUM, "b": _NUM,
                          "delta": _NUM, "a_ci95": _CI, "b_ci95": _CI, "p_value": _NUM, "n_samples?": int}],
        "aux_losses": [{"system": str, "seed": int, "loss": str, "first": _NUM, "first_step": int, "last": _NUM,
                        "last_step": int}],
    }


_NAMES = {int: "a whole number", float: "a number", str: "text", type(None): "null", list: "a list", dict: "an object",
          bool: "true or false"}


def _expected(spec) -> str:
    if isinstance(spec, tuple):
        names = list(dict.fromkeys("a number" if t in (int, float) and float in spec else _expected(t) for t in spec))
        return " or ".join(names)
    if isinstance(spec, type):
        return _NAMES.get(spec, spec.__name__)
    if isinstance(spec, (list, _List)):
        return getattr(spec, "what", "") or "a list"
    return "an object"


def _shown(value) -> str:
    text = json.dumps(value)
    return f"{_NAMES.get(type(value), type(value).__name__)} {text if len(text) <= 40 else text[:37] + '...'}"


def _key_path(path: str, key) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path and key.isidentifier() else f"{path}[{json.dumps(key)}]" if path else key


def _shape_problem(value, spec, path: str) -> Optional[str]:
    """What is wrong at the first place ``value`` does not fit ``spec`` (its key path first), or None."""
    if callable(spec) and not isinstance(spec, type):
        return _shape_problem(value, spec(value), path)
    if isinstance(spec, tuple) and any(not isinstance(s, type) for s in spec):  # ([str], None): a list or null
        if any(isinstance(s, type) and isinstance(value, s) for s in spec):
            return None
        fits = [s for s in spec if isinstance(value, list if isinstance(s, (list, _List)) else dict)]
        if fits:
            return _shape_problem(value, fits[0], path)
        return f"{path} is {_shown(value)}, expected {' or '.join(_expected(s) for s in spec)}"
    if isinstance(spec, (type, tuple)):
        kinds = spec if isinstance(spec, tuple) else (spec,)
        if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
            return None
        return f"{path} is {_shown(value)}, expected {_expected(spec)}"
    if isinstance(spec, _Choice):
        return None if isinstance(value, str) and value in spec.values else f"{path} is {_shown(value)}, expected {spec.what}"
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{path} is {_shown(value)}, expected an object"
        for key, sub in spec.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{_key_path(path, name)} is missing"
            found = _shape_problem(value[name], sub, _key_path(path, name))
            if found:
                return found
        return None
    if isinstance(spec, _Map):
        if not isinstance(value, dict):
            return f"{path} is {_shown(value)}, expected an object"
        return next((p for k, v in value.items() if (p := _shape_problem(v, spec.spec, _key_path(path, k)))), None)
    items, at_least = (spec.spec, spec.at_least) if isinstance(spec, _List) else (spec[0], 0)
    if not isinstance(value, list) or len(value) < at_least:
        return f"{path} is {_shown(value)}, expected {_expected(spec)}"
    return next((p for i, v in enumerate(value) if (p := _shape_problem(v, items, _key_path(path, i)))), None)


def check_report_shape(path: Path, report: dict, compare: bool) -> None:
    """Raise a CometNMTError naming the first key of ``report`` (the report.json at ``path``) that is
    missing or not what this commit's renderer reads (``table[2].seeds is missing``), and what to do."""
    problem = _shape_problem(report, (_compare_spec if compare else _reproduce_spec)(report), "")
    if problem:
        commit = report["provenance"].get("commit") if isinstance(report["provenance"], dict) else None
        raise CometNMTError(f"{path}: {problem}; this commit's {'compare' if compare else 'reproduce'} report shows it. "
                            "Render the file with the commit that wrote it"
                            + (f" (provenance.commit: {commit})" if isinstance(commit, str) else "") + ", or mend that key")


def render_report(path: Path, out: Optional[Path] = None) -> Path:
    """Write report.md and the figures of the report.json at ``path`` into ``out`` (default: its
    folder); returns report.md's path. A compare report (it names its ``systems``) is drawn as
    compare draws one, any other as reproduce's."""
    from cometnmt import compare, reproduce
    from cometnmt.experiments import _report_commit

    path = Path(path)
    report = read_report(path)
    out = Path(out) if out is not None else path.parent
    out.mkdir(parents=True, exist_ok=True)
    same = (out / "report.json").resolve() == path.resolve()
    command = ["cometnmt", "render", str(path)] + ([] if out == path.parent else ["--out", str(out)])
    rendered = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "from": str(path), "command": shlex.join(command),
                "commit": _report_commit(str(out))}
    kind = compare if "systems" in report else reproduce
    # the file is checked whole before anything is drawn: a KeyError or TypeError while rendering is
    # then a bug of this code, raised as one (it was reported as the file lacking what the report shows)
    check_report_shape(path, report, kind is compare)
    shown = _as_written_today(report, kind is reproduce)
    shown["provenance"]["rendered"] = rendered
    text = kind.render(out, shown)
    if not same:  # byte for byte: report.json is the record, not rewritten
        with atomic_write(out / "report.json", "wb") as f, path.open("rb") as src:
            shutil.copyfileobj(src, f)
    write_text_file(out / "report.md", text)
    return out / "report.md"


def _as_written_today(report: dict, reproduce: bool) -> dict:
    """``report`` (a copy) with what older code left out of report.json, or wrote otherwise, as
    today's writes it, each derived from the file's own numbers (none made up):

    * ``provenance.runs_without_overrides``, from each run's recorded command and the overrides
      (older code derived it when it wrote report.md and did not keep it);
    * a compare row's checkpoints by seed (``checkpoints``), from its runs' ``checkpoint`` (older code
      read them from the runs when it wrote report.md: without them the row names the first seed's alone);
    * no standard deviation for a table row of one seed (older code wrote 0.0, which report.md now
      shows as ``± 0.00``, a spread that one seed does not have);
    * the seed of a reproduce report's examples (older ones lack it): the seed pair whose recorded
      per-sentence scores (``sentence_bleu``) are the examples' scores, where exactly one is."""
    from cometnmt.experiments import _runs_without

    report = {**report, "provenance": dict(report["provenance"])}
    prov = report["provenance"]
    if "runs_without_overrides" not in prov:
        prov["runs_without_overrides"] = _runs_without(report["runs"], prov.get("overrides") or [])
    report["table"] = [_one_seed_no_sd(e) for e in report["table"]]
    if not reproduce:
        report["table"] = [_checkpoints_by_seed(e, report["runs"]) for e in report["table"]]
    if reproduce and report.get("examples") and "seed" not in report["examples"][0]:
        seed = _examples_seed(report)
        if seed is not None:
            report["examples"] = [dict(ex, seed=seed) for ex in report["examples"]]
    return report


def _checkpoints_by_seed(entry: dict, runs: list[dict]) -> dict:
    """A compare table row with ``checkpoints`` (seed -> checkpoint files) where it lacks them."""
    if "checkpoints" in entry:
        return entry
    found = {r["seed"]: r["checkpoint"] for r in sorted(runs, key=lambda r: r["seed"])
             if r["row"] == entry.get("system") and "checkpoint" in r}
    return dict(entry, checkpoints=found) if found else entry


def _one_seed_no_sd(entry: dict) -> dict:
    """A table row's (mean, sd) pairs with sd None where the row has one seed."""
    if len(entry.get("seeds", [])) != 1:
        return entry

    def pair(v) -> bool:
        return isinstance(v, list) and len(v) == 2 and all(x is None or isinstance(x, (int, float)) for x in v)

    return {k: [v[0], None] if pair(v) else v for k, v in entry.items()}


def _examples_seed(report: dict):
    """The one seed whose candidate and Transformer runs scored every example as the example says;
    None where no seed, or more than one, does."""
    cand = report.get("candidate", "comet")
    by = {(r["row"], r["seed"]): r["test"].get("sentence_bleu") for r in report["runs"]}
    seeds = []
    for (row, seed), c_s in by.items():
        t_s = by.get(("transformer", seed))
        if row != cand or c_s is None or t_s is None:
            continue
        if all(ex["index"] < len(c_s) and (c_s[ex["index"]], t_s[ex["index"]]) == (ex["comet_bleu"], ex["transformer_bleu"])
               for ex in report["examples"]):
            seeds.append(seed)
    return seeds[0] if len(seeds) == 1 else None
