"""`cometnmt compare` end to end on a tiny setting, with the issue 4 presets themselves
(Transformer++ en->de against its same-size Transformer, shrunk by overrides): each run evaluated
on the average of its last epoch checkpoints with the presets' beam search, a paired bootstrap per
seed and pooled, the POS/NER losses in the report; bad invocations fail before anything trains."""

from __future__ import annotations

import json

import pytest
import torch

PRESETS = ["configs/multi30k/transformer_pp_en_de.yaml", "configs/multi30k/transformer_pp_baseline_en_de.yaml"]


def _tiny(tmp_path) -> list[str]:
    sets = ["data.max_train_pairs=400", "data.max_valid_pairs=20", "data.sp_vocab_size=400", "model.d_model=32",
            "model.n_heads=4", "model.d_ff=64", "model.enc_layers=3", "model.dec_layers=1", "train.batch_tokens=1024",
            "train.accum_steps=1", "train.warmup_steps=10", "train.max_epochs=2", "train.keep_checkpoints=2",
            "train.num_threads=1", "train.valid_bleu_max_sentences=20", "model.transformer_pp.conv_heads=2",
            f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}"]
    return [arg for s in sets for arg in ("--set", s)] + ["--eval-limit", "25", "--bootstrap", "50"]


def test_compare_transformer_pp_with_its_baseline(cli, tmp_path):
    out = tmp_path / "cmp"
    cli("compare", *PRESETS, "--seeds", "1", "2", "--jobs", "2", "--average-last", "2", "--out", str(out), *_tiny(tmp_path))
    report = json.loads((out / "report.json").read_text())
    assert report["systems"] == ["transformer_pp_en_de", "transformer_pp_baseline_en_de"]
    table = {e["system"]: e for e in report["table"]}
    for name in report["systems"]:
        assert table[name]["seeds"] == [1, 2] and table[name]["test_bleu"][0] is not None
        assert table[name]["search"] == "beam 5, length penalty 0.5"  # the presets' search
        assert table[name]["checkpoint"] == ["epoch001.pt", "epoch002.pt"]
        assert (out / "runs" / name / "seed1" / "avg.pt").exists()
    assert table["transformer_pp_en_de"]["arch"] == "transformer_pp" and table["transformer_pp_baseline_en_de"]["arch"] == "transformer"
    sig = report["significance"]
    assert [s["seeds"] for s in sig] == [[1], [2], [1, 2]] and sig[-1]["runs"] == [2, 2]
    assert all(0.0 <= s["p_value"] <= 1.0 and s["metric"] == "bleu" for s in sig)
    aux = {(a["system"], a["seed"], a["loss"]) for a in report["aux_losses"]}
    assert aux == {("transformer_pp_en_de", s, f"loss_{t}") for s in (1, 2) for t in ("pos", "ner")}
    text = (out / "report.md").read_text()
    assert "| 1, 2 (pooled) | bleu | transformer_pp_en_de | transformer_pp_baseline_en_de |" in text
    assert "average of 2 (epoch001.pt … epoch002.pt)" in text and "first 25 sentences" in text
    assert (out / "learning_curves.png").stat().st_size > 0
    assert len((out / "runs" / "transformer_pp_en_de" / "seed2" / "test.hyp").read_text().splitlines()) == 25
    for name in report["systems"]:  # kept beside the report too (OUT/runs is too big to commit)
        for seed in (1, 2):
            for split in ("valid", "test"):
                kept = out / "hypotheses" / name / f"seed{seed}" / f"{split}.hyp"
                assert kept.read_bytes() == (out / "runs" / name / f"seed{seed}" / f"{split}.hyp").read_bytes() != b""

    done = out / "runs" / "transformer_pp_en_de" / "seed1" / "done.json"
    stamp = done.stat().st_mtime_ns
    cli("compare", *PRESETS, "--seeds", "1", "2", "--average-last", "2", "--out", str(out), "--report-only",
        "--metrics", "bleu", "paper", *_tiny(tmp_path))
    assert done.stat().st_mtime_ns == stamp  # finished runs are not trained again
    again = json.loads((out / "report.json").read_text())  # the COMET paper's metric too, table and bootstrap
    assert [(s["metric"], s["seeds"]) for s in again["significance"]] == [
        (m, seeds) for m in ("bleu", "paper") for seeds in ([1], [2], [1, 2])]
    assert [s for s in again["significance"] if s["metric"] == "bleu"] == sig
    assert all(e["test_paper_bleu"][0] is not None for e in again["table"])
    assert "dev, paper metric | test, paper metric" in (out / "report.md").read_text()


def test_compare_rejects_bad_invocations(cli, tmp_path):
    out = str(tmp_path / "bad")
    proc = cli("compare", PRESETS[0], "--out", out, check=False)
    assert proc.returncode == 2 and "at least two configs" in proc.stderr
    proc = cli("compare", PRESETS[0], PRESETS[0], "--out", out, check=False)
    assert proc.returncode == 2 and "share the name 'transformer_pp_en_de'" in proc.stderr
    proc = cli("compare", *PRESETS, "--out", out, "--set", "train.max_epoch=3", check=False)
    assert proc.returncode == 2 and "train.max_epoch" in proc.stderr
    proc = cli("compare", *PRESETS, "--out", out, "--set", "data.valid_src=v.de", "--set", "data.valid_tgt=v.en",
               "--deadline", "0", check=False)  # read by no run: data.corpus stays multi30k
    # the overrides' values, named as load_config names an override's (no preset: it set neither)
    assert proc.returncode == 2 and ("cometnmt: error: config keys 'data.valid_src', 'data.valid_tgt': set, but "
                                     "data.corpus is 'multi30k'") in proc.stderr
    (tmp_path / "tags").write_text("")  # a file where Transformer++'s tag cache folder should be
    proc = cli("compare", *PRESETS, "--out", out, "--set", f"model.transformer_pp.tag_cache_dir={tmp_path / 'tags'}",
               "--deadline", "0", check=False)
    assert proc.returncode == 2 and (f"cometnmt: error: config key 'model.transformer_pp.tag_cache_dir': {tmp_path / 'tags'} "
                                     "is a file, not a folder") in proc.stderr
    # the bootstrap scores every system against the first one's test references: de-en beside en-de
    # was scored against German references, silently
    proc = cli("compare", PRESETS[0], "configs/multi30k/transformer_pp_baseline_de_en.yaml", "--out", out, "--deadline", "0",
               check=False)
    assert proc.returncode == 2 and ("configs/multi30k/transformer_pp_baseline_de_en.yaml: its test set is not that of "
                                     f"{PRESETS[0]} (data.src_lang 'en' there, 'de' here; data.tgt_lang 'de' there, 'en' "
                                     "here)") in proc.stderr
    assert not (tmp_path / "bad" / "runs").exists()  # nothing trained


@pytest.mark.skipif(torch.cuda.is_available(), reason="makes training fail by asking for CUDA where there is none")
def test_a_name_that_is_not_one_folder_name_is_refused_before_anything_trains(cli, tmp_path):
    """compare keeps a config's runs in OUT/runs/NAME/seedS, and name was not checked: '../x' put
    them outside the report folder, 'a/b' under another name's folder, '.hidden' in a hidden one.
    A config loads with such a name (a checkpoint trained under it still translates); compare
    refuses it, naming the file and the key."""
    from cometnmt.config import load_config

    out = tmp_path / "report"
    for name in ("../x", "a/b", ".hidden"):
        proc = cli("compare", *PRESETS, "--out", str(out), "--set", f"name={name}", "--deadline", "0", check=False)
        assert proc.returncode == 2 and f"config key 'name': {name!r} is not a plain folder name" in proc.stderr
        assert PRESETS[0] in proc.stderr
        assert load_config(None, [f"name={name}"]).name == name
    assert not (tmp_path / "x").exists() and not (out / "runs").exists()


def test_configs_of_another_dev_set_are_warned_of(cli, tmp_path):
    """The dev set is each run's own (validation and its stopping rule), so another is allowed, but
    the report's dev BLEU column then set scores of other sentences side by side without a word."""
    from conftest import REPO

    other = tmp_path / "other.yaml"
    other.write_text(f"base: {REPO / PRESETS[1]}\nname: fewer_dev\ndata:\n  max_valid_pairs: 30\n", encoding="utf-8")
    proc = cli("compare", PRESETS[0], str(other), "--out", str(tmp_path / "r"), "--deadline", "0", check=False)
    assert (f"{other}: its dev set is not that of {PRESETS[0]} (data.max_valid_pairs None there, 30 here)"
            in proc.stderr), proc.stderr
    proc = cli("compare", *PRESETS, "--out", str(tmp_path / "r2"), "--deadline", "0", check=False)
    assert "dev set" not in proc.stderr


def test_compare_reports_failed_runs_and_exits_1(cli, tmp_path):
    out = tmp_path / "fail"
    proc = cli("compare", *PRESETS, "--seeds", "1", "--out", str(out), "--device", "cuda", *_tiny(tmp_path), check=False)
    assert proc.returncode == 1
    assert "training transformer_pp_en_de seed 1 failed" in proc.stderr and "stdout.log" in proc.stderr
    log = (out / "runs" / "transformer_pp_en_de" / "seed1" / "stdout.log").read_text()
    assert "train.device='cuda', but CUDA is not available" in log
    report = json.loads((out / "report.json").read_text())  # the report is still written, every run missing
    assert report["provenance"]["missing_runs"] == ["transformer_pp_en_de seed 1", "transformer_pp_baseline_en_de seed 1"]


def test_the_checkpoint_column_names_each_seeds_checkpoints_where_they_differ():
    """A run that stopped at epoch 43 averages epochs 34-43; the table named seed 1's 36-45 for all
    (the committed Transformer++ report)."""
    from cometnmt import compare

    def run(seed, last):
        score = {"bleu": 30.0, "chrf": 50.0}
        return {"row": "a", "seed": seed, "arch": "transformer", "parameters": 1, "decode": {"method": "greedy"},
                "checkpoint": [f"epoch{e:03d}.pt" for e in range(last - 9, last + 1)], "valid": score, "test": score,
                "epochs": last, "train_tokens_per_s": 1.0}

    [entry] = compare.summarise(["a"], [run(1, 45), run(2, 45), run(3, 43)])
    assert compare._checkpoint_label(entry) == ("seeds 1, 2: average of 10 (epoch036.pt … epoch045.pt); "
                                                "seed 3: average of 10 (epoch034.pt … epoch043.pt)")
    [entry] = compare.summarise(["a"], [run(1, 45), run(2, 45)])
    assert compare._checkpoint_label(entry) == "average of 10 (epoch036.pt … epoch045.pt)"
    assert compare._checkpoint_label({"checkpoint": ["best.pt"]}) == "best.pt"  # a report.json of before


def test_search_label_names_a_sampling_config():
    from cometnmt.compare import _search_label
    from cometnmt.config import DecodeConfig, to_dict

    assert _search_label(to_dict(DecodeConfig(method="sample", sampling_topk=10, sampling_seed=3))) == \
        "sampling (top-k 10, top-p 1, temperature 1, seed 3)"
    assert _search_label(to_dict(DecodeConfig(method="beam", length_penalty=0.5))) == "beam 5, length penalty 0.5"
    assert _search_label(to_dict(DecodeConfig(replace_unk=True))) == "greedy, <unk> replaced"
    old = to_dict(DecodeConfig())
    del old["replace_unk"]  # a report written before the key
    assert _search_label(old) == "greedy"


def test_average_last_needs_the_epoch_checkpoints_before_anything_trains(cli, tmp_path):
    """--average-last N over configs that keep fewer than N epoch checkpoints (train.keep_checkpoints)
    or train fewer than N epochs (train.max_epochs): every run trained to the end, then failed at its
    evaluation; the hinted train.keep_checkpoints failed again, since the finished runs had none.
    (--deadline 0: a regression starts no training here.)"""
    out = tmp_path / "avg"
    proc = cli("compare", *PRESETS, "--average-last", "11", "--out", str(out), "--deadline", "0", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"--average-last 11 averages each run's last 11 epoch checkpoints, but {PRESETS[0]} has "
            f"train.keep_checkpoints=10; {PRESETS[1]} has train.keep_checkpoints=10;") in proc.stderr
    assert "--set train.keep_checkpoints=11" in proc.stderr
    proc = cli("compare", *PRESETS, "--average-last", "3", "--out", str(out), "--deadline", "0", *_tiny(tmp_path), check=False)
    assert proc.returncode == 2  # the --set overrides count: train.keep_checkpoints=2, train.max_epochs=2
    assert (f"{PRESETS[1]} has train.keep_checkpoints=2 and train.max_epochs=2 (with this call's --set overrides); "
            "set train.keep_checkpoints and train.max_epochs to at least 3") in proc.stderr
    assert not out.exists()  # refused before any run started


def test_a_run_without_epoch_checkpoints_says_how_to_get_them(tmp_path):
    import argparse

    from cometnmt import compare
    from cometnmt.errors import CometNMTError

    run = tmp_path / "seed1"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  keep_checkpoints: 0\n")
    with pytest.raises(CometNMTError, match="has no epochNNN.pt checkpoints to average \\(trained with "
                                            "train.keep_checkpoints=0\\); they are written only while it trains"):
        compare._checkpoint(argparse.Namespace(average_last=2), run)


def test_a_lowercased_system_is_tested_as_it_was_scored(monkeypatch, tmp_path):
    """The bootstrap scored both systems with the first one's data.lowercase: a second system
    trained lowercased (its table row scored so: 100.00) was scored cased, 79.53, and the first
    was declared better with p < 0.02 (0 of 50 samples) though both translate alike."""
    import argparse
    import types

    from cometnmt import compare

    refs = ["A man rides a bike .", "Two dogs play in the snow .", "A woman sings on a stage ."]
    hyps = {"cased": refs, "lower": [r.lower() for r in refs]}
    cfg = types.SimpleNamespace(data=types.SimpleNamespace(lowercase=False, tgt_lang="en"))
    monkeypatch.setattr(compare, "run_test_split", lambda run, limit: (refs, refs, cfg))
    monkeypatch.setattr(compare, "test_hyps", lambda out, rec: hyps[rec["row"]])
    sig = {"cased": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp", "lower": "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp"}
    records = [{"row": name, "seed": 1, "test": {"bleu": 100.0, "bleu_signature": sig[name]}} for name in ("cased", "lower")]
    args = argparse.Namespace(seeds=[1], eval_limit=None, bootstrap=50, metrics=["bleu"])
    [test] = compare.significance(args, tmp_path, ["cased", "lower"], records)
    assert test["b"] == pytest.approx(100.0) and test["delta"] == pytest.approx(0.0) and test["p_value"] == 1.0


def test_budget_ended_runs_name_what_was_decoded():
    """compare --average-last decodes the average of each run's last epochs, but the line on runs a
    budget ended said "best.pt is the best epoch trained" of them too."""
    from cometnmt.experiments import capped_lines

    run = {"row": "a", "seed": 1, "epochs": 3, "stopped_by": "max_epochs", "stopping": "loss_rise"}
    (line,) = [x for x in capped_lines([{**run, "checkpoint": ["epoch002.pt", "epoch003.pt"]}], lambda r: r["row"]) if x]
    assert "(the epochs averaged are the last trained, not those before the rule would have fired)" in line
    assert "best.pt" not in line
    for best in ({**run, "checkpoint": ["best.pt"]}, run):  # compare without --average-last; reproduce
        (line,) = [x for x in capped_lines([best], lambda r: r["row"]) if x]
        assert "(best.pt is the best epoch trained, perhaps not the rule's)" in line


def test_a_config_of_several_hypotheses_is_scored_on_its_best_as_evaluate_does(monkeypatch, tmp_path):
    """compare decoded each run with its config's search as it stands: decode.nbest 3 beside method
    greedy made it a beam search of decode.beam_size (evaluate --checkpoint, which scores one
    hypothesis, searched greedily), and with --beam 1 every run trained before evaluation was refused
    ("--nbest 3: more hypotheses than the beam keeps (1)", a flag compare does not have)."""
    import argparse
    import types

    from cometnmt import compare
    from cometnmt.config import DecodeConfig
    from cometnmt.inference import Translator

    class Decoded(Exception):
        pass

    def translate_split(split, decode, limit=None):
        raise Decoded(decode)

    translator = types.SimpleNamespace(cfg=types.SimpleNamespace(decode=DecodeConfig(nbest=3)), translate_split=translate_split,
                                       model=torch.nn.Linear(1, 1))
    translator.cfg.data = types.SimpleNamespace(tgt_lang="en", src_lang="de", lowercase=False)
    translator.cfg.model = types.SimpleNamespace(arch="transformer")
    monkeypatch.setattr(compare, "_checkpoint", lambda args, run: (run / "best.pt", ["best.pt"]))
    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(lambda path, device: translator))
    for beam, method in ((None, "greedy"), (1, "greedy"), (4, "beam")):
        args = argparse.Namespace(beam=beam, length_penalty=None, device="cpu", eval_limit=None)
        with pytest.raises(Decoded) as caught:
            compare._evaluate_run(args, tmp_path)
        decode = caught.value.args[0]
        assert (decode.method, decode.nbest) == (method, 1)


def test_every_run_lists_the_papers_metric_when_asked_for(tmp_path):
    """With --metrics bleu paper the summary table gave each system's dev and test paper metric, but
    'Every run' kept BLEU and chrF alone, so a seed's paper-metric scores were in report.json only.
    Its rows carry both columns now ('–' for a run scored without it); without --metrics paper, not."""
    import argparse

    from cometnmt import compare
    from cometnmt.experiments import provenance

    def run(name, seed, paper):
        split = {"bleu": 30.0 + seed, "chrf": 55.0, "n_sentences": 3, **({"paper_bleu": 35.0 + seed} if paper else {})}
        return {"row": name, "seed": seed, "epochs": 4, "valid": dict(split), "test": dict(split), "arch": "transformer",
                "parameters": 1e6, "decode": {"method": "greedy"}, "checkpoint": ["best.pt"], "train_tokens_per_s": 100.0,
                "history": [], "command": f"cometnmt train {name}.yaml"}

    runs = [run("a", 1, True), run("b", 1, True), run("a", 2, True), run("b", 2, False)]
    args = argparse.Namespace(out=str(tmp_path), device="cpu", set=[], eval_limit=None)
    for metrics, header, row in ((["bleu", "paper"], "| test chrF | dev, paper metric | test, paper metric |", "| b | 2 | 4 | 32.00 | 32.00 | 55.00 | – | – |"),
                                 (["bleu"], "| test chrF |", "| b | 2 | 4 | 32.00 | 32.00 | 55.00 |")):
        report = {"provenance": provenance(args, 1.0, runs, []), "systems": ["a", "b"], "metrics": metrics,
                  "table": compare.summarise(["a", "b"], runs), "significance": [], "aux_losses": {}, "runs": runs}
        every = compare._markdown(report).split("## Every run", 1)[1].split("\n## ", 1)[0].strip().splitlines()
        assert every[0].endswith(header) and every[1].count("|") == every[0].count("|")
        assert "| a | 1 | 4 | 31.00 | 31.00 | 55.00 |" + (" 36.00 | 36.00 |" if "paper" in metrics else "") in every
        assert every[-1] == row


def test_a_small_model_s_parameters_are_not_shown_as_none(tmp_path):
    """A tiny config's 41,558 parameters were shown as '0.0M', a model of no parameters; below 0.1M
    they are counted in full, and from there in millions as before."""
    import argparse

    from cometnmt import compare
    from cometnmt.experiments import provenance

    split = {"bleu": 30.0, "chrf": 55.0, "n_sentences": 3}
    runs = [{"row": name, "seed": 1, "epochs": 4, "valid": dict(split), "test": dict(split), "arch": "transformer",
             "parameters": n, "decode": {"method": "greedy"}, "checkpoint": ["best.pt"], "train_tokens_per_s": 100.0,
             "history": [], "command": f"cometnmt train {name}.yaml"} for name, n in (("a", 41558), ("b", 11381615))]
    args = argparse.Namespace(out=str(tmp_path), device="cpu", set=[], eval_limit=None)
    report = {"provenance": provenance(args, 1.0, runs, []), "systems": ["a", "b"], "metrics": ["bleu"],
              "table": compare.summarise(["a", "b"], runs), "significance": [], "aux_losses": {}, "runs": runs}
    text = compare._markdown(report)
    assert "| a | transformer | 41,558 |" in text and "| b | transformer | 11.4M |" in text


def test_configs_sharing_a_name_are_told_how_to_name_them(capsys, tmp_path):
    """Two variants of one preset (`base: .../tiny.yaml` and a changed key, no name of their own)
    were refused with "share the name 'tiny'; runs are kept by name, so give each its own", which
    named neither the key nor where the name came from. It names both and the line to add."""
    from cometnmt import cli
    from conftest import REPO

    for lr in ("1e-3", "3e-3"):
        (tmp_path / f"lr{lr}.yaml").write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ntrain:\n  lr: {lr}\n")
    a, b = str(tmp_path / "lr1e-3.yaml"), str(tmp_path / "lr3e-3.yaml")
    assert cli.main(["compare", a, b, "--seeds", "1", "--out", str(tmp_path / "out")]) == 2
    assert (f"configs {a}, {b} share the name 'tiny' (a config without a 'name' key takes its base: file's); runs are "
            f"kept by name, in OUT/runs/NAME, so give each its own: a line such as 'name: lr3e-3' in {b}"
            ) in capsys.readouterr().err
