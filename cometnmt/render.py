"""`cometnmt render`: rewrite a `reproduce` or `compare` report folder's ``report.md`` and figures
from its ``report.json``, without training, decoding or scoring.

A committed report keeps its ``report.json`` but not the run folders (``runs/``, checkpoints and
all), so ``--report-only`` cannot rebuild it; the JSON holds every number the report shows (the
table, every run's scores and learning curve, the bootstrap rows, Figure 4's differences, the
examples). Rendering it with today's code gives today's headers and wording over the numbers the
runs recorded; report.md's first line says that it was re-rendered, from which file, by which
command and commit, and keeps the original call's commit, command, hardware and date below it.
``report.json`` itself is not rewritten (copied as it is where ``--out`` is another folder).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Optional

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
    try:
        shown = _as_written_today(report, kind is reproduce)
        shown["provenance"]["rendered"] = rendered
        text = kind.render(out, shown)
    except (KeyError, TypeError, IndexError) as exc:  # a report.json of older code, without a key today's report shows
        raise CometNMTError(f"{path}: this report.json lacks what this commit's report shows ({exc!r}); render it with "
                            "the commit that wrote it (its provenance.commit)") from None
    if not same:
        write_text_file(out / "report.json", path.read_bytes().decode("utf-8"))
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
