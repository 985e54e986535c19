"""`cometnmt compare`: train two or more configs with several seeds and test the first against
each of the others, the way a paper compares a model with its baseline.

Every (config, seed) trains in its own resumable subprocess (see :mod:`cometnmt.experiments`), is
evaluated as its config says (its own search: beam size, length penalty), on its best checkpoint
or, with ``--average-last N``, on the average of its last N epoch checkpoints, and is scored on the
validation and test splits with sacreBLEU (cased BLEU and chrF on detokenised text). The report
folder gets:

* ``report.md``: mean ± sd over seeds per system, every run, a paired bootstrap test of the first
  system against each other one per seed and pooled over the seeds (sentences resampled once for
  all runs), the auxiliary task losses (Transformer++'s POS and NER) from first to last logged
  value, and the commit, hardware and commands that produced it;
* ``learning_curves.png``: validation loss and BLEU per epoch, and the auxiliary losses by step;
* ``report.json``: all of it as data. Each run folder keeps its ``valid.hyp`` / ``test.hyp`` and,
  with ``--average-last``, the averaged model ``avg.pt``;
* ``hypotheses/NAME/seedS/{valid,test}.hyp``: those hypotheses copied beside the report, which a
  commit of the report folder keeps without the run folders (``runs/``); those of runs the report
  does not cover are removed (:func:`~cometnmt.experiments.drop_hypotheses`).

Transformer++ against its same-size Transformer (the paper's recipe: average the last 10
checkpoints, beam 5, length penalty 0.5, both in the presets)::

    cometnmt compare configs/multi30k/transformer_pp_en_de.yaml \\
        configs/multi30k/transformer_pp_baseline_en_de.yaml --seeds 1 2 3 --average-last 10 \\
        --out reports/transformer_pp_en_de
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from cometnmt.data.corpus import write_text_file
from cometnmt.errors import CometNMTError
from cometnmt.experiments import RunSpec, best_behind_lines, capped_lines, case_note, check_run_args, check_run_configs, command_lines, curve_marker, fmt, fmt_p, how_it_ended, mean_sd, metrics, mixed_recipe_lines, provenance, provenance_lines, run_and_report, run_dir, run_test_split, save_split, test_hyps, validation_bleu_label
from cometnmt.training.run_files import EVAL_SPLITS, strict_json

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="YAML configs; the first is tested against each of the others")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="training seeds (default 1 2 3)")
    p.add_argument("--out", default="reports/compare", help="report folder; runs are kept in OUT/runs/NAME/seedS")
    p.add_argument("--jobs", type=int, default=1, help="training runs side by side (several fit on one GPU)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run, e.g. train.max_epochs=5")
    p.add_argument("--device", default="auto", help="device for training and decoding (auto = GPU if present)")
    p.add_argument("--average-last", dest="average_last", type=int, default=0, metavar="N",
                   help="evaluate the average of each run's last N epoch checkpoints (train.keep_checkpoints and train.max_epochs >= N); "
                        "default 0: the best checkpoint")
    p.add_argument("--beam", type=int, help="beam size for every system (1 = greedy); default: each config's search")
    p.add_argument("--length-penalty", dest="length_penalty", type=float, help="GNMT alpha for every system; default: each config's")
    p.add_argument("--eval-limit", type=int, help="decode only the first N sentences of each split (smoke runs; labelled in the report)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap samples (default 1000)")
    p.add_argument("--metrics", nargs="+", choices=["bleu", "paper"], default=["bleu"],
                   help="metrics of the table and the bootstrap test: bleu = sacreBLEU (default); paper = the COMET "
                        "paper's average sentence BLEU on tokenised text")
    p.add_argument("--report-only", action="store_true", help="do not train; report the finished runs in OUT/runs")
    p.add_argument("--deadline", type=float, help="seconds: start no run or evaluation after this, stop running trainings and evaluations "
                        "(they stay resumable; an evaluation stopped is done again by the next call), report what finished")


# -- running ------------------------------------------------------------------------------------


def _systems(args) -> list[tuple[str, Path]]:
    """(name, config path) of each config, checked with the overrides before anything trains."""
    from cometnmt.config import load_config

    from cometnmt.config import DecodeConfig
    from cometnmt.inference import decode_config

    if len(args.configs) < 2:
        raise CometNMTError("compare needs at least two configs: the candidate first, then what it is compared with")
    check_run_args(args)
    decode_config(DecodeConfig(), beam=args.beam, length_penalty=args.length_penalty)  # bad search options fail now
    if args.average_last < 0:
        raise CometNMTError(f"--average-last must be >= 0, got {args.average_last}")
    configs = [load_config(path, args.set) for path in args.configs]
    _check_average_last(args, configs)
    check_run_configs(zip(args.configs, configs), args.set)
    _check_test_sets(args, configs)
    if "paper" in args.metrics:  # the paper metric needs spaCy's tokenizer: fail now, not after training
        from cometnmt.data.tokenizers import SpacyTokenizer

        for path, cfg in zip(args.configs, configs):
            try:
                SpacyTokenizer(cfg.data.tgt_lang)
            except CometNMTError as exc:
                raise CometNMTError(f"--metrics paper: {path}: {exc}") from None
    systems = [(cfg.name, Path(path)) for cfg, path in zip(configs, args.configs)]
    names = [name for name, _ in systems]
    for name, path in systems:
        # runs are kept in OUT/runs/NAME/seedS: such a name wrote outside the report ('../x', '/tmp/x'),
        # under another system's folder ('a/b') or into OUT/runs or OUT itself ('', '.', '..'). Checked
        # here, not when any config loads: a checkpoint trained under such a name still translates.
        if not name or name.startswith(".") or any(c in name for c in "/\\\0"):
            raise CometNMTError(f"{path}: config key 'name': {name!r} is not a plain folder name (compare keeps runs "
                                f"under OUT/runs/NAME); give a non-empty name without '/', '\\' or a leading '.'")
    for name in names:
        if names.count(name) > 1:
            same = [str(p) for n, p in systems if n == name]
            stem = Path(same[-1]).stem
            how = f": a line such as 'name: {stem}' in {same[-1]}" if stem != name else " (config key 'name')"
            raise CometNMTError(f"configs {', '.join(same)} share the name '{name}' (a config without a 'name' key takes "
                                f"its base: file's); runs are kept by name, in OUT/runs/NAME, so give each its own{how}")
    return systems


def _check_test_sets(args, configs) -> None:
    """The bootstrap test scores every system's test hypotheses against the first system's test
    references: a config of another test set (de-en beside en-de, another split or file) was
    scored against references in another language or of other sentences, silently. Refused
    before any run trains, naming the keys that differ. The dev set is each run's own (validation,
    its stopping rule): another one is allowed, but warned of, as the report's dev BLEU column
    then compares scores of other sentences."""
    def test_set(data) -> dict:
        keys = ("src_lang", "tgt_lang", "test_split") if data.corpus == "multi30k" else ("test_src", "test_tgt")
        return {"corpus": data.corpus, **{key: getattr(data, key) for key in keys}}

    def dev_set(data) -> dict:
        keys = ("src_lang", "tgt_lang") if data.corpus == "multi30k" else ("valid_src", "valid_tgt")
        return {"corpus": data.corpus, "max_valid_pairs": data.max_valid_pairs, **{key: getattr(data, key) for key in keys}}

    def differing(described) -> Iterator[tuple[str, str]]:
        """(a config after the first, the keys of its set that differ from the first's) where any do."""
        first = described(configs[0].data)
        for path, cfg in zip(args.configs[1:], configs[1:]):
            other = described(cfg.data)
            differ = [f"data.{key} {first.get(key)!r} there, {other.get(key)!r} here" for key in {**first, **other}
                      if first.get(key) != other.get(key)]
            if differ:
                yield path, "; ".join(differ)

    for path, differ in differing(test_set):
        raise CometNMTError(f"{path}: its test set is not that of {args.configs[0]} ({differ}); compare tests every "
                            "system against the first on the first one's test references, so all must translate the "
                            "same test set")
    for path, differ in differing(dev_set):
        log.warning("%s: its dev set is not that of %s (%s): the report's dev BLEU compares scores of other sentences",
                    path, args.configs[0], differ)


def _check_average_last(args, configs) -> None:
    """``--average-last N`` averages each run's last N epoch checkpoints: every config, with this
    call's --set overrides, must keep N of them (``train.keep_checkpoints``) and train at least N
    epochs (``train.max_epochs``). Checked before any run trains: a run trained without them has no
    epoch checkpoints to average, and keeping them afterwards does not make them."""
    n = args.average_last
    if not n:
        return
    problems, keys = [], []
    for path, cfg in zip(args.configs, configs):
        short = [(f"train.{key}", value) for key, value in (("keep_checkpoints", cfg.train.keep_checkpoints),
                                                             ("max_epochs", cfg.train.max_epochs)) if value < n]
        if short:
            problems.append(f"{path} has {' and '.join(f'{key}={value}' for key, value in short)}")
            keys += [key for key, _ in short if key not in keys]
    if problems:
        where = " (with this call's --set overrides)" if args.set else ""
        raise CometNMTError(f"--average-last {n} averages each run's last {n} epoch checkpoints, but {'; '.join(problems)}"
                            f"{where}; set {' and '.join(keys)} to at least {n} in each config (or for every run: "
                            f"{' '.join(f'--set {key}={n}' for key in keys)}), or lower --average-last")


def _specs(args, systems: list[tuple[str, Path]]) -> list[RunSpec]:
    """Seed by seed, every system of a seed together, so that paired runs finish together."""
    return [RunSpec(name, path, seed, run_dir(Path(args.out), name, seed)) for seed in args.seeds for name, path in systems]


def _checkpoint(args, run: Path) -> tuple[Path, list[str]]:
    """The checkpoint to evaluate and the files it comes from (averaged into avg.pt if asked)."""
    from cometnmt.training.checkpoint import BEST_CHECKPOINT, average_checkpoints, epoch_checkpoints, save_checkpoint

    if not args.average_last:
        return run / BEST_CHECKPOINT, [BEST_CHECKPOINT]
    found = epoch_checkpoints(run)
    if not found:  # a run trained by an earlier call, or by code without the check of _check_average_last
        raise CometNMTError(f"--average-last {args.average_last}: {run} has no epochNNN.pt checkpoints to average (trained "
                            f"with train.keep_checkpoints={_kept(run)}); they are written only while it trains: move the "
                            f"folder away to train it again with train.keep_checkpoints >= {args.average_last}, or leave out "
                            "--average-last")
    use = found[-args.average_last :]
    if len(use) < args.average_last:
        log.warning("%s: only %d epoch checkpoints to average (asked for %d)", run, len(use), args.average_last)
    save_checkpoint(average_checkpoints(use), run / "avg.pt")
    return run / "avg.pt", [p.name for p in use]


def _kept(run: Path) -> str:
    """The run's train.keep_checkpoints as its config.yaml records it ('?' when unreadable)."""
    import yaml

    from cometnmt.config import yaml_load
    from cometnmt.training.checkpoint import CONFIG_FILE

    try:
        return str(yaml_load((run / CONFIG_FILE).read_text(encoding="utf-8"))["train"]["keep_checkpoints"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return "?"


def _search_label(decode: dict) -> str:
    if decode["method"] == "greedy":
        label = "greedy"
    elif decode["method"] == "sample":
        label = (f"sampling (top-k {decode['sampling_topk']}, top-p {decode['sampling_topp']:g}, "
                 f"temperature {decode['temperature']:g}, seed {decode['sampling_seed']})")
    else:
        label = f"beam {decode['beam_size']}, length penalty {decode['length_penalty']:g}" + (
            " (score / length ** alpha)" if decode.get("length_norm") == "length" else "")  # older reports lack the key
    return label + (", <unk> replaced" if decode.get("replace_unk") else "")  # reports from before it lack the key


def _evaluate_run(args, run: Path) -> dict:
    """Decode the validation and test splits with the run's own search; score them; collect the
    learning curves, training speed and auxiliary losses from its metrics log. A language spaCy
    cannot tokenise is warned of once in this call (:func:`run_compare`)."""
    from cometnmt.config import to_dict
    from cometnmt.data.tokenizers import paper_tokenizer
    from cometnmt.evaluation import score_with
    from cometnmt.inference import Translator, decode_config

    path, used = _checkpoint(args, run)
    translator = Translator.from_checkpoint(path, args.device)
    # the best hypothesis is scored, as evaluate does: a config of decode.nbest 3 with method greedy
    # was decoded by a beam of decode.beam_size, and with --beam 1 refused after every run had trained
    decode = decode_config(translator.cfg.decode, beam=args.beam, nbest=1, length_penalty=args.length_penalty)
    data = translator.cfg.data
    tok = paper_tokenizer(data.tgt_lang)  # None: BLEU and chrF alone (a language spaCy cannot tokenise)
    out = {"checkpoint": used, "decode": to_dict(decode), "arch": translator.cfg.model.arch,
           "parameters": sum(p.numel() for p in translator.model.parameters())}
    for split in EVAL_SPLITS:
        start = time.perf_counter()
        done = translator.translate_split(split, decode, limit=args.eval_limit)
        out[f"{split}_decode_seconds"] = time.perf_counter() - start
        size = save_split(run, split, done)
        out[split] = {**score_with(done.hyps, done.refs, tok, None, lang=data.tgt_lang, src_lang=data.src_lang,
                                   lowercase=data.lowercase, what=f"{run.parent.name} {run.name}, {split}"), **size}
    events = metrics(run)
    train = [e for e in events if e.get("event") == "train"]
    out["history"] = [e for e in events if e.get("event") == "valid"]
    out["epochs"] = out["history"][-1]["epoch"] if out["history"] else 0  # the last validated epoch
    out["train_tokens_per_s"] = statistics.median(e["tgt_tokens_per_s"] for e in train) if train else None
    aux = sorted({k for e in train for k in e if k.startswith("loss_")})
    out["aux_losses"] = {k: [[e["step"], e[k]] for e in train if k in e] for k in aux}
    out.update(how_it_ended(run))  # stopped_by: the rule, or a budget before it
    return out


def run_compare(args) -> int:
    systems = _systems(args)
    names = [name for name, _ in systems]
    from cometnmt.data.tokenizers import warn_once_a_language

    with warn_once_a_language():  # a language spaCy cannot tokenise: warned of once in this call, not once a run
        return run_and_report(args, _specs(args, systems), lambda run: _evaluate_run(args, run),
                              lambda records, missing, seconds: build_report(args, names, records, missing, seconds))


# -- the report ---------------------------------------------------------------------------------


def summarise(names: list[str], records: list[dict]) -> list[dict]:
    table = []
    for name in names:
        recs = sorted((r for r in records if r["row"] == name), key=lambda r: r["seed"])
        entry = {"system": name, "seeds": [r["seed"] for r in recs]}
        if recs:
            entry.update(arch=recs[0]["arch"], parameters=recs[0]["parameters"], search=_search_label(recs[0]["decode"]),
                         checkpoint=recs[0]["checkpoint"], checkpoints={r["seed"]: r["checkpoint"] for r in recs})
        for split in EVAL_SPLITS:
            for metric in ("bleu", "chrf", "paper_bleu"):
                entry[f"{split}_{metric}"] = mean_sd([r[split][metric] for r in recs if metric in r[split]])
        entry["epochs"] = mean_sd([r["epochs"] for r in recs])
        entry["train_tokens_per_s"] = mean_sd([r["train_tokens_per_s"] for r in recs if r["train_tokens_per_s"]])
        table.append(entry)
    return table


def significance(args, out: Path, names: list[str], records: list[dict]) -> list[dict]:
    """Paired bootstrap (test; each of ``args.metrics``) of the first system against each other
    one: per seed both finished, and pooled over those seeds. Both are scored lowercased where
    either was trained with data.lowercase: with the first system's setting alone, a lowercased
    second system was scored cased, far below its own table row, and the first declared better."""
    from cometnmt.data.tokenizers import metric_tokenizer
    from cometnmt.evaluation import paired_bootstrap, paired_bootstrap_runs

    by = {(r["row"], r["seed"]): r for r in records}
    results = []
    for other in names[1:]:
        seeds = [s for s in args.seeds if (names[0], s) in by and (other, s) in by]
        if not seeds:
            continue
        first, second = by[(names[0], seeds[0])], by[(other, seeds[0])]
        _, refs, cfg = run_test_split(run_dir(out, first["row"], first["seed"]), args.eval_limit)
        lowercase = cfg.data.lowercase or "case:lc" in second["test"].get("bleu_signature", "")  # as its table row
        tokenize = metric_tokenizer(cfg.data.tgt_lang).tokenize if "paper" in args.metrics else None  # spaCy only when needed
        runs_a = [test_hyps(out, by[(names[0], s)]) for s in seeds]
        runs_b = [test_hyps(out, by[(other, s)]) for s in seeds]
        for metric in args.metrics:
            kw = {"n_samples": args.bootstrap, "metric": metric, "tokenize": tokenize, "lowercase": lowercase,
                  "lang": cfg.data.tgt_lang}
            for s, a, b in zip(seeds, runs_a, runs_b):
                results.append({"a_system": names[0], "b_system": other, "seeds": [s],
                                **paired_bootstrap(a, b, refs, names=(f"{names[0]} seed {s}", f"{other} seed {s}"), **kw)})
            if len(seeds) > 1:
                results.append({"a_system": names[0], "b_system": other, "seeds": seeds,
                                **paired_bootstrap_runs(runs_a, runs_b, refs, names=tuple(
                                    f"{n} seeds {', '.join(map(str, seeds))}" for n in (names[0], other)), **kw)})
    return results


def aux_summary(records: list[dict]) -> list[dict]:
    """First and last logged value of each auxiliary loss of each run."""
    rows = []
    for rec in sorted(records, key=lambda r: (r["row"], r["seed"])):
        for name, points in rec.get("aux_losses", {}).items():
            if points:
                rows.append({"system": rec["row"], "seed": rec["seed"], "loss": name, "first_step": points[0][0],
                             "first": points[0][1], "last_step": points[-1][0], "last": points[-1][1]})
    return rows


def build_report(args, names: list[str], records: list[dict], missing: list[str], seconds: float) -> dict:
    out = Path(args.out)
    report = {"provenance": provenance(args, seconds, records, missing), "systems": names, "metrics": args.metrics,
              "table": summarise(names, records), "significance": significance(args, out, names, records),
              "aux_losses": aux_summary(records), "runs": records}
    _curves(out, names, records)
    # whole or not at all (write_text_file): a report cut short by a kill or a full disk was kept by
    # the next call that finished nothing
    # strict JSON: a number that is not finite (a run's NaN validation loss, a mean over it) is null,
    # named under "nonfinite"; a bare NaN was refused by render's schema and by strict readers
    write_text_file(out / "report.json", strict_json(report, indent=1, default=str))
    write_text_file(out / "report.md", _markdown(report))
    return report


def _curves(out: Path, names: list[str], records: list[dict]) -> None:
    from cometnmt.plots import pyplot, save_figure, whole_epochs

    plt = pyplot()

    has_aux = any(r.get("aux_losses") for r in records)
    fig, axes = plt.subplots(1, 3 if has_aux else 2, figsize=(16 if has_aux else 11, 4))
    for i, name in enumerate(names):
        for rec in sorted((r for r in records if r["row"] == name), key=lambda r: r["seed"]):
            label = name if rec["seed"] == min(r["seed"] for r in records if r["row"] == name) else None
            hist = rec["history"]
            kw = {"color": f"C{i % 10}", "label": label, **curve_marker(hist)}
            axes[0].plot([h["epoch"] for h in hist], [h["val_loss"] for h in hist], **kw)
            if hist and "val_bleu" in hist[0]:
                axes[1].plot([h["epoch"] for h in hist], [h["val_bleu"] for h in hist], **kw)
            for j, (loss, points) in enumerate(sorted(rec.get("aux_losses", {}).items())):
                axes[2].plot([p[0] for p in points], [p[1] for p in points], color=f"C{i % 10}",
                             linestyle=["-", "--", ":", "-."][j % 4], label=f"{name} {loss}" if label else None)
    axes[0].set(xlabel="epoch", ylabel="validation loss (nats / token)", title="validation loss")
    axes[1].set(xlabel="epoch", ylabel=validation_bleu_label(records), title="validation BLEU")
    axes[1].set_ylim(bottom=0)  # BLEU is never below 0: runs of BLEU 0 throughout drew an axis from -0.05
    whole_epochs(axes[0], axes[1])
    if axes[0].get_legend_handles_labels()[0]:  # a report of no finished run has nothing to label
        axes[0].legend(fontsize=8)
    if has_aux:
        axes[2].set(xlabel="step", ylabel="tag cross-entropy (nats / token)", title="auxiliary task losses")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "learning_curves.png", dpi=120)
    plt.close(fig)


def render(out: Path, report: dict) -> str:
    """The learning curves drawn into ``out`` and report.md's text returned, from ``report`` alone (a
    report.json, as `cometnmt render` reads it): what :func:`build_report` draws and writes."""
    _curves(out, report["systems"], report["runs"])
    return _markdown(report)


def _checkpoint_label(entry: dict) -> str:
    """The checkpoint(s) a system's runs were decoded with, by seed where they differ (runs that
    stopped at other epochs average other epoch checkpoints)."""
    def one(ckpt: list[str]) -> str:
        return ckpt[0] if len(ckpt) == 1 else f"average of {len(ckpt)} ({ckpt[0]} … {ckpt[-1]})"

    by_seed = entry.get("checkpoints") or {None: entry.get("checkpoint", ["–"])}
    labels: dict[str, list[str]] = {}
    for seed, ckpt in by_seed.items():
        labels.setdefault(one(ckpt), []).append(str(seed))
    if len(labels) == 1:
        return next(iter(labels))
    return "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(s)}: {label}" for label, s in labels.items())


def _markdown(report: dict) -> str:
    p = report["provenance"]
    names = report["systems"]
    paper = "paper" in report.get("metrics", [])
    from cometnmt.evaluation import PAPER_BLEU_LABEL

    lines = [f"# {names[0]} compared with {', '.join(names[1:])}", ""] + provenance_lines(p)
    lines += ["", f"BLEU and chrF: sacreBLEU, {case_note(report['runs'], lambda r: r['row'])}, on detokenised text "
              "(signatures in report.json)"
              + (f"; paper = {PAPER_BLEU_LABEL}" if paper else "") + ". Each run is "
              "decoded with its config's search on the checkpoint shown. Mean ± sample sd (n − 1) over seeds; one seed has no ±.", "",
              "| system | architecture | parameters | seeds | epochs | checkpoint | search | dev BLEU | test BLEU | test chrF | "
              + ("dev, paper metric | test, paper metric | " if paper else "") + "train tokens/s |",
              "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if paper else "") + "---|"]
    for e in report["table"]:
        ckpt = _checkpoint_label(e)
        params = "–" if "parameters" not in e else (  # a tiny model's 41,558 read "0.0M"
            f"{e['parameters'] / 1e6:.1f}M" if e["parameters"] >= 1e5 else f"{e['parameters']:,}")
        tps = e["train_tokens_per_s"]
        lines.append(f"| {e['system']} | {e.get('arch', '–')} | {params} | {len(e['seeds'])} | {fmt(e['epochs'])} | {ckpt} | "
                     f"{e.get('search', '–')} | {fmt(e['valid_bleu'])} | {fmt(e['test_bleu'])} | {fmt(e['test_chrf'])} | "
                     + (f"{fmt(e['valid_paper_bleu'])} | {fmt(e['test_paper_bleu'])} | " if paper else "")
                     + f"{'–' if tps[0] is None else f'{tps[0]:,.0f}'} |")
    lines += capped_lines(report["runs"], lambda r: r["row"])
    lines += best_behind_lines(report["runs"], lambda r: r["row"])
    lines += mixed_recipe_lines(report["runs"], lambda r: r["row"])
    lines += ["", "Training tokens/s is the median over the run's log windows (target tokens). Runs trained side by "
              "side (`--jobs` > 1) share the machine: compare speeds with `bench/`, not this column.", "",
              "## Every run", "", "| system | seed | epochs | dev BLEU | test BLEU | test chrF |"
              + (" dev, paper metric | test, paper metric |" if paper else ""), "|---|---|---|---|---|---|" + ("---|---|" if paper else "")]
    for r in sorted(report["runs"], key=lambda r: (r["seed"], names.index(r["row"]) if r["row"] in names else 0)):
        lines.append(f"| {r['row']} | {r['seed']} | {r['epochs']} | {r['valid']['bleu']:.2f} | {r['test']['bleu']:.2f} | {r['test']['chrf']:.2f} |"
                     + ("".join(f" {r[split]['paper_bleu']:.2f} |" if "paper_bleu" in r[split] else " – |"
                                for split in EVAL_SPLITS) if paper else ""))
    if report["significance"]:
        lines += ["", "## Paired bootstrap (test; bleu = sacreBLEU BLEU, paper = the COMET paper's metric)", "",
                  "p = fraction of bootstrap samples in which the second system scores at least as high as the first "
                  "(one-sided test of 'the first is better'). Pooled rows resample the sentences once for all seeds and "
                  "score each system's seeds concatenated.", "",
                  "| seeds | metric | A | B | score A | score B | Δ (A − B) | 95% CI A | 95% CI B | p |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in report["significance"]:
            seeds = ", ".join(map(str, s["seeds"])) + (" (pooled)" if len(s["seeds"]) > 1 else "")
            lines.append(f"| {seeds} | {s['metric']} | {s['a_system']} | {s['b_system']} | {s['a']:.2f} | {s['b']:.2f} | {s['delta']:+.2f} | "
                         f"{s['a_ci95'][0]:.2f}–{s['a_ci95'][1]:.2f} | {s['b_ci95'][0]:.2f}–{s['b_ci95'][1]:.2f} | {fmt_p(s)} |")
    if report["aux_losses"]:
        lines += ["", "## Auxiliary task losses (first and last logged value)", "",
                  "| system | seed | loss | first (step) | last (step) |", "|---|---|---|---|---|"]
        for a in report["aux_losses"]:
            lines.append(f"| {a['system']} | {a['seed']} | {a['loss']} | {a['first']:.3f} ({a['first_step']}) | {a['last']:.3f} ({a['last_step']}) |")
    lines += ["", "## Learning curves", "", "![learning curves](learning_curves.png)", "",
              "## How each system was trained (first seed; the others differ only in train.seed)", ""]
    for name in names:
        recs = sorted((r for r in report["runs"] if r["row"] == name), key=lambda r: r["seed"])
        if recs:
            lines += command_lines(name, recs)
    return "\n".join(lines) + "\n"
