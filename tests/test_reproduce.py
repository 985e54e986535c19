"""`cometnmt reproduce` end to end on a tiny setting: the report folder with the table beside the
paper's numbers, the bootstrap test, the Figure 4 PNG, learning curves and examples; a second call
skips the finished runs."""

from __future__ import annotations

import json

import pytest

TINY = ["--set", "data.max_train_pairs=300", "--set", "data.max_valid_pairs=20", "--set", "train.max_epochs=1",
        "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.d_ff=64", "--set", "model.enc_layers=1",
        "--set", "model.dec_layers=1", "--set", "train.num_threads=1", "--eval-limit", "30", "--bootstrap", "50"]


def test_reproduce_writes_the_report_and_skips_finished_runs(cli, tmp_path):
    out = tmp_path / "report"
    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--jobs", "2", "--out", str(out), *TINY)
    for name in ("report.md", "report.json", "figure4_bleu_by_length.png", "learning_curves.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    rows = {e["row"]: e for e in report["table"]}
    assert rows["comet"]["paper_test"] == 38.69 and rows["transformer"]["paper_dev"] == 38.33
    assert rows["comet"]["test_bleu"][0] is not None and rows["comet"]["seeds"] == [1]
    assert {s["metric"] for s in report["significance"]} == {"paper", "bleu"}
    assert 0 < len(report["examples"]) <= 10 and {"source", "reference", "comet", "transformer"} <= set(report["examples"][0])
    assert all(e["comet_bleu"] != e["transformer_bleu"] for e in report["examples"])  # only sentences that differ
    text = (out / "report.md").read_text()
    assert "| COMET | 1 |" in text and "first 30 sentences" in text and report["provenance"]["hardware"]
    # data.max_valid_pairs=20 left 20 dev sentences, all decoded under --eval-limit 30: only the test split was cut
    assert report["provenance"]["eval_limit_cut"] == ["test"] and "the first 30 sentences of the test split" in text
    assert {r["test"]["split_sentences"] for r in report["runs"]} == {1000}
    # the tiny budget (train.max_epochs) ended both runs before the presets' rule (loss_rise): said
    assert {(r["row"], r["stopped_by"], r["stopping"]) for r in report["runs"]} == \
        {("comet", "max_epochs", "loss_rise"), ("transformer", "max_epochs", "loss_rise")}
    assert "ended by their budget before their stopping rule fired" in text and "COMET seed 1 (" in text
    # each run's hypotheses are kept beside the report (OUT/runs is too big to commit), byte for byte
    for row in ("comet", "transformer"):
        for split in ("valid", "test"):
            kept = out / "hypotheses" / row / "seed1" / f"{split}.hyp"
            assert kept.read_bytes() == (out / "runs" / row / "seed1" / f"{split}.hyp").read_bytes() != b""

    done = out / "runs" / "comet" / "seed1" / "done.json"
    stamp = done.stat().st_mtime_ns
    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), *TINY)
    assert done.stat().st_mtime_ns == stamp  # finished runs are not trained again

    # --merge-report: runs whose folders are gone come from an earlier report.json, with their
    # bootstrap rows and examples (their hypotheses are gone too); runs still in OUT/runs win
    import shutil

    prev = tmp_path / "prev.json"
    shutil.copy(out / "report.json", prev)
    shutil.rmtree(out / "runs" / "transformer")
    cli("reproduce", "--report-only", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out),
        "--merge-report", str(prev), *TINY)
    merged = json.loads((out / "report.json").read_text())
    assert merged["provenance"]["merged_runs"] == 1 and merged["provenance"]["missing_runs"] == []
    assert [e["test_paper_bleu"] for e in merged["table"]] == [e["test_paper_bleu"] for e in report["table"]]
    assert merged["significance"] == report["significance"] and merged["examples"] == report["examples"]
    assert [r.get("merged_from_report", False) for r in merged["runs"]] == [False, True]
    assert (out / "hypotheses" / "transformer" / "seed1" / "test.hyp").stat().st_size > 0  # kept for the merged run
    assert "taken from the earlier report" in (out / "report.md").read_text()
    # without it, the run is missing; a file that is not a report is named in the error
    cli("reproduce", "--report-only", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), *TINY)
    assert json.loads((out / "report.json").read_text())["provenance"]["missing_runs"] == ["transformer seed 1"]
    (tmp_path / "bad.json").write_text('{"runs": [{"row": "comet"}]}')
    bad = cli("reproduce", "--report-only", "--rows", "comet", "--seeds", "1", "--out", str(out),
              "--merge-report", str(tmp_path / "bad.json"), check=False)
    assert bad.returncode != 0 and "bad.json is not a cometnmt reproduce report.json" in bad.stderr

    # --candidate: another row against the Transformer, per seed and pooled over the seeds. The runs
    # are copies of the ones above (same hypotheses), so the pooled paper's metric (a mean over the
    # seeds) must agree with seed 1's. (Pooled BLEU need not: its smoothing of zero n-gram counts
    # depends on the totals, and a tiny model has such zeros.)
    def copy_run(row, seed, new_row, new_seed):
        dst = out / "runs" / new_row / f"seed{new_seed}"
        shutil.copytree(out / "runs" / row / f"seed{seed}", dst)
        done = json.loads((dst / "done.json").read_text())
        (dst / "done.json").write_text(json.dumps({**done, "row": new_row, "seed": new_seed}))

    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), *TINY)  # transformer again
    for row, seed, new_row, new_seed in [("comet", 1, "comet_bn_length", 1), ("comet", 1, "comet_bn_length", 2),
                                         ("transformer", 1, "transformer", 2)]:
        copy_run(row, seed, new_row, new_seed)
    cli("reproduce", "--report-only", "--rows", "comet_bn_length", "transformer", "--seeds", "1", "2", "--out", str(out),
        "--candidate", "comet_bn_length", *TINY)
    cand = json.loads((out / "report.json").read_text())
    assert cand["candidate"] == "comet_bn_length"
    assert [s["seed"] for s in cand["significance"]] == [1, 1, 2, 2, "pooled", "pooled"]
    by = {(s["seed"], s["metric"]): s for s in cand["significance"]}
    for metric in ("paper", "bleu"):
        assert by[("pooled", metric)]["seeds"] == [1, 2] and by[("pooled", metric)]["runs"] == [2, 2]
        assert {**by[(1, metric)], "seed": 2} == by[(2, metric)]  # seed 2 is a copy of seed 1
    pooled, one = by[("pooled", "paper")], by[(1, "paper")]
    assert (pooled["a"], pooled["b"], pooled["p_value"]) == pytest.approx((one["a"], one["b"], one["p_value"]))
    text = (out / "report.md").read_text()
    assert "## Paired bootstrap: COMET, batch norm by length vs Transformer" in text and "| 1, 2 (pooled) | paper |" in text
    assert cand["examples"] and cand["figure4"]
    # OUT/hypotheses holds the runs this report covers: COMET's copy went with its row (its run folder stays)
    assert sorted(p.name for p in (out / "hypotheses").iterdir()) == ["comet_bn_length", "transformer"]
    assert (out / "runs" / "comet" / "seed1" / "test.hyp").exists()
    # a candidate that is not among the rows, or the Transformer itself, is an error naming the option
    for bad_cand in ("rnn", "transformer"):
        bad = cli("reproduce", "--report-only", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out),
                  "--candidate", bad_cand, check=False)
        assert bad.returncode != 0 and f"--candidate {bad_cand}: must be one of --rows" in bad.stderr


def _example_runs(monkeypatch, c_s, t_s):
    """Two runs of seed 2 whose sentence BLEU are c_s (COMET) and t_s (Transformer), without training."""
    import argparse
    from pathlib import Path

    from cometnmt import reproduce

    n = len(c_s)
    monkeypatch.setattr(reproduce, "test_hyps", lambda out, rec: [f"{rec['row']} hyp {i}" for i in range(n)])
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: ([f"src {i}" for i in range(n)],
                                                                          [f"ref {i}" for i in range(n)], None))
    records = [{"row": "comet", "seed": 2, "test": {"sentence_bleu": c_s}},
               {"row": "transformer", "seed": 2, "test": {"sentence_bleu": t_s}}]
    return reproduce, argparse.Namespace(examples=2, eval_limit=None), Path("."), records


def test_the_examples_say_which_seed_they_come_from(monkeypatch):
    reproduce, args, out, records = _example_runs(monkeypatch, [50.0, 10.0, 30.0, 0.0], [10.0, 50.0, 30.0, 20.0])
    examples = reproduce._examples(args, out, records, {}, "comet")
    assert {e["seed"] for e in examples} == {2}
    assert all(e["source"] == f"src {e['index']}" and e["comet"] == f"comet hyp {e['index']}" for e in examples)
    report = {"provenance": {"commit": "x", "run_commits": [], "command": "c", "hardware": "h", "torch": "t", "date": "d",
                             "wall_seconds": 0.0, "train_hours": 0.0, "overrides": [], "missing_runs": [], "eval_limit": None},
              "table": [], "runs": [], "examples": examples}
    assert "Seed 2's runs; sentence BLEU is the paper's metric" in reproduce._markdown(args, report)


def test_the_examples_name_their_test_line_as_an_editor_counts(monkeypatch):
    """Each example was headed '**#23**', its 0-based index, with a note that '#N is line N + 1 of
    the test set': a reader looking the sentence up in test_2016_flickr.de (an editor, sed -n 24p)
    found the one before it unless they read the note. The heading is the 1-based line now."""
    reproduce, args, out, records = _example_runs(monkeypatch, [50.0, 10.0, 30.0, 0.0], [10.0, 50.0, 30.0, 20.0])
    examples = reproduce._examples(args, out, records, {}, "comet")
    report = {"provenance": {"commit": "x", "run_commits": [], "command": "c", "hardware": "h", "torch": "t", "date": "d",
                             "wall_seconds": 0.0, "train_hours": 0.0, "overrides": [], "missing_runs": [], "eval_limit": None},
              "table": [], "runs": [], "examples": examples}
    text = reproduce._markdown(args, report)
    for ex in examples:
        assert f"**Test line {ex['index'] + 1}** (sentence BLEU: COMET" in text and f"- Source: src {ex['index']}" in text
    assert "**#" not in text and "line N + 1" not in text


def test_the_table_lists_seeds_in_order_whatever_order_the_runs_came_in():
    """Runs merged from an earlier report (--merge-report) came after the new ones, and the table
    listed seeds as [3, 1, 2]."""
    from cometnmt import reproduce

    def run(seed, bleu):
        split = {"paper_bleu": bleu, "bleu": bleu, "chrf": bleu}
        return {"row": "comet", "seed": seed, "valid": split, "test": split, "epochs": 10}

    [entry] = reproduce.summarise(["comet"], [run(3, 30.0), run(1, 31.0), run(2, 32.0)])
    assert entry["seeds"] == [1, 2, 3]


def test_the_examples_are_sentences_where_the_models_differ(monkeypatch):
    """With fewer differing sentences than 2 x --examples (a short --eval-limit, or models that
    mostly agree), the two lists overlapped: a sentence COMET wins showed up again among those it
    loses, and ties were shown as differences."""
    reproduce, args, out, records = _example_runs(monkeypatch, [50.0, 30.0, 30.0, 0.0], [10.0, 30.0, 30.0, 30.0])
    examples = reproduce._examples(args, out, records, {}, "comet")
    assert [(e["index"], e["comet_bleu"] - e["transformer_bleu"]) for e in examples] == [(0, 40.0), (3, -30.0)]


def test_report_labels_say_what_was_decoded_and_plotted(tmp_path):
    """The table's checkpoint label follows the runs' stopping rule (best.pt is best on BLEU under
    bleu_patience); the curves' BLEU axis says on how many validation sentences; and a report of
    no finished run plots without matplotlib's "No artists with labels" warning."""
    import warnings

    from cometnmt.experiments import validation_bleu_label
    from cometnmt.reproduce import _checkpoint_label, _learning_curves

    assert _checkpoint_label([{"stopping": "loss_rise"}, {}]) == "best-validation-loss checkpoint"
    assert _checkpoint_label([{"stopping": "bleu_patience"}]) == "best-validation-BLEU checkpoint"
    assert "validation BLEU for runs with train.stopping=bleu_patience" in _checkpoint_label([{"stopping": "bleu_patience"}, {}])
    history = [{"epoch": 1, "val_loss": 3.0, "val_bleu": 20.0, "val_bleu_sentences": 500}]
    assert validation_bleu_label([{"history": history}]) == "validation BLEU (sacreBLEU, greedy, 500 sentences)"
    assert validation_bleu_label([{"history": [{"val_bleu": 1.0}]}]) == "validation BLEU (sacreBLEU, greedy)"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _learning_curves(tmp_path, ["comet"], [])
    assert (tmp_path / "learning_curves.png").exists()


def test_gpu_sweep_arms_train_the_recipes_their_folders_name():
    """scripts/gpu_sweep.sh is the three-way recipe check the README and transformer.yaml cite (the
    paper's constant 1e-4 against the chosen inverse-sqrt recipe). Its arms run the presets plus
    their --set overrides, so an arm that leaves lr, schedule or batch size to the presets trains
    whatever they carry now: once they took the inverse-sqrt recipe, the two 'lr1e-4' arms no longer
    trained at a constant 1e-4. Each arm's folder name must describe what it trains."""
    import re
    import shlex
    from pathlib import Path

    from cometnmt.config import load_config

    root = Path(__file__).resolve().parents[1]
    text = (root / "scripts" / "gpu_sweep.sh").read_text().replace("\\\n", " ")
    common = shlex.split(re.search(r"^common=\((.*)\)$", text, re.M).group(1))
    arms = [shlex.split(line.split(">")[0]) for line in text.splitlines() if "cometnmt reproduce" in line]
    assert len(arms) == 3
    for words in arms:
        words = [w for part in words for w in (common if part == "${common[@]}" else [part])]
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        name = Path(words[words.index("--out") + 1]).name
        lr, tokens = re.search(r"(?:lr|invsqrt)([0-9.e-]+)_tok(\d+)$", name).groups()
        for preset in ("comet.yaml", "transformer.yaml"):
            train = load_config(root / "configs" / "multi30k" / preset, sets).train
            assert (train.lr, train.batch_tokens) == (float(lr), int(tokens)), (name, preset)
            assert train.schedule == ("inverse_sqrt" if "invsqrt" in name else "constant"), (name, preset)


def test_only_runs_a_budget_ended_before_their_rule_are_flagged():
    """A run whose stopping rule fired, or that has none (train.stopping: none), ends by design; one
    that train.max_epochs or max_steps cut before its rule fired is listed (best.pt is not the rule's)."""
    from cometnmt.experiments import capped_lines

    runs = [{"row": "comet", "seed": 1, "epochs": 12, "stopped_by": "rule", "stopping": "loss_rise"},
            {"row": "comet", "seed": 2, "epochs": 30, "stopped_by": "max_epochs", "stopping": "loss_rise"},
            {"row": "transformer", "seed": 1, "epochs": 30, "stopped_by": "max_epochs", "stopping": "none"},
            {"row": "transformer", "seed": 2, "epochs": 3, "stopped_by": "max_steps", "stopping": "bleu_patience"},
            {"row": "transformer", "seed": 3, "epochs": 9}]  # from a report older than the field
    (line,) = [x for x in capped_lines(runs, lambda r: r["row"].upper()) if x]
    assert line.endswith(": COMET seed 2 (30 epochs, train.max_epochs), TRANSFORMER seed 2 (3 epochs, train.max_steps)")
    assert capped_lines(runs[:1] + runs[2:3] + runs[4:], lambda r: r["row"]) == []


def test_an_empty_figure_4_is_said(monkeypatch):
    """With no source length of 3 or more test sentences (a short --eval-limit), the Figure 4
    section was left out of report.md without a word, beside an empty figure4_bleu_by_length.png,
    and "## Learning curves" followed the bootstrap table on the next line."""
    import argparse

    from cometnmt import reproduce
    from cometnmt.experiments import provenance

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    args = argparse.Namespace(device="cpu", set=[], eval_limit=2, out=".")

    test = {"metric": "bleu", "a": 1.0, "b": 2.0, "delta": -1.0, "p_value": 0.5, "n_samples": 20}
    report = {"provenance": provenance(args, 1.0, [], []), "table": [], "runs": [], "significance": [{"seed": 1, **test}],
              "figure4": []}
    text = reproduce._markdown(args, report)
    assert "## Figure 4: BLEU difference by source length\n\nNone to plot: no source length has 3 or more" in text
    assert "| -1.00 | 0.500 |\n\n## Figure 4" in text
    report.update(figure4=[{"length": 7, "diff": 1.0, "pairs": 1}], figure4_left_out=[])
    assert "## Figure 4: BLEU difference by source length\n\n![figure 4](figure4_bleu_by_length.png)\n\n## Learning curves" \
        in reproduce._markdown(args, report)
    del report["figure4"], report["significance"]  # no Transformer among the rows
    assert "Figure 4" not in reproduce._markdown(args, report)


def test_the_main_jobs_report_folder_is_ignored_by_git_and_no_committed_report_is():
    """The README's first command (scripts/main.sh) writes its report to reports/main/, which
    `git status` then listed as untracked in the user's checkout. .gitignore now names it; no
    committed file under reports/ is hidden by it."""
    import shutil
    import subprocess

    from conftest import REPO

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert "--out reports/main" in (REPO / "scripts" / "main.sh").read_text(encoding="utf-8")

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)

    assert git("check-ignore", "-q", "reports/main/report.md").returncode == 0
    assert git("check-ignore", "-q", "reports/main/runs/comet/seed1/last.pt").returncode == 0
    assert git("check-ignore", "-q", "reports/multi30k_table1/report.md").returncode == 1
    assert git("ls-files", "--cached", "--ignored", "--exclude-standard", "reports").stdout == ""


def test_a_config_of_several_hypotheses_is_still_decoded_greedily(monkeypatch, tmp_path):
    """reproduce greedy-decodes each run's best.pt (the paper's search) by setting decode.method to
    greedy, but kept the config's decode.nbest: Translator.translate reads greedy search of nbest
    above 1 as a beam search (documented), so a run trained with decode.nbest 3 was decoded by a
    beam of decode.beam_size, and its report said greedy (a beam_size below 3 refused it instead).
    One hypothesis is decoded now, as compare and evaluate do."""
    import argparse
    import types

    from cometnmt import reproduce
    from cometnmt.config import DecodeConfig
    from cometnmt.inference import Translator, decode_config

    class Decoded(Exception):
        pass

    def translate_split(split, decode, limit=None):  # as Translator.translate reads the search
        raise Decoded(decode_config(decode))

    translator = types.SimpleNamespace(cfg=types.SimpleNamespace(decode=DecodeConfig(method="beam", beam_size=4, nbest=3)),
                                       translate_split=translate_split)
    translator.cfg.data = types.SimpleNamespace(tgt_lang="en", src_lang="de", lowercase=False)
    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(lambda path, device: translator))
    with pytest.raises(Decoded) as caught:
        reproduce._evaluate_run(argparse.Namespace(device="cpu", eval_limit=None), tmp_path)
    decode = caught.value.args[0]
    assert (decode.method, decode.nbest) == ("greedy", 1)


def _fake_run_into(monkeypatch, tgt_lang: str, hyps: list[str], refs: list[str]):
    """Translator.from_checkpoint gives a stand-in for a run into ``tgt_lang`` (from English) whose
    splits decode to ``hyps`` against ``refs``: reproduce's scoring without a trained model. Returns
    the stand-in."""
    import types

    from cometnmt.config import DecodeConfig
    from cometnmt.inference import Translator

    data = types.SimpleNamespace(tgt_lang=tgt_lang, src_lang="en", lowercase=False)
    translator = types.SimpleNamespace(cfg=types.SimpleNamespace(decode=DecodeConfig(), data=data,
                                                                 train=types.SimpleNamespace(stopping="loss_rise")),
                                       translate_split=lambda split, decode, limit=None: types.SimpleNamespace(
                                           hyps=hyps, refs=refs, src=["They play in the park.", "A dog runs."]))
    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(lambda path, device: translator))
    return translator


def test_a_chinese_target_is_scored_with_sacrebleus_zh_tokeniser(monkeypatch, tmp_path):
    """Validation BLEU, evaluate and compare take sacreBLEU's tokeniser for data.tgt_lang (zh for
    Chinese); reproduce scored its runs' test and validation hypotheses and its bootstrap with 13a,
    which reads unspaced Chinese as one word: '他们在公园里玩。' against '他们在公园玩。' scored 0."""
    import argparse

    from cometnmt import reproduce

    hyps, refs = ["他们在公园里玩。", "一只狗在跑。"], ["他们在公园玩。", "一只狗在跑。"]
    translator = _fake_run_into(monkeypatch, "zh", hyps, refs)
    out = reproduce._evaluate_run(argparse.Namespace(device="cpu", eval_limit=None), tmp_path)
    for split in ("valid", "test"):
        assert "tok:zh" in out[split]["bleu_signature"] and out[split]["bleu"] > 50

    records = [{"row": "comet", "seed": 1}, {"row": "transformer", "seed": 1}]
    monkeypatch.setattr(reproduce, "test_hyps", lambda out, rec: hyps if rec["row"] == "comet" else refs)
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: (None, refs, translator.cfg))
    rows = reproduce._significance(argparse.Namespace(bootstrap=10, eval_limit=None), tmp_path, records, {}, "comet")
    bleu = [r for r in rows if r["metric"] == "bleu"]
    assert bleu and all("tok:zh" in r["label"] for r in bleu)


def _without_japanese_tokenisers(monkeypatch):
    """spaCy and sacreBLEU as where SudachiPy and mecab-python3 are not installed."""
    import importlib.util

    from cometnmt import evaluation
    from cometnmt.data import tokenizers

    if importlib.util.find_spec("sudachipy"):  # as where SudachiPy is not installed
        def no_japanese(lang, lowercase=False):
            raise tokenizers.UnknownLanguageError(f"spaCy has no tokenizer for language {lang!r} (Japanese support "
                                                  "requires SudachiPy and SudachiDict-core)")
        monkeypatch.setattr(tokenizers, "metric_tokenizer", no_japanese)
    if importlib.util.find_spec("MeCab"):  # as where mecab-python3 is not installed
        real = evaluation.BLEU

        def no_mecab(*, lowercase=False, trg_lang=""):
            if trg_lang == "ja":
                raise RuntimeError("Japanese tokenization requires extra dependencies, but you do not have them "
                                   "installed. Please install them like so. pip install sacrebleu[ja]")
            return real(lowercase=lowercase)
        monkeypatch.setattr(evaluation, "BLEU", no_mecab)
    monkeypatch.setattr(evaluation, "_BLEU_FALLBACK_WARNED", set())


def test_a_target_spacy_cannot_tokenise_gets_a_report_of_bleu_and_chrf(monkeypatch, tmp_path, caplog):
    """reproduce took spaCy's tokeniser of data.tgt_lang for the paper's metric and raised where
    spaCy lacks it (Japanese without SudachiPy, Korean without mecab-ko), after every run had
    trained; compare scores such a language with BLEU and chrF alone. Now reproduce does too: its
    report says what was not computed and which BLEU tokeniser was used, warnings name the packages."""
    import argparse

    from cometnmt import reproduce

    _without_japanese_tokenisers(monkeypatch)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    monkeypatch.setattr(reproduce, "_learning_curves", lambda *a: None)

    hyps, refs = ["彼らは公園で遊んでいる。", "犬が走る。"], ["彼らは公園で遊ぶ。", "犬が走る。"]
    translator = _fake_run_into(monkeypatch, "ja", hyps, refs)
    args = argparse.Namespace(out=str(tmp_path), set=[], device="cpu", eval_limit=None, candidate=None,
                              merge_report=None, bootstrap=10, examples=1, seeds=[1])
    with caplog.at_level("WARNING"):
        run = reproduce._evaluate_run(args, tmp_path)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "SudachiPy" in warned and "sacrebleu[ja]" in warned
    for split in ("valid", "test"):
        assert "paper_bleu" not in run[split] and "spaCy cannot tokenise 'ja'" in run[split]["not_computed"]
        assert "tok:13a" in run[split]["bleu_signature"] and run[split]["chrf"] > 50

    records = [{"row": row, "seed": 1, "command": f"cometnmt train {row}.yaml", **run} for row in ("comet", "transformer")]
    monkeypatch.setattr(reproduce, "test_hyps", lambda out, rec: hyps if rec["row"] == "comet" else refs)
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: (None, refs, translator.cfg))
    report = reproduce.build_report(args, ["comet", "transformer"], records, [], 1.0)
    assert [s["metric"] for s in report["significance"]] == ["bleu"] and "figure4" not in report
    assert report["table"][0]["test_paper_bleu"] == (None, None) and report["table"][0]["test_chrf"][0] > 50
    text = (tmp_path / "report.md").read_text()
    assert ("- **not computed** for COMET seed 1, Transformer seed 1: the COMET paper's metric and BLEU by length: "
            "spaCy cannot tokenise 'ja'") in text and "tokenised by sacreBLEU's `tok:13a`" in text


def test_a_call_warns_once_that_spacy_cannot_tokenise_its_target(monkeypatch, tmp_path, caplog):
    """reproduce warned that spaCy cannot tokenise the target language once for every run it scored
    and again for the bootstrap test: five times for two rows of two seeds. One call now says it
    once; compare, which scores its runs alike, too."""
    import argparse
    import types

    from cometnmt import compare, reproduce

    _without_japanese_tokenisers(monkeypatch)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    monkeypatch.setattr(reproduce, "_learning_curves", lambda *a: None)
    hyps, refs = ["彼らは公園で遊んでいる。", "犬が走る。"], ["彼らは公園で遊ぶ。", "犬が走る。"]
    translator = _fake_run_into(monkeypatch, "ja", hyps, refs)
    translator.cfg.model = types.SimpleNamespace(arch="comet")
    translator.model = types.SimpleNamespace(parameters=lambda: [])
    monkeypatch.setattr(reproduce, "test_hyps", lambda out, rec: hyps if rec["row"] == "comet" else refs)
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: (None, refs, translator.cfg))

    def one_call(args, specs, evaluate, report):  # experiments.run_and_report with every run trained
        records = []
        for spec in specs:
            spec.run_dir.mkdir(parents=True)
            records.append({"row": spec.name, "seed": spec.seed, "command": f"cometnmt train {spec.name}", **evaluate(spec.run_dir)})
        report(records, [], 1.0)
        return 0

    monkeypatch.setattr(reproduce, "run_and_report", one_call)
    args = argparse.Namespace(out=str(tmp_path / "reproduce"), set=[], device="cpu", eval_limit=None, candidate=None,
                              merge_report=None, bootstrap=10, examples=1, seeds=[1, 2], rows=["comet", "transformer"],
                              jobs=1, deadline=None, report_only=False, config_dir=str(reproduce.REPO_CONFIGS))
    with caplog.at_level("WARNING"):
        reproduce.run_reproduce(args)
    said = [r.getMessage() for r in caplog.records if "without the COMET paper's metric" in r.getMessage()]
    assert len(said) == 1, said
    assert (tmp_path / "reproduce" / "report.md").is_file()

    caplog.clear()
    monkeypatch.setattr(compare, "_checkpoint", lambda args, run: (run / "best.pt", ["best.pt"]))
    monkeypatch.setattr(compare, "run_and_report", lambda args, specs, evaluate, report: [evaluate(s.run_dir) for s in specs])
    runs = [tmp_path / "compare" / name / f"seed{seed}" for name in ("comet", "transformer") for seed in (1, 2)]
    for run in runs:
        run.mkdir(parents=True)
    monkeypatch.setattr(compare, "_specs", lambda args, systems: [types.SimpleNamespace(run_dir=run) for run in runs])
    monkeypatch.setattr(compare, "_systems", lambda args: [("comet", None), ("transformer", None)])
    with caplog.at_level("WARNING"):
        compare.run_compare(argparse.Namespace(beam=None, length_penalty=None, eval_limit=None, device="cpu"))
    said = [r.getMessage() for r in caplog.records if "without the COMET paper's metric" in r.getMessage()]
    assert len(said) == 1, said


def test_paper_tokenizer_warns_once_a_language_inside_a_call_its_threads_included(monkeypatch, caplog):
    """The languages reproduce and compare had warned of were a set handed down through six
    functions (``warned=``); a call now opens warn_once_a_language(), which its scoring threads
    (--jobs) share: one warning a language inside it, every time outside it, and a later call
    warns again."""
    from concurrent.futures import ThreadPoolExecutor

    from cometnmt.data import tokenizers

    def no_spacy(lang, lowercase=False):
        raise tokenizers.UnknownLanguageError(f"spaCy has no tokenizer for language {lang!r}")

    monkeypatch.setattr(tokenizers, "metric_tokenizer", no_spacy)

    def said() -> list[str]:
        found = [r.getMessage().split("'")[1] for r in caplog.records if "without the COMET paper's metric" in r.getMessage()]
        caplog.clear()
        return sorted(found)

    with caplog.at_level("WARNING"):
        for _ in range(2):  # two calls: each warns once a language
            with tokenizers.warn_once_a_language():
                with ThreadPoolExecutor(max_workers=4) as pool:
                    assert list(pool.map(tokenizers.paper_tokenizer, ["ja", "ko", "ja", "ko", "ja"])) == [None] * 5
                with tokenizers.warn_once_a_language():  # nested: the outer call's languages
                    tokenizers.paper_tokenizer("ja")
                    tokenizers.paper_tokenizer("xx")
                tokenizers.paper_tokenizer("xx")
            assert said() == ["ja", "ko", "xx"]
        tokenizers.paper_tokenizer("ja")  # outside a call: every time
        tokenizers.paper_tokenizer("ja")
        assert said() == ["ja", "ja"]


def test_the_score_log_lines_name_the_run_and_split(monkeypatch, tmp_path, caplog):
    """reproduce and compare score each run's validation and test translations in turn, and each
    logged 'BLEU 0.06, chrF 8.82, paper BLEU 0.74 on 40 sentences' alone: with two rows of two seeds,
    eight such lines, and nothing saying which run or split each was. They open with both now."""
    import argparse
    import types

    import torch

    from cometnmt import compare, reproduce

    translator = _fake_run_into(monkeypatch, "en", ["A dog runs.", "They play."], ["A dog runs.", "They play in the park."])
    translator.cfg.model = types.SimpleNamespace(arch="comet")
    translator.model = torch.nn.Linear(1, 1)
    monkeypatch.setattr(compare, "_checkpoint", lambda args, run: (run / "best.pt", ["best.pt"]))
    args = argparse.Namespace(device="cpu", eval_limit=None, beam=None, length_penalty=None)
    for evaluate, run in ((reproduce._evaluate_run, tmp_path / "runs" / "comet" / "seed2"),
                          (compare._evaluate_run, tmp_path / "cmp" / "runs" / "mine" / "seed1")):
        run.mkdir(parents=True)
        caplog.clear()
        with caplog.at_level("INFO", logger="cometnmt.evaluation"):
            evaluate(args, run)
        scored = [r.getMessage() for r in caplog.records if "BLEU" in r.getMessage()]
        assert [line.split(": BLEU")[0] for line in scored] == [f"{run.parent.name} {run.name}, {split}"
                                                                for split in ("valid", "test")], scored


def test_a_row_written_as_the_paper_writes_it_gets_its_name(capsys, tmp_path):
    """--rows COMET, 'FFN-1' or 'dropout = 0.3' (Table 1's labels, as a reader of the paper types
    them) were refused with the list of fifteen names alone, the reader left to match them up. Each
    unknown row now names the row it most likely means (two where it is near both), none where none is near."""
    from cometnmt import cli

    rows = ["COMET", "Transformer", "FFN-1", "dropout = 0.3", "d_ff = 1024", "Temporal Convolutions", "ffn", "transfomer", "xyz"]
    assert cli.main(["reproduce", "--rows", *rows, "--seeds", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert ("unknown row(s) COMET (comet?), Transformer (transformer?), FFN-1 (ffn1?), dropout = 0.3 (dropout03?), "
            "d_ff = 1024 (dff1024?), Temporal Convolutions (temporal_conv?), ffn (ffn2 or ffn1?), transfomer (transformer?), "
            "xyz; choose from: comet,") in err, err
    assert not (tmp_path / "r").exists()


def test_figure_4_says_when_it_plots_a_few_test_sentences(monkeypatch, tmp_path):
    """report.md says a --eval-limit run decoded the first N sentences, but figure4_bleu_by_length.png,
    a file one may show alone, was titled 'test_2016_flickr' as if on all 1,000 (a smoke run of 40
    sentences has a bar or two of 3-5 sentences each). Its title says so now, and is as before without."""
    import matplotlib.figure

    from cometnmt import reproduce

    titles = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: titles.append(fig.axes[0].get_title()))
    by_length = [{"length": 8, "count": 3, "paper_bleu": 5.0}]
    records = [{"row": row, "seed": 1, "test": {"n_sentences": 40, "bleu_by_length": by_length}} for row in ("comet", "transformer")]
    reproduce._figure4(tmp_path, records, "comet", 40)
    reproduce._figure4(tmp_path, records, "comet")
    # a limit above the test set's size decoded all of it: 40 of 40 is not 'the first 40 only'
    reproduce._figure4(tmp_path, records, "comet", 5000)
    assert titles == ["Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ 3 sentences\n"
                      "the first 40 test sentences only (--eval-limit 40)",
                      "Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ 3 sentences",
                      "Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ 3 sentences"]
    # runs that recorded the test set's size: a limit equal to it decoded all of it (--eval-limit 1000
    # on test_2016_flickr's 1,000 sentences was titled "the first 1000 test sentences only")
    titles.clear()
    for n, size, limit in ((1000, 1000, 1000), (40, 1000, 40)):
        for r in records:
            r["test"].update(n_sentences=n, split_sentences=size)
        reproduce._figure4(tmp_path, records, "comet", limit)
    assert titles == ["Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ 3 sentences",
                      "Figure 4 (ours): test_2016_flickr, avg sentence BLEU, lengths with ≥ 3 sentences\n"
                      "the first 40 test sentences only (--eval-limit 40)"]


def test_the_validation_bleu_axis_does_not_go_below_zero(monkeypatch, tmp_path):
    """Runs whose validation BLEU was 0 at every epoch (a tiny smoke run) drew reproduce's and
    compare's BLEU axis from -0.05 to 0.05, negative BLEU on the axis. It starts at 0 now."""
    import matplotlib.figure

    from cometnmt import compare, reproduce

    bottoms = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: bottoms.append(fig.axes[1].get_ylim()[0]))
    history = [{"epoch": e, "val_loss": 5.0 - e, "val_bleu": 0.0} for e in (1, 2, 3)]
    records = [{"row": row, "seed": 1, "history": history} for row in ("comet", "transformer")]
    reproduce._learning_curves(tmp_path, ["comet", "transformer"], records)
    compare._curves(tmp_path, ["comet", "transformer"], records)
    assert bottoms == [0.0, 0.0]


def test_the_bootstrap_log_lines_name_the_systems_and_seeds(monkeypatch, caplog):
    """reproduce's log had, per seed and metric, 'paired bootstrap (bleu, 1 + 1 runs, 50 samples):
    A=31.20 B=30.85 p=0.2400', leaving the reader to know which system was A and which seed a line
    was. Each line names the systems with their seed(s) now; paired_bootstrap called without names
    still says A and B."""
    import types

    import cometnmt.data.tokenizers
    from cometnmt.evaluation import paired_bootstrap

    reproduce, args, out, records = _example_runs(monkeypatch, [50.0, 10.0, 30.0, 0.0], [10.0, 50.0, 30.0, 20.0])
    records += [dict(r, seed=3) for r in records]
    cfg = types.SimpleNamespace(data=types.SimpleNamespace(tgt_lang="de", lowercase=False))
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: (None, [f"a ref number {i}" for i in range(4)], cfg))
    monkeypatch.setattr(cometnmt.data.tokenizers, "paper_tokenizer", lambda lang: None)  # BLEU alone, no spaCy
    args.bootstrap = 20
    with caplog.at_level("INFO", logger="cometnmt.evaluation"):
        reproduce._significance(args, out, records, {}, "comet")
        paired_bootstrap(["a b"], ["a c"], ["a b"], n_samples=5)
    lines = [r.getMessage().split(": ", 1)[1] for r in caplog.records if "paired bootstrap" in r.getMessage()]
    assert [line.split(", p")[0].split(" vs ")[1].rsplit(" ", 1)[0] for line in lines] == \
        ["Transformer seed 2", "Transformer seed 3", "Transformer seeds 2, 3", "B"], lines
    assert [line.split(" vs ")[0].rsplit(" ", 1)[0] for line in lines] == ["COMET seed 2", "COMET seed 3", "COMET seeds 2, 3", "A"]


def test_a_candidate_written_as_the_paper_writes_it_gets_its_name(capsys, tmp_path):
    """--rows COMET got '(comet?)', but --candidate COMET (or 'comet bn length') was refused with
    the rows alone, the reader left to see that only the case differed. It gets the same suggestion."""
    from cometnmt import cli

    for cand, hint in (("COMET", "comet"), ("comet bn length", "comet_bn_length")):
        assert cli.main(["reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(tmp_path / "r"),
                         "--candidate", cand]) == 2
        assert f"--candidate {cand} ({hint}?): must be one of --rows (comet, transformer)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_table_headers_tell_the_papers_scores_from_its_metric():
    """report.md's Table 1 was headed 'paper dev | ours dev (paper) | ... | paper test | ours test
    (paper)': 'paper' meant the paper's score in one column and the paper's metric in the next. The
    paper's scores are 'paper's dev/test' now, ours on its metric 'ours dev/test, paper metric', and
    the note above the table says which is which."""
    import argparse

    from cometnmt import reproduce

    split = {"paper_bleu": 38.0, "bleu": 34.0, "chrf": 55.0}
    table = reproduce.summarise(["comet"], [{"row": "comet", "seed": 1, "valid": split, "test": split, "epochs": 10}])
    report = {"provenance": {"commit": "x", "run_commits": [], "command": "c", "hardware": "h", "torch": "t", "date": "d",
                             "wall_seconds": 0.0, "train_hours": 0.0, "overrides": [], "missing_runs": [], "eval_limit": None},
              "table": table, "runs": []}
    text = reproduce._markdown(argparse.Namespace(), report)
    header = next(line for line in text.splitlines() if line.startswith("| model |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[3:8] == ["paper's dev", "ours dev, paper metric", "ours dev BLEU", "paper's test", "ours test, paper metric"]
    assert not any(c in ("paper dev", "paper test") or "(paper)" in c for c in cells)
    assert "Paper's dev and test: the scores the COMET paper reports. Paper metric" in text
    assert "| COMET | 1 | 10.00 | 38.65 | 38.00 | 34.00 | 38.69 | 38.00 |" in text  # the paper's, then ours


def test_figure_4_tells_equal_scores_from_lengths_left_out(monkeypatch, tmp_path):
    """A length where COMET and the Transformer scored the same drew a bar of height 0, nothing, as a
    length dropped for having fewer than 3 sentences does: the reader could not tell a tie from a
    gap. A tie is a dot at 0 now, and the legend and report.md name the lengths left out."""
    import argparse

    import matplotlib.figure

    from cometnmt import reproduce
    from cometnmt.experiments import provenance

    drawn, limits = [], []

    def savefig(fig, *a, **k):
        ax = fig.axes[0]
        dots = [(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines() if line.get_marker() == "o"]
        drawn.append((dots, [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []))
        low, high = ax.get_ylim()
        limits.append(low < 0 < high)  # 0 inside the axis: a dot there is drawn whole, whatever the bars' sign

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    comet = [{"length": L, "count": 3, "paper_bleu": b} for L, b in ((6, 30.0), (7, 20.0), (9, 25.0), (12, 10.0))]
    trans = [{"length": L, "count": 3, "paper_bleu": b} for L, b in ((6, 28.0), (7, 20.0), (9, 26.0), (12, 10.0))]
    records = [{"row": row, "seed": 1, "test": {"n_sentences": 40, "bleu_by_length": by, "lengths_too_few": []}}
               for row, by in (("comet", comet), ("transformer", trans))]
    rows = reproduce._figure4(tmp_path, records, "comet")
    assert drawn == [([([7, 12], [0.0, 0.0])], ["equal scores (|difference| < 0.005, 0.00 to 2 decimals)",
                                                 "not plotted, fewer than 3 sentences: 8, 10–11"])]
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None, out=".")
    report = {"provenance": provenance(args, 1.0, [], []), "table": [], "runs": [], "figure4": rows, "figure4_left_out": []}
    assert ("![figure 4](figure4_bleu_by_length.png)\n\nLengths 6–12 are plotted but for 8, 10–11: fewer than 3 test "
            "sentences. A dot at 0 marks equal scores (|difference| < 0.005, 0.00 to 2 decimals): 7, 12.\n") \
        in reproduce._markdown(args, report)
    drawn.clear()  # neither: no dot, no legend, no caption
    rows = reproduce._figure4(tmp_path, [dict(r, test={"bleu_by_length": r["test"]["bleu_by_length"][:1], "lengths_too_few": []})
                                         for r in records], "comet")
    assert drawn == [([], [])] and "Lengths" not in reproduce._markdown(args, dict(report, figure4=rows))
    assert limits == [True, True]


def test_figure_4_names_the_lengths_left_out_outside_its_range(monkeypatch, tmp_path):
    """Figure 4 named the lengths without a bar between its shortest and longest plotted, but not the
    shorter or longer ones with fewer than 3 test sentences (a reader could not tell 'none that short'
    from 'too few to plot'). The scores record those lengths now (lengths_too_few), and the legend,
    report.json (figure4_left_out) and report.md name them; a report of runs scored before says it
    cannot. Equal scores are those that print as 0.00, |difference| < 0.005, as the legend says."""
    import argparse

    import matplotlib.figure

    from cometnmt import reproduce
    from cometnmt.evaluation import evaluate
    from cometnmt.experiments import provenance

    def words(line):
        return line.split()

    src = ["a b", "a b c", "a b c", "a b c", "a b c d e f g h"]
    scored = evaluate(["x y", "x y z", "x y z", "x z z", "w"], ["x y", "x y z", "x y w", "x y z", "v"], tokenize=words, src=src)
    assert scored["lengths_too_few"] == [2, 8] and [r["length"] for r in scored["bleu_by_length"]] == [3]

    legends = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: legends.append(
        [t.get_text() for t in fig.axes[0].get_legend().get_texts()] if fig.axes[0].get_legend() else []))
    by = {"comet": [(6, 30.0), (7, 20.004), (9, 25.0)], "transformer": [(6, 28.0), (7, 20.0), (9, 26.0)]}
    records = [{"row": row, "seed": 1, "test": {"bleu_by_length": [{"length": L, "count": 3, "paper_bleu": b} for L, b in by[row]],
                                               "lengths_too_few": [2, 3, 8, 14, 20]}} for row in by]
    rows = reproduce._figure4(tmp_path, records, "comet")
    assert legends == [["equal scores (|difference| < 0.005, 0.00 to 2 decimals)",
                        "not plotted, fewer than 3 sentences: 2–3, 8, 14, 20"]]
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None, out=".")
    report = {"provenance": provenance(args, 1.0, [], []), "table": [], "runs": [], "figure4": rows,
              "figure4_left_out": reproduce._figure4_left_out(records, "comet")}
    text = reproduce._markdown(args, report)
    assert ("Lengths 6–9 are plotted but for 8: fewer than 3 test sentences, as for 2–3, 14, 20 outside that range. "
            "A dot at 0 marks equal scores (|difference| < 0.005, 0.00 to 2 decimals): 7.") in text
    del report["figure4_left_out"]  # runs scored before lengths_too_few was recorded: said, not guessed
    assert ("Lengths 6–9 are plotted but for 8: fewer than 3 test sentences. Lengths outside 6–9 with fewer than 3 test "
            "sentences are not plotted and not named here") in reproduce._markdown(args, report)
    older = [dict(r, test={"bleu_by_length": r["test"]["bleu_by_length"]}) for r in records]
    assert reproduce._figure4_left_out(older, "comet") is None
    reproduce._figure4(tmp_path, older, "comet")
    assert legends[-1][1] == "not plotted, fewer than 3 sentences: 8; those outside 6–9 not recorded"


def test_a_compare_report_is_not_merged_into_table_1(tmp_path):
    """`compare configs/multi30k/comet.yaml configs/multi30k/transformer.yaml` keeps runs named comet
    and transformer, which --merge-report took into Table 1 as reproduce's: decoded with each
    config's search (or --beam, --average-last), and scored without the paper's per-sentence
    scores and lengths, so Figure 4 and the examples were left out without a word, and without
    --metrics paper their paper-metric column averaged the other seeds alone."""
    import argparse

    from cometnmt import reproduce
    from cometnmt.errors import CometNMTError

    run = {"row": "comet", "seed": 2, "test": {"bleu": 30.0, "chrf": 55.0}, "decode": {"method": "beam"}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"provenance": {}, "systems": ["comet", "transformer"], "table": [], "runs": [run]}))
    args = argparse.Namespace(merge_report=path, seeds=[1, 2], out=str(tmp_path / "out"), eval_limit=None)
    with pytest.raises(CometNMTError) as err:
        reproduce._previous_report(args, ["comet", "transformer"])
    assert str(err.value).startswith(f"--merge-report: {path} is a cometnmt compare report.json")


def test_the_bootstrap_scores_a_lowercased_transformer_as_its_table_row(monkeypatch):
    """The bootstrap took data.lowercase from the candidate's run alone: a Transformer row trained
    with it (a run reused from a call with --set data.lowercase=true) was scored cased against cased
    references, far below its own table row, and COMET declared better. As compare does, both are
    scored lowercased where either was."""
    import argparse
    import types
    from pathlib import Path

    import cometnmt.data.tokenizers
    from cometnmt import reproduce

    refs = [f"A Dog runs on the Beach number {i} ." for i in range(6)]
    hyps = {"comet": refs, "transformer": [r.lower() for r in refs]}
    monkeypatch.setattr(reproduce, "test_hyps", lambda out, rec: hyps[rec["row"]])
    cfg = types.SimpleNamespace(data=types.SimpleNamespace(tgt_lang="en", lowercase=False))  # COMET's run
    monkeypatch.setattr(reproduce, "_test_corpus", lambda args, out, rec: (None, refs, cfg))
    monkeypatch.setattr(cometnmt.data.tokenizers, "paper_tokenizer", lambda lang: None)  # BLEU alone, no spaCy
    records = [{"row": "comet", "seed": 1, "test": {"bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a"}},
               {"row": "transformer", "seed": 1, "test": {"bleu_signature": "nrefs:1|case:lc|eff:no|tok:13a"}}]
    [row] = reproduce._significance(argparse.Namespace(bootstrap=20), Path("."), records, {}, "comet")
    assert row["delta"] == 0.0 and row["p_value"] == 1.0 and "case:lc" in row["label"]
