"""`cometnmt reproduce`: rerun rows of the COMET paper's Table 1 with several seeds and write a
report a reader can put beside the paper.

Each (row, seed) trains in its own subprocess (``cometnmt train PRESET --set train.seed=S``), so
several run side by side (``--jobs``) and every run is resumable: a finished run (``done.json``)
is skipped, an interrupted one continues from its ``last.pt``. Finished runs are then decoded
greedily (the paper's search) on the validation and test splits, and the report folder gets:

* ``report.md``: our numbers beside the paper's (dev and test; the paper's metric, sacreBLEU BLEU
  and chrF; mean ± standard deviation over seeds), a paired bootstrap test of COMET against the
  Transformer (per seed, and pooled over the seeds), Table 2-style examples, and the commit,
  configs, hardware and time that produced it;
* ``figure4_bleu_by_length.png``: BLEU difference COMET - Transformer by source length (Figure 4);
* ``learning_curves.png``: validation loss and BLEU per epoch;
* ``report.json``: everything above as data;
* ``hypotheses/ROW/seedS/{valid,test}.hyp``: each finished run's translations, copied from its run
  folder (``runs/``, too big to commit with its checkpoints), so scores can be recomputed later;
  those of runs the report does not cover are removed (:func:`~cometnmt.experiments.drop_hypotheses`).

``--candidate ROW`` sets another row against the Transformer in the bootstrap test, Figure 4 and
the examples (e.g. ``comet_bn_length``); the default is COMET, as in the paper.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cometnmt.data.corpus import write_text_file
from cometnmt.errors import CometNMTError
from cometnmt.experiments import PRESETS, REPO, RunSpec, best_behind_lines, capped_lines, case_note, check_run_args, check_run_configs, command_lines, curve_marker, eval_limit_cut, evaluation_mismatch, evaluation_options, fmt, fmt_p, how_it_ended, mean_sd, metrics, mixed_recipe_lines, provenance, provenance_lines, run_and_report, run_dir, run_test_split, save_split, test_hyps, validation_bleu_label
from cometnmt.training.run_files import EVAL_SPLITS, read_strict_json, strict_json

log = logging.getLogger(__name__)

REPO_CONFIGS = REPO / PRESETS


@dataclass(frozen=True)
class Row:
    preset: str  # file under the config folder
    label: str  # as printed in the paper's Table 1
    paper_dev: Optional[float]  # the paper's BLEU score (development)
    paper_test: Optional[float] = None
    in_paper: bool = True


ROWS: dict[str, Row] = {
    "comet": Row("comet.yaml", "COMET", 38.65, 38.69),
    "temporal_conv": Row("comet_temporal_conv.yaml", "Temporal Convolutions", 37.71),
    "ffn1": Row("comet_ffn1.yaml", "FFN-1", 38.10),
    "ffn2": Row("comet_ffn2.yaml", "FFN-2", 38.46),
    "src_sos_eos": Row("comet_src_sos_eos.yaml", "Source EOS/SOS token", 37.78),
    "conv4": Row("comet_conv4.yaml", "4-Layer Convolutional Subunit", 38.17),
    "transformer": Row("transformer.yaml", "Transformer", 38.33, 38.36),
    "dff1024": Row("transformer_dff1024.yaml", "d_ff = 1024", 38.37),
    "n4": Row("transformer_n4.yaml", "N = 4", 37.10),
    "n2": Row("transformer_n2.yaml", "N = 2", 37.70),
    "dm512": Row("transformer_dm512.yaml", "d_m = 512", 37.63),
    "dropout03": Row("transformer_dropout03.yaml", "dropout = 0.3", 37.89),
    # Not in the COMET paper's table: the other architectures of this toolkit, same data and search.
    "convs2s": Row("convs2s.yaml", "ConvS2S (not in the paper)", None, in_paper=False),
    "rnn": Row("rnn.yaml", "RNN + attention (not in the paper)", None, in_paper=False),
    "comet_bn_length": Row("comet_bn_length.yaml", "COMET, batch norm by length (not in the paper)", None, in_paper=False),
}


def add_arguments(p) -> None:
    p.add_argument("--rows", nargs="+", default=["comet", "transformer"], metavar="ROW",
                   help=f"Table 1 rows to run (default: comet transformer); 'all' = every paper row. Rows: {', '.join(ROWS)} "
                        "(a config of one's own: cometnmt compare CONFIG .../transformer.yaml --beam 1 --metrics bleu paper)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="training seeds (default 1 2 3)")
    p.add_argument("--out", default="reports/reproduce", help="report folder; runs are kept in OUT/runs")
    p.add_argument("--jobs", type=int, default=1, help="training runs side by side (several fit on one GPU)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run, e.g. train.max_epochs=5")
    p.add_argument("--config-dir", default=str(REPO_CONFIGS), help="folder of the presets")
    p.add_argument("--device", default="auto", help="device for training and decoding (auto = GPU if present)")
    p.add_argument("--eval-limit", type=int, help="decode only the first N sentences of each split (smoke runs; labelled in the report)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    p.add_argument("--candidate", metavar="ROW",
                   help="the row tested against the Transformer in the bootstrap test, Figure 4 and the examples "
                        "(default comet; must be one of --rows when given)")
    p.add_argument("--examples", type=int, default=5, help="Table 2-style examples per direction")
    p.add_argument("--report-only", action="store_true", help="do not train; report the finished runs in OUT/runs")
    p.add_argument("--deadline", type=float, help="seconds: start no run or evaluation after this, stop running trainings and evaluations "
                        "(they stay resumable; an evaluation stopped is done again by the next call), report what finished")
    p.add_argument("--merge-report", type=Path, metavar="REPORT_JSON",
                   help="runs asked for but without a folder in OUT/runs are taken from this earlier report.json "
                        "(e.g. runs trained on a machine whose checkpoints are gone); their bootstrap rows and "
                        "examples too, where their hypotheses are gone. A run whose folder is there but not "
                        "finished is not taken (it is listed as not finished, with a warning)")


# -- running ------------------------------------------------------------------------------------


def _specs(args, rows: list[str]) -> list[RunSpec]:
    """COMET and the Transformer first (all seeds), then the other rows seed by seed."""
    jobs = sorted(((r, s) for r in rows for s in args.seeds),
                  key=lambda j: (j[0] not in ("comet", "transformer"), j[1], rows.index(j[0])))
    return [RunSpec(r, Path(args.config_dir) / ROWS[r].preset, s, run_dir(Path(args.out), r, s)) for r, s in jobs]


def _evaluate_run(args, run: Path) -> dict:
    """Greedy-decode the validation and test splits with the run's best checkpoint; scored as
    compare scores (:func:`~cometnmt.evaluation.score_with`): where spaCy cannot tokenise a language
    (Japanese without SudachiPy, Korean without mecab-ko), BLEU and chrF without the paper's metric,
    a warning naming the package (once a language in this call: :func:`run_reproduce`), and ``not_computed``
    saying so."""
    from cometnmt.evaluation import paper_tokenizers, score_with
    from cometnmt.inference import Translator
    from cometnmt.training.checkpoint import BEST_CHECKPOINT

    translator = Translator.from_checkpoint(run / BEST_CHECKPOINT, args.device)
    # one hypothesis: greedy search of decode.nbest above 1 is a beam search of decode.beam_size
    # (Translator.translate), so a run trained with decode.nbest 3 was beam-decoded, reported as greedy
    dcfg = dataclasses.replace(translator.cfg.decode, method="greedy", nbest=1)
    data = translator.cfg.data
    tgt_tok, src_tok = paper_tokenizers(data.tgt_lang, data.src_lang)  # None where spaCy lacks the language (warned)
    out = {}
    for split in EVAL_SPLITS:
        done = translator.translate_split(split, dcfg, limit=args.eval_limit)
        size = save_split(run, split, done)
        out[split] = {**score_with(done.hyps, done.refs, tgt_tok, src_tok, lang=data.tgt_lang, src_lang=data.src_lang,
                                   src=done.src, per_sentence=True, lowercase=data.lowercase,
                                   what=f"{run.parent.name} {run.name}, {split}"), **size}  # the log line says which run
    history = [r for r in metrics(run) if r.get("event") == "valid"]
    out["epochs"] = history[-1]["epoch"] if history else 0  # the last validated epoch (not a count: an old resume bug lost one record)
    out["history"] = history
    out["stopping"] = translator.cfg.train.stopping  # what best.pt is best at
    out.update(how_it_ended(run))  # stopped_by: the rule, or a budget before it
    return out


def _checkpoint_label(records: list[dict]) -> str:
    """What the decoded best.pt was chosen on: validation loss, or BLEU under bleu_patience."""
    rules = {r.get("stopping", "loss_rise") for r in records} or {"loss_rise"}
    if rules == {"bleu_patience"}:
        return "best-validation-BLEU checkpoint"
    if "bleu_patience" in rules:
        return "best checkpoint (validation BLEU for runs with train.stopping=bleu_patience, validation loss for the others)"
    return "best-validation-loss checkpoint"


def _row_hint(name: str) -> str:
    """' (comet?)' for a --rows entry that is a row's name or paper label written otherwise ('COMET',
    'FFN-1', 'dropout = 0.3'), ' (ffn1 or ffn2?)' for one near two, else ''."""
    import difflib
    import re

    def key(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())

    exact = [row for row, r in ROWS.items() if key(name) in (key(row), key(r.label.split(" (")[0]))]
    close = exact or difflib.get_close_matches(key(name), [key(row) for row in ROWS], n=2, cutoff=0.6)
    rows = {key(row): row for row in ROWS}
    return f" ({' or '.join(rows.get(c, c) for c in close)}?)" if close else ""


def _config_rows_hint(args, unknown: list[str]) -> str:
    """Where a --rows entry is a config file (a researcher's own architecture, say): reproduce
    writes the paper's Table 1 beside the paper's scores, which such a config has none of; compare
    runs it against the Transformer preset with reproduce's search and metrics."""
    files = [r for r in unknown if r.endswith((".yaml", ".yml")) or Path(r).is_file()]
    if not files:
        return ""
    baseline = Path(args.config_dir) / ROWS["transformer"].preset
    return (f". Rows are the paper's Table 1, reported beside its scores, not config files: to test {files[0]} "
            f"against the Transformer with reproduce's greedy search and metrics, run `cometnmt compare {files[0]} "
            f"{baseline} --beam 1 --metrics bleu paper` (an architecture of one's own: with $COMETNMT_PLUGINS set)")


def run_reproduce(args) -> int:
    check_run_args(args)
    rows = list(r for r in ROWS if ROWS[r].in_paper) if args.rows == ["all"] else args.rows
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise CometNMTError(f"unknown row(s) {', '.join(r + _row_hint(r) for r in unknown)}; choose from: "
                            f"{', '.join(ROWS)} or 'all'"
                            f"{_config_rows_hint(args, unknown)}")
    cand = args.candidate
    if cand is not None and (cand not in rows or cand == "transformer"):
        hint = "" if cand in ROWS else _row_hint(cand)  # 'COMET', as the paper writes it: ' (comet?)'
        raise CometNMTError(f"--candidate {cand}{hint}: must be one of --rows ({', '.join(rows)}) other than transformer, "
                            "which it is tested against")
    missing = [ROWS[r].preset for r in rows if not (Path(args.config_dir) / ROWS[r].preset).exists()]
    if missing:
        raise CometNMTError(f"preset(s) not found in {args.config_dir}: {', '.join(missing)}")
    from cometnmt.config import load_config

    paths = [Path(args.config_dir) / ROWS[row].preset for row in rows]
    # every preset with the --set overrides (model.arch=transformer_pp, say), before any run starts
    check_run_configs(((path, load_config(path, args.set)) for path in paths), args.set)
    prev = _previous_report(args, rows)  # read (and checked) before any training, and before OUT/report.json is rewritten
    from cometnmt.data.tokenizers import warn_once_a_language

    with warn_once_a_language():  # a language spaCy cannot tokenise: warned of once in this call (it was once a run)
        return run_and_report(args, _specs(args, rows), lambda run: _evaluate_run(args, run),
                              lambda records, missing, seconds: build_report(args, rows, records, missing, seconds, prev))


# -- the report ---------------------------------------------------------------------------------


def summarise(rows: list[str], records: list[dict]) -> list[dict]:
    table = []
    for row in rows:
        recs = sorted((r for r in records if r["row"] == row), key=lambda r: r["seed"])  # not in merge order
        entry = {"row": row, "label": ROWS[row].label, "paper_dev": ROWS[row].paper_dev,
                 "paper_test": ROWS[row].paper_test, "seeds": [r["seed"] for r in recs]}
        for split in EVAL_SPLITS:
            for metric in ("paper_bleu", "bleu", "chrf"):  # paper_bleu: not where spaCy lacks the language
                entry[f"{split}_{metric}"] = mean_sd([r[split][metric] for r in recs if metric in r[split]])
        entry["epochs"] = mean_sd([r["epochs"] for r in recs])
        table.append(entry)
    return table


def _previous_report(args, rows: list[str]) -> dict:
    """The report named by --merge-report (empty without it), read before this call overwrites it."""
    path = getattr(args, "merge_report", None)
    if path is None:
        return {}
    try:
        # null named under "nonfinite" is the float again; an older report's bare NaN reads as it did
        prev = read_strict_json(Path(path).read_text(encoding="utf-8"))
        runs = prev["runs"]
        for r in runs:
            # the keys the report needs: paper_bleu, or bleu where it was not computed (a language spaCy lacks)
            r["row"], r["seed"], r["test"]["paper_bleu" if "paper_bleu" in r["test"] else "bleu"]
    except FileNotFoundError:
        raise CometNMTError(f"--merge-report: no such file: {path}") from None
    except IsADirectoryError:
        raise CometNMTError(f"--merge-report {path}: is a folder; name its report.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise CometNMTError(f"--merge-report: {path} is not a cometnmt reproduce report.json ({exc!r})") from None
    if "systems" in prev:  # compare's: its runs of presets' names decoded with their configs' search, no Figure 4 scores
        raise CometNMTError(f"--merge-report: {path} is a cometnmt compare report.json: its runs were decoded with each "
                            "config's search and scored without Figure 4's per-sentence scores; merge a reproduce report")
    # the runs it may merge (asked for, and not finished in OUT) must have been decoded as this call
    # decodes; its other runs are not reported, whatever their settings
    mergeable = [(f"{r['row']} seed {r['seed']}", r) for r in runs if r["row"] in rows and r["seed"] in args.seeds
                 and not run_dir(Path(args.out), r["row"], r["seed"]).exists()]
    evaluation_mismatch(mergeable, evaluation_options(args), f"--merge-report {path}", "or leave out --merge-report")
    return prev


def _merge(prev: dict, records: list[dict], missing: list[str], out: Path) -> tuple[list[dict], list[str], int]:
    """Add the previous report's runs that this call asked for and has no folder of. A run whose
    folder is in ``out`` without done.json (training, stopped by a deadline, its evaluation cut
    short, or its done.json deleted to evaluate it again) is not merged: before, the earlier
    report's numbers filled its row while the bootstrap test and examples read the test.hyp of the
    run here, another model's. It stays among the missing runs, and a warning names it."""
    wanted = set(missing)
    kept, unfinished = [], []
    for r in prev.get("runs", []):
        name = f"{r['row']} seed {r['seed']}"
        if name not in wanted:
            continue
        if run_dir(out, r["row"], r["seed"]).exists():
            unfinished.append(f"{name} ({run_dir(out, r['row'], r['seed'])})")
        else:
            kept.append(dict(r, merged_from_report=True))
    if unfinished:
        log.warning("--merge-report: not taken from the earlier report, as their folders here hold runs not finished "
                    "(reported as not finished; move a folder away to take the earlier report's run): %s",
                    ", ".join(unfinished))
    names = {f"{r['row']} seed {r['seed']}" for r in kept}
    return records + kept, [m for m in missing if m not in names], len(kept)


def build_report(args, rows: list[str], records: list[dict], missing: list[str], seconds: float,
                 prev: Optional[dict] = None) -> dict:
    out = Path(args.out)
    prev = prev or {}
    records, missing, n_merged = _merge(prev, records, missing, out)
    table = summarise(rows, records)
    report = {"provenance": provenance(args, seconds, records, missing), "table": table, "runs": records}
    if prev:
        report["provenance"]["merged_runs"] = n_merged
        report["provenance"]["merged_from"] = str(args.merge_report)
    cand = candidate(args)
    if cand in rows and "transformer" in rows:
        report["candidate"] = cand
        if prev.get("candidate", "comet") != cand:  # an earlier report's tests of another row do not apply
            prev = {k: v for k, v in prev.items() if k not in ("significance", "examples")}
        report["significance"] = _significance(args, out, records, prev, cand)
        # without the paper's metric (a language spaCy lacks: _not_computed_lines says so), neither
        paired = [r["test"] for pair in _paired_runs(records, cand) for r in pair]
        if all("bleu_by_length" in test for test in paired):
            report["figure4"] = _figure4(out, records, cand, args.eval_limit)
            left_out = _figure4_left_out(records, cand)
            if left_out is not None:  # runs scored before it was recorded: Figure 4 names the gaps in its range only
                report["figure4_left_out"] = left_out
        if all("sentence_bleu" in test for test in paired):
            report["examples"] = _examples(args, out, records, prev, cand)
    _learning_curves(out, rows, records)
    # whole or not at all (write_text_file): a report cut short by a kill or a full disk was kept by
    # the next call that finished nothing, and --merge-report could not read it
    # strict JSON: a number that is not finite (a run's NaN validation loss, a mean over it) is null,
    # named under "nonfinite"; a bare NaN was refused by render's schema and by strict readers
    write_text_file(out / "report.json", strict_json(report, indent=1, default=str))
    write_text_file(out / "report.md", _markdown(args, report))
    return report


def candidate(args) -> str:
    """The row tested against the Transformer: ``--candidate``, else COMET."""
    return args.candidate or "comet"


def short_label(row: str) -> str:
    """A row's label without its "(not in the paper)" note, for table columns."""
    return ROWS[row].label.split(" (")[0]


def _run_label(run: dict) -> str:
    """A run's row as the table names it (a row not of Table 1, merged from an earlier report: its name)."""
    return ROWS[run["row"]].label if run["row"] in ROWS else run["row"]


def _paired_runs(records: list[dict], cand: str) -> list[tuple[dict, dict]]:
    """(candidate, Transformer) run pairs of equal seed, by seed."""
    by = {(r["row"], r["seed"]): r for r in records}
    return [(by[(cand, s)], by[("transformer", s)]) for s in sorted(s for (row, s) in by if row == cand)
            if ("transformer", s) in by]


def _test_corpus(args, out: Path, rec: dict):
    return run_test_split(run_dir(out, rec["row"], rec["seed"]), args.eval_limit)


def _significance(args, out: Path, records: list[dict], prev: dict, cand: str) -> list[dict]:
    """Per seed pair, then pooled over the pairs whose hypotheses are here (sentences resampled once
    for all seeds; see :func:`~cometnmt.evaluation.paired_bootstrap_runs`). Pairs whose hypotheses are
    gone (merged runs) take their rows from the earlier report; its pooled rows replace ours when they
    cover all of this report's seed pairs and ours do not."""
    from cometnmt.data.tokenizers import paper_tokenizer
    from cometnmt.evaluation import paired_bootstrap, paired_bootstrap_runs

    results, seeds, runs_c, runs_t, refs, kw, names = [], [], [], [], None, None, ("paper", "bleu")
    pairs = _paired_runs(records, cand)
    earlier = prev.get("significance", [])
    for comet, trans in pairs:
        c_h, t_h = test_hyps(out, comet), test_hyps(out, trans)
        if c_h is None or t_h is None:  # merged runs: their rows of the earlier report
            results += [s for s in earlier if s["seed"] == comet["seed"]]
            continue
        if kw is None:
            _, refs, cfg = _test_corpus(args, out, comet)
            tok = paper_tokenizer(cfg.data.tgt_lang)  # None where spaCy lacks the language (warned): BLEU alone
            names = ("paper", "bleu") if tok else ("bleu",)
            # lowercased where either row was trained so (a run reused from a call with data.lowercase), as
            # its table row was scored: a lowercased Transformer scored cased lost to COMET (compare's rule)
            lowercase = cfg.data.lowercase or any("case:lc" in r.get("test", {}).get("bleu_signature", "")
                                                  for pair in pairs for r in pair)
            kw = {"n_samples": args.bootstrap, "tokenize": tok.tokenize if tok else None,
                  "lowercase": lowercase, "lang": cfg.data.tgt_lang}
        for metric in names:
            results.append({"seed": comet["seed"], **paired_bootstrap(
                c_h, t_h, refs, metric=metric, names=(f"{short_label(cand)} seed {comet['seed']}", f"Transformer seed {trans['seed']}"), **kw)})
        seeds.append(comet["seed"])
        runs_c.append(c_h)
        runs_t.append(t_h)
    all_seeds = [c["seed"] for c, _ in pairs]
    pooled = [s for s in earlier if s["seed"] == "pooled" and s.get("seeds") == all_seeds]
    if len(seeds) > 1 and (seeds == all_seeds or not pooled):
        for metric in names:
            pooled_names = tuple(f"{label} seeds {', '.join(map(str, seeds))}" for label in (short_label(cand), "Transformer"))
            results.append({"seed": "pooled", "seeds": seeds, **paired_bootstrap_runs(runs_c, runs_t, refs, metric=metric,
                                                                                     names=pooled_names, **kw)})
    else:
        results += pooled
    return results


def _figure4(out: Path, records: list[dict], cand: str, limit: Optional[int] = None) -> list[dict]:
    """Mean (over seed pairs) paper BLEU difference candidate (COMET) - Transformer per source length;
    the title says how many test sentences were decoded under ``--eval-limit`` (``limit``)."""
    diffs: dict[int, list[float]] = {}
    for comet, trans in _paired_runs(records, cand):
        t = {r["length"]: r["paper_bleu"] for r in trans["test"]["bleu_by_length"]}
        for r in comet["test"]["bleu_by_length"]:
            if r["length"] in t:
                diffs.setdefault(r["length"], []).append(r["paper_bleu"] - t[r["length"]])
    rows = [{"length": L, "diff": statistics.fmean(v), "pairs": len(v)} for L, v in sorted(diffs.items())]
    _draw_figure4(out, rows, records, cand, limit, _figure4_left_out(records, cand))
    return rows


def _figure4_left_out(records: list[dict], cand: str) -> Optional[list[int]]:
    """The test's source lengths with fewer than BY_LENGTH_MIN_COUNT sentences (no bar in Figure 4),
    as the paired runs' scores recorded them (``lengths_too_few``); None where a run predates it."""
    tests = [r["test"] for pair in _paired_runs(records, cand) for r in pair]
    if not tests or any("lengths_too_few" not in t for t in tests):
        return None
    return sorted({L for t in tests for L in t["lengths_too_few"]})


def _draw_figure4(out: Path, rows: list[dict], records: list[dict], cand: str, limit: Optional[int],
                  left_out: Optional[list[int]] = None) -> None:
    """figure4_bleu_by_length.png of :func:`_figure4`'s ``rows`` (and the lengths ``left_out`` for too
    few sentences): by the run or, from report.json's ``figure4``, by `cometnmt render`."""
    from cometnmt.evaluation import BY_LENGTH_MIN_COUNT
    from cometnmt.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([r["length"] for r in rows], [r["diff"] for r in rows],
           color=["tab:blue" if r["diff"] >= 0 else "tab:red" for r in rows])
    ax.axhline(0, color="black", linewidth=0.8)
    # a length of equal scores drew a bar of height 0, nothing, as a length left out (too few sentences) does
    equal = _figure4_equal(rows)
    if equal:
        ax.plot(equal, [0.0] * len(equal), "o", color="black", markersize=5, label=f"equal scores ({_EQUAL_RULE})")
    low, high = ax.get_ylim()  # bars of one sign end the axis at 0, cutting the dots there in half: room both sides
    room = 0.05 * (high - low)
    ax.set_ylim(min(low, -room), max(high, room))
    gaps = _figure4_gaps(rows, left_out)
    # runs scored before lengths_too_few was recorded: the lengths outside the plotted range are not known
    unknown = f"those outside {rows[0]['length']}–{rows[-1]['length']} not recorded" if left_out is None and rows else ""
    if gaps or unknown:  # an invisible handle: the legend's line names them
        named = "; ".join(t for t in (_ranges(gaps), unknown) if t)
        ax.plot([], [], " ", label=f"not plotted, fewer than {BY_LENGTH_MIN_COUNT} sentences: {named}")
    if equal or gaps or unknown:
        ax.legend(fontsize=8)
    ax.set_xlabel("source sentence length (spaCy tokens)")
    ax.set_ylabel(f"BLEU difference ({short_label(cand)} − Transformer)")
    pairs = _paired_runs(records, cand)
    n = max((c["test"].get("n_sentences", 0) for c, _ in pairs), default=0)
    # a limit at or above the test set's size decoded all of it: no note (experiments.eval_limit_cut)
    cut = eval_limit_cut([r for pair in pairs for r in pair], "test", limit)
    first = f"\nthe first {n} test sentences only (--eval-limit {limit})" if cut else ""
    ax.set_title(f"Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ {BY_LENGTH_MIN_COUNT} sentences{first}")
    fig.tight_layout()
    save_figure(fig, out / "figure4_bleu_by_length.png", dpi=120)
    plt.close(fig)


# Figure 4's differences are equal scores where they print as 0 to the decimals of every score in
# report.md: |difference| < 0.005, a bar too short to see, drawn as a dot at 0 (legend and caption say so)
FIGURE4_DECIMALS = 2
_EQUAL_RULE = f"|difference| < {0.5 * 10 ** -FIGURE4_DECIMALS:g}, {0:.{FIGURE4_DECIMALS}f} to {FIGURE4_DECIMALS} decimals"


def _figure4_equal(rows: list[dict]) -> list[int]:
    """Figure 4's lengths where both models score the same to FIGURE4_DECIMALS decimals: their bars
    have no height to see."""
    return [r["length"] for r in rows if abs(r["diff"]) < 0.5 * 10 ** -FIGURE4_DECIMALS]


def _figure4_gaps(rows: list[dict], left_out: Optional[list[int]] = None) -> list[int]:
    """Lengths without a bar: between Figure 4's shortest and longest plotted (fewer than
    BY_LENGTH_MIN_COUNT test sentences of that length, or none), and those ``left_out`` for too few
    sentences outside that range (shorter or longer; known for runs that recorded them)."""
    plotted = {r["length"] for r in rows}
    inside = [L for L in range(min(plotted), max(plotted) + 1) if L not in plotted] if plotted else []
    return sorted(set(inside) | set(left_out or []))


def _ranges(lengths: list[int]) -> str:
    """'5, 19, 21–23' for [5, 19, 21, 22, 23]."""
    runs: list[list[int]] = []
    for L in lengths:
        if runs and L == runs[-1][-1] + 1:
            runs[-1].append(L)
        else:
            runs.append([L])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def _examples(args, out: Path, records: list[dict], prev: dict, cand: str) -> list[dict]:
    """Test sentences of the first seed pair where the candidate's sentence BLEU most exceeds the
    Transformer's, and where it falls most short (at most ``--examples`` each, fewer where fewer
    sentences differ that way; the keys say "comet" for the candidate)."""
    pairs = _paired_runs(records, cand)
    if not pairs:
        return []
    comet, trans = pairs[0]
    c_h, t_h = test_hyps(out, comet), test_hyps(out, trans)
    if c_h is None or t_h is None:
        return prev.get("examples", [])
    src, refs, _ = _test_corpus(args, out, comet)
    c_s, t_s = comet["test"]["sentence_bleu"], trans["test"]["sentence_bleu"]
    order = sorted(range(len(refs)), key=lambda i: c_s[i] - t_s[i])
    better = [i for i in order[::-1] if c_s[i] > t_s[i]][: args.examples]  # never a tie, nor one sentence twice
    picks = better + [i for i in order if c_s[i] < t_s[i]][: args.examples]
    return [{"seed": comet["seed"], "index": i, "source": src[i], "reference": refs[i], "transformer": t_h[i], "comet": c_h[i],
             "transformer_bleu": t_s[i], "comet_bleu": c_s[i]} for i in picks]


def _learning_curves(out: Path, rows: list[str], records: list[dict]) -> None:
    from cometnmt.plots import pyplot, save_figure, whole_epochs

    plt = pyplot()

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, row in enumerate(rows):
        for rec in (r for r in records if r["row"] == row):
            hist = rec["history"]
            # a row of an older report.json that this commit's Table 1 lacks (`cometnmt render`): named by
            # its row, as report.md's notes name it, where it raised a KeyError
            name = ROWS[row].label if row in ROWS else row
            kw = {"color": f"C{i % 10}", "alpha": 0.8, "label": name if rec["seed"] == min(
                r["seed"] for r in records if r["row"] == row) else None, **curve_marker(hist)}
            a1.plot([h["epoch"] for h in hist], [h["val_loss"] for h in hist], **kw)
            if hist and "val_bleu" in hist[0]:
                a2.plot([h["epoch"] for h in hist], [h["val_bleu"] for h in hist], **kw)
    a1.set(xlabel="epoch", ylabel="validation loss (nats / token)", title="validation loss")
    a2.set(xlabel="epoch", ylabel=validation_bleu_label(records), title="validation BLEU")
    a2.set_ylim(bottom=0)  # BLEU is never below 0: runs of BLEU 0 throughout drew an axis from -0.05
    whole_epochs(a1, a2)
    if a1.get_legend_handles_labels()[0]:  # a report of no finished run has nothing to label
        a1.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "learning_curves.png", dpi=120)
    plt.close(fig)


def _not_computed_lines(runs: list[dict]) -> list[str]:
    """report.md's note on the runs scored without the paper's metric, as compare scores a target
    language spaCy cannot tokenise (Japanese without SudachiPy): what was left out, and the tokeniser
    their BLEU signature names (13a where sacreBLEU's for the language needs a package not installed)."""
    found: dict[tuple[str, str], list[str]] = {}
    for r in runs:
        test = r.get("test", {})
        if "not_computed" in test:
            tok = next((f for f in test.get("bleu_signature", "").split("|") if f.startswith("tok:")), "tok:?")
            name = _run_label(r)
            found.setdefault((test["not_computed"], tok), []).append(f"{name} seed {r['seed']}")
    return [""] * bool(found) + [
        f"- **not computed** for {', '.join(names)}: {why} (the log's warning names the package spaCy needs), so "
        f"this report is without it. Their BLEU is tokenised by sacreBLEU's `{tok}`"
        for (why, tok), names in found.items()]


def _figure4_caption(rows: list[dict], min_count: int, left_out: Optional[list[int]] = None) -> list[str]:
    """report.md's lines under Figure 4 telling a length of equal scores (a dot at 0) from one not
    plotted (no bar either), inside the plotted range and outside it (``left_out``; a report whose
    runs did not record them says so); none where there is neither, or no bar at all (said above)."""
    if not rows:
        return []
    equal, gaps = _figure4_equal(rows), _figure4_gaps(rows, left_out)
    lo, hi = rows[0]["length"], rows[-1]["length"]
    span, plotted = (f"{lo}–{hi}", f"Lengths {lo}–{hi} are plotted") if lo < hi else (f"{lo}", f"Length {lo} alone is plotted")
    inside, outside = [L for L in gaps if lo <= L <= hi], [L for L in gaps if not lo <= L <= hi]
    beyond = f"{_ranges(outside)} outside that range" if outside else ""
    text = [f"{plotted} but for {_ranges(inside)}: fewer than {min_count} test sentences"
            + (f", as for {beyond}." if beyond else ".") if inside else
            f"{plotted}; {beyond} have fewer than {min_count} test sentences." if beyond else "",
            "" if left_out is not None else f"Lengths outside {span} with fewer than {min_count} test sentences are "
            "not plotted and not named here (the runs' scores predate their record).",
            f"A dot at 0 marks equal scores ({_EQUAL_RULE}): {_ranges(equal)}." if equal else ""]
    text = [t for t in text if t]
    return ["", " ".join(text)] if text else []


def render(out: Path, report: dict) -> str:
    """Figure 4 (where the report has one) and the learning curves drawn into ``out``, and report.md's
    text returned, from ``report`` alone (a report.json, as `cometnmt render` reads it): what
    :func:`build_report` draws and writes from the same data."""
    if "figure4" in report:
        _draw_figure4(out, report["figure4"], report["runs"], report.get("candidate", "comet"),
                      report["provenance"].get("eval_limit"), report.get("figure4_left_out"))
    _learning_curves(out, [e["row"] for e in report["table"]], report["runs"])
    return _markdown(None, report)


def _markdown(args, report: dict) -> str:
    from cometnmt.evaluation import BY_LENGTH_MIN_COUNT, PAPER_BLEU_LABEL

    p = report["provenance"]
    lines = ["# COMET Table 1, reproduced", ""]
    lines += provenance_lines(p)
    if p.get("merged_from"):
        lines.append(f"- {p['merged_runs']} of the runs were taken from the earlier report `{p['merged_from']}` "
                     "(their folders were gone); where COMET's and the Transformer's hypotheses were gone too, "
                     "the bootstrap rows and examples are that report's")
    # "paper's" is the paper's score, "paper metric" its metric on our runs (headers once said "paper dev" and "ours dev (paper)")
    lines += ["", f"Paper's dev and test: the scores the COMET paper reports. Paper metric (the bootstrap's 'paper') = {PAPER_BLEU_LABEL}; "
              "BLEU and chrF = sacreBLEU on detokenised text "
              f"(signatures in report.json); scores {case_note(report['runs'], lambda r: short_label(r['row']) if r['row'] in ROWS else r['row'])}. Greedy decoding, " + _checkpoint_label(report["runs"]) + ". Mean ± sample sd (n − 1) over seeds; one seed has no ±.", ""]
    lines.append("| model | seeds | epochs | paper's dev | ours dev, paper metric | ours dev BLEU | paper's test | ours test, paper metric "
                 "| ours test BLEU | ours test chrF |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for e in report["table"]:
        pd = "–" if e["paper_dev"] is None else f"{e['paper_dev']:.2f}"
        pt = "–" if e["paper_test"] is None else f"{e['paper_test']:.2f}"
        lines.append(f"| {e['label']} | {len(e['seeds'])} | {fmt(e['epochs'])} | {pd} | {fmt(e['valid_paper_bleu'])} | "
                     f"{fmt(e['valid_bleu'])} | {pt} | {fmt(e['test_paper_bleu'])} | {fmt(e['test_bleu'])} | {fmt(e['test_chrf'])} |")
    lines += _not_computed_lines(report["runs"])
    lines += capped_lines(report["runs"], _run_label)
    lines += best_behind_lines(report["runs"], _run_label)
    lines += mixed_recipe_lines(report["runs"], _run_label)
    lines += ["", "## How each row was trained (seed of the first run; other seeds differ only in train.seed)", ""]
    for e in report["table"]:
        recs = sorted((r for r in report["runs"] if r["row"] == e["row"]), key=lambda r: r["seed"])
        if recs:
            lines += command_lines(e["label"], recs)
    name = short_label(report.get("candidate", "comet"))
    if report.get("significance"):
        lines += ["", f"## Paired bootstrap: {name} vs Transformer (test)", "",
                  f"p = fraction of bootstrap samples in which the Transformer scores at least as high as {name} "
                  "(one-sided). Pooled rows resample the sentences once for all seeds; BLEU there is the corpus BLEU "
                  "of each system's seeds concatenated, the paper's metric the mean over its seeds.", "",
                  f"| seed | metric | {name} | Transformer | Δ | p (Transformer ≥ {name}) |", "|---|---|---|---|---|---|"]
        for s in report["significance"]:
            seed = s["seed"] if s["seed"] != "pooled" else ", ".join(map(str, s["seeds"])) + " (pooled)"
            lines.append(f"| {seed} | {s['metric']} | {s['a']:.2f} | {s['b']:.2f} | {s['delta']:+.2f} | {fmt_p(s)} |")
    if "figure4" in report:  # empty: said, not left out with an empty PNG beside the report
        lines += ["", "## Figure 4: BLEU difference by source length", "",
                  "![figure 4](figure4_bleu_by_length.png)" if report["figure4"] else
                  f"None to plot: no source length has {BY_LENGTH_MIN_COUNT} or more test sentences decoded by both "
                  f"{name} and the Transformer of a seed"]
        lines += _figure4_caption(report["figure4"], BY_LENGTH_MIN_COUNT, report.get("figure4_left_out"))
    lines += ["", "## Learning curves", "", "![learning curves](learning_curves.png)", ""]
    if report.get("examples"):
        seed = report["examples"][0].get("seed")
        lines += ["## Table 2-style examples (test sentences where the models differ most)", "",
                  ("" if seed is None else f"Seed {seed}'s runs; ") + "sentence BLEU is the paper's metric of one sentence; "
                  "test lines are counted from 1, as an editor and `sed -n 24p` count them.", ""]
        for ex in report["examples"]:
            lines += [f"**Test line {ex['index'] + 1}** (sentence BLEU: {name} {ex['comet_bleu']:.1f}, Transformer {ex['transformer_bleu']:.1f})", "",
                      f"- Source: {ex['source']}", f"- Reference: {ex['reference']}",
                      f"- Transformer: {ex['transformer']}", f"- {name}: {ex['comet']}", ""]
    return "\n".join(lines) + "\n"
