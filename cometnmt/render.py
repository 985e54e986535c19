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
path (``table[1].seeds is missing``; the first such in the file's order), before anything is
drawn, so that an error raised while rendering is a bug of this code, raised as one.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path
from typing import Optional

import jsonschema

from cometnmt.atomic import atomic_write
from cometnmt.data.corpus import write_text_file
from cometnmt.errors import CometNMTError
from cometnmt.training.run_files import EVAL_SPLITS, read_strict_json


def read_report(path: Path) -> dict:
    """A reproduce or compare report.json; an error names the file and what is wrong with it."""
    try:
        # a number that is not finite: null named under "nonfinite" (read_strict_json gives the float
        # back), or the bare NaN of a report written before, which json.loads takes
        report = read_strict_json(Path(path).read_text(encoding="utf-8"))
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
# JSON Schemas (Draft 2020-12), checked with the jsonschema library. A key left out of "required"
# may be absent (the renderer reads it with .get); a "description" is what an error says was expected.
# What the renderer reads only in some cases (a run's ``epochs`` where a budget ended it) is an
# if/then. A key reproduce.render or compare.render comes to read goes in here too: tests/test_render.py
# renders every committed report.json recording each key read, and fails on one these do not declare.


def _obj(required: dict, optional: Optional[dict] = None, **more) -> dict:
    """An object with the keys of ``required`` (each value a schema) and, where present, of ``optional``."""
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}, **more}


def _list(items: dict, at_least: int = 0, what: str = "") -> dict:
    """A list of ``items``, at least ``at_least`` long (the renderer reads its first item)."""
    return {"type": "array", "items": items, **({"minItems": at_least} if at_least else {}),
            **({"description": what} if what else {})}


def _map(values: dict) -> dict:
    """An object of any keys (seeds, run names, loss names), each value ``values``."""
    return {"type": "object", "additionalProperties": values}


_NUM, _INT, _STR = {"type": "number"}, {"type": "integer"}, {"type": "string"}
_INTS, _STRS, _NUMS = _list(_INT), _list(_STR), _list(_NUM)
_MEAN_SD = _list({"type": ["number", "null"]}, 2, "a [mean, sd] pair of numbers or null")
_CI = _list(_NUM, 2, "a [low, high] pair of numbers")
_POINT = _list(_NUM, 2, "a [step, loss] pair of numbers")
_CHECKPOINT = _list(_STR, 1, "a list of checkpoint files")
# a run's training command, split (shlex.split) to be shown shortened and for its --set overrides:
# one with an unbalanced quote (hand-edited) is refused naming its key, not shown as written, since
# report.md would then give as the run's a command no shell runs
_COMMAND = {**_STR, "format": "shell-command", "description": "a shell command"}
# a run's validations: the BLEU curve is drawn where the first has val_bleu, from every one
_HISTORY = {**_list(_obj({"epoch": _NUM, "val_loss": _NUM}, {"val_bleu": _NUM, "val_bleu_sentences": _INT})),
            "if": {"prefixItems": [{"required": ["val_bleu"]}]}, "then": {"items": {"required": ["val_bleu"]}}}
# provenance_lines' keys; merged_runs where the report was merged from an earlier one, and both
# splits' sentence counts where any is given
_PROVENANCE = _obj(
    {"commit": _STR, "run_commits": _STRS, "command": _STR, "hardware": _STR, "torch": _STR, "date": _STR,
     "wall_seconds": _NUM, "train_hours": _NUM, "overrides": {**_STRS, "type": ["array", "null"]},
     "missing_runs": _STRS, "eval_limit": {"type": ["integer", "null"]}},
    {"runs_without_overrides": _map(_STRS), "merged_from": {"type": ["string", "null"]},
     "eval_limit_cut": {**_list({"enum": list(EVAL_SPLITS)}), "description": "the splits --eval-limit cut"},
     "sentences": {**_map(_INTS), "if": {"additionalProperties": {"maxItems": 0}},
                   "else": {"required": list(EVAL_SPLITS)}}},
    **{"if": {"properties": {"merged_from": {"type": "string", "minLength": 1}}, "required": ["merged_from"]},
       "then": {"properties": {"merged_runs": _INT}, "required": ["merged_runs"]}})


def _run(extra: dict, optional: Optional[dict] = None) -> dict:
    """A run's record: ``epochs`` is read where a budget ended it before its stopping rule
    (:func:`cometnmt.experiments.capped_lines`), and a compare report shows every run's."""
    capped = {"properties": {"stopped_by": {"enum": ["max_epochs", "max_steps"]},
                             "stopping": {"not": {"enum": [None, "none"]}}}, "required": ["stopped_by", "stopping"]}
    return _obj({"row": _STR, "seed": _INT, "command": _COMMAND, "history": _HISTORY, **extra},
                {"stopped_by": _STR, "stopping": {"type": ["string", "null"]}, "checkpoint": _CHECKPOINT,
                 "best_behind": _obj({"held_step": _INT, "stopping": _STR, "best_epoch": _INT, "best_step": _INT,
                                      "measure": _STR, "value": _NUM}), **(optional or {})},
                **{"if": capped, "then": {"properties": {"epochs": _NUM}, "required": ["epochs"]}})


def _reproduce_schema() -> dict:
    from cometnmt.reproduce import ROWS

    pair = {"metric": _STR, "a": _NUM, "b": _NUM, "delta": _NUM, "p_value": _NUM}
    pooled = {"properties": {"seed": {"const": "pooled"}}, "required": ["seed"]}
    significance = {**_obj(pair, {"n_samples": _INT}), "if": pooled,
                    "then": _obj({"seed": _STR, "seeds": _INTS}), "else": _obj({"seed": _INT})}
    paper = {"type": ["number", "null"]}
    test = _obj({}, {"bleu_signature": _STR, "not_computed": _STR, "sentence_bleu": _NUMS, "n_sentences": _INT,
                     "split_sentences": _INT})
    return _obj(
        {"provenance": _PROVENANCE,
         "table": _list(_obj({"row": _STR, "label": _STR, "seeds": _INTS, "epochs": _MEAN_SD, "paper_dev": paper,
                              "paper_test": paper, **{f"{split}_{metric}": _MEAN_SD for split in EVAL_SPLITS
                                                      for metric in ("paper_bleu", "bleu", "chrf")}})),
         "runs": _list(_run({"test": test}))},
        {"candidate": {"enum": list(ROWS), "description": "a row of this commit's Table 1 (cometnmt reproduce --rows)"},
         "significance": {**_list(significance), "type": ["array", "null"]},
         "figure4": _list(_obj({"length": _INT, "diff": _NUM})),
         "figure4_left_out": {**_INTS, "type": ["array", "null"]},
         "examples": _list(_obj({"index": _INT, "comet_bleu": _NUM, "transformer_bleu": _NUM, "source": _STR,
                                 "reference": _STR, "transformer": _STR, "comet": _STR}, {"seed": _INT}))})


def _compare_schema() -> dict:
    scores = _obj({"bleu": _NUM}, {"paper_bleu": _NUM})
    paper = {"properties": {"metrics": {"type": "array", "contains": {"const": "paper"}}}, "required": ["metrics"]}
    return _obj(
        {"provenance": _PROVENANCE, "systems": _list(_STR, 1, "a list of system names"),
         "table": _list(_obj({"system": _STR, "seeds": _INTS, "epochs": _MEAN_SD, "train_tokens_per_s": _MEAN_SD,
                              "valid_bleu": _MEAN_SD, "test_bleu": _MEAN_SD, "test_chrf": _MEAN_SD},
                             {"parameters": _NUM, "arch": _STR, "search": _STR, "checkpoints": _map(_CHECKPOINT),
                              "checkpoint": _CHECKPOINT})),
         "runs": _list(_run({"epochs": _NUM, "valid": scores,
                             "test": _obj({"bleu": _NUM, "chrf": _NUM}, {"paper_bleu": _NUM, "bleu_signature": _STR})},
                            {"aux_losses": _map(_list(_POINT))})),
         "significance": _list(_obj({"seeds": _INTS, "metric": _STR, "a_system": _STR, "b_system": _STR, "a": _NUM,
                                     "b": _NUM, "delta": _NUM, "a_ci95": _CI, "b_ci95": _CI, "p_value": _NUM},
                                    {"n_samples": _INT})),
         "aux_losses": _list(_obj({"system": _STR, "seed": _INT, "loss": _STR, "first": _NUM, "first_step": _INT,
                                   "last": _NUM, "last_step": _INT}))},
        {"metrics": _STRS},
        **{"if": paper, "then": {"properties": {"table": {"items": _obj(
            {"valid_paper_bleu": _MEAN_SD, "test_paper_bleu": _MEAN_SD})}}}})


# a whole number is an int, as the renderer reads it (JSON Schema's "integer" takes 2.0 too)
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=(
    jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, v: isinstance(v, int) and not isinstance(v, bool))))
_FORMATS = jsonschema.FormatChecker(formats=())
_FORMATS.checks("shell-command", raises=ValueError)(shlex.split)
_TYPE_NAMES = {"integer": "a whole number", "number": "a number", "string": "text", "null": "null", "array": "a list",
               "object": "an object", "boolean": "true or false"}
# a value's own type, named as the schema's types are
_NAMES = {python: _TYPE_NAMES[json_type] for python, json_type in ((int, "integer"), (float, "number"), (str, "string"),
                                                                  (type(None), "null"), (list, "array"), (dict, "object"),
                                                                  (bool, "boolean"))}


def _shown(value) -> str:
    text = json.dumps(value)
    return f"{_NAMES.get(type(value), type(value).__name__)} {text if len(text) <= 40 else text[:37] + '...'}"


def _key_path(keys) -> str:
    path = ""
    for key in keys:
        if isinstance(key, int):
            path += f"[{key}]"
        else:
            path += (f".{key}" if path else key) if key.isidentifier() else f"[{json.dumps(key)}]"
    return path


def _problems(error: jsonschema.ValidationError) -> list[tuple[list, str]]:
    """``error`` as (key path, text) pairs: ``table[1].seeds is missing`` (each key its object lacks:
    jsonschema raises one error per key but names none of them) or ``runs[1].seed is text "2",
    expected a whole number``."""
    at = list(error.absolute_path)
    if error.validator == "required":
        return [([*at, k], f"{_key_path([*at, k])} is missing") for k in error.validator_value if k not in error.instance]
    schema = error.schema if isinstance(error.schema, dict) else {}
    types = schema.get("type", [])
    expected = schema.get("description") or " or ".join(_TYPE_NAMES[t] for t in ([types] if isinstance(types, str) else types))
    why = f" ({error.cause})" if error.cause is not None else ""  # shlex's "No closing quotation"
    return [(at, f"{_key_path(at)} is {_shown(error.instance)}, expected {expected or error.message}{why}")]


def _file_order(report: dict, keys: list) -> tuple:
    """Where the value at ``keys`` stands in the file, as sortable positions: a key its object lacks
    after the keys the object has (where a reader of the file finds it missing)."""
    where, value = [], report
    for key in keys:
        if isinstance(value, dict):
            where.append(list(value).index(key) if key in value else len(value))
            value = value.get(key)
        else:
            where.append(key)
            value = value[key]
    return tuple(where)


def check_report_shape(path: Path, report: dict, compare: bool) -> None:
    """Raise a CometNMTError naming the first key of ``report`` (the report.json at ``path``), in the
    file's order, that is missing or not what this commit's renderer reads (``table[2].seeds is
    missing``), how many more there are, and what to do."""
    # every error, then the first in the file's order: jsonschema yields them in the schema's (an
    # object's missing keys before its wrong-typed ones), best_match the shallowest (runs[1].seed before runs[0]'s)
    validator = _Validator((_compare_schema if compare else _reproduce_schema)(), format_checker=_FORMATS)
    found: dict[str, tuple] = {}  # a problem's text -> its place; an if/then may report one twice
    for error in validator.iter_errors(report):
        for keys, text in _problems(error):
            found.setdefault(text, _file_order(report, keys))
    if found:
        first = min(found, key=found.get)
        more = f" (and {len(found) - 1} more key{'s' * (len(found) > 2)} after it)" if len(found) > 1 else ""
        commit = report["provenance"].get("commit") if isinstance(report["provenance"], dict) else None
        raise CometNMTError(f"{path}: {first}{more}; this commit's {'compare' if compare else 'reproduce'} report shows it. "
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
