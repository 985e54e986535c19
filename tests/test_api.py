"""The Python API (cometnmt.api, re-exported by the package): the README's example runs as
written, and each function behaves as its CLI counterpart, with errors naming keywords."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import cometnmt
from cometnmt.errors import ConfigError
from conftest import REPO, tiny_train_cfg


def readme_python_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the README's Python API section should hold one python block"
    return blocks[0]


def test_readme_example_runs_as_written(tmp_path, data_dir):
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the example runs from the repository root
    env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", readme_python_block()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 ") and lines[0].endswith("runs/api_demo")  # epochs, best, save_dir
    assert lines[1].startswith("Translator('transformer', de->en, ") and "checkpoint='runs/api_demo/best.pt'" in lines[1]
    assert lines[3].startswith("[") and lines[3].count("'") >= 4  # a list of two translations
    assert "<unk>" not in lines[4]  # replace_unk
    scores = [float(line.split()[0]) for line in lines[5:8]]
    assert scores == sorted(scores, reverse=True)  # three hypotheses, best first
    run = tmp_path / "runs" / "api_demo"
    assert {"best.pt", "last.pt", "epoch001.pt", "epoch002.pt", "avg.pt", "train.log"} <= {p.name for p in run.iterdir()}
    assert "epoch 2: val loss" in (run / "train.log").read_text(encoding="utf-8")  # INFO was let through
    assert "epoch 1: val loss" in proc.stderr


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir):
    save = tmp_path_factory.mktemp("api") / "run"
    cfg = tiny_train_cfg(save, data_dir, "train.keep_checkpoints=1", "train.num_threads=1")
    summary = cometnmt.train(cfg)
    assert summary["epochs"] == 1 and summary["save_dir"] == str(save)
    return save


@pytest.fixture(scope="module")
def translator(run_dir):
    return cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device="cpu")


def test_package_exports_lazily():
    code = "import sys, cometnmt; print('torch' in sys.modules); print(cometnmt.Translator.__module__); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "cometnmt.inference", "True"]
    assert {"train", "Translator", "score", "evaluate_checkpoint", "average_checkpoints"} <= set(dir(cometnmt))
    with pytest.raises(AttributeError, match="no attribute 'translate'"):
        cometnmt.translate


def test_a_sentencepiece_translator_imports_neither_spacy_nor_sacremoses(tmp_path, data_dir):
    """The tokenizers module imported spaCy and sacremoses (whose import compiles its tokenizer's
    regexes) at its own import: ~1.3 s of every translator's start-up, and a SentencePiece model
    uses neither. They are now imported where a spaCy tokenizer is made."""
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, *_files(tmp_path, data_dir), "data.tokenizer=sentencepiece",
                         "data.sp_vocab_size=200")
    cometnmt.train(cfg)
    code = ("import sys, cometnmt; t = cometnmt.Translator.from_checkpoint(sys.argv[1], device='cpu'); "
            "print(len(t(['Ein Hund.']))); print(sorted(m for m in ('spacy', 'sacremoses') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run" / "best.pt")], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["1", "[]"]


def test_a_spacy_translator_builds_its_target_pipeline_only_to_tokenize_a_target(run_dir, monkeypatch):
    """from_checkpoint built ``spacy.blank`` for both languages (0.1-0.2 s each), and both sides a
    Moses detokenizer, though translating tokenizes only the source and detokenizes only the target
    (Moses, no spaCy). The target's pipeline is now built by the first target tokenized (log_prob),
    and a detokenizer by the first detokenize; the results are those of tokenizers built at once."""
    from cometnmt.data import tokenizers

    built = []
    for name in ("_blank_tokenizer", "_moses_detokenizer"):
        real = getattr(tokenizers, name)
        monkeypatch.setattr(tokenizers, name, lambda lang, real=real, name=name: built.append((name, lang)) or real(lang))
    translator = cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    sources = ["Ein Hund läuft.", "Zwei Männer spielen im T-Shirt Fußball."]
    hyps = translator(sources)
    assert built == [("_blank_tokenizer", "de"), ("_moses_detokenizer", "en")]  # before: de and en, both built at load
    scores = translator.log_prob(sources, ["A dog runs.", "Two men in t-shirts don't play."])
    assert built[2:] == [("_blank_tokenizer", "en")]  # the target pipeline, on first use
    eager = cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    eager.codec.tgt_tok = tokenizers.SpacyTokenizer("en", unk_word=True)  # as from_checkpoint built it before
    assert eager(sources) == hyps
    assert eager.log_prob(sources, ["A dog runs.", "Two men in t-shirts don't play."]) == scores
    tokens = ["Two", "men", "in", "t", "@-@", "shirts", "do", "n't", "play", "<unk>", "."]
    assert translator.codec.tgt_tok.detokenize(tokens) == eager.codec.tgt_tok.detokenize(tokens) == \
        "Two men in t-shirts don't play <unk>."


def test_train_takes_a_path_or_a_config_and_checks_it(tmp_path, data_dir):
    cfg = tiny_train_cfg(tmp_path / "a", data_dir)
    cfg.train.lr = -1.0  # edits to a Config are validated again
    with pytest.raises(cometnmt.ConfigError, match="train.lr"):
        cometnmt.train(cfg)
    with pytest.raises(cometnmt.ConfigError, match="list of 'section.key=value' strings"):
        cometnmt.train(REPO / "configs" / "tiny.yaml", "train.lr=1e-3")
    with pytest.raises(cometnmt.ConfigError, match="train.nonsense"):
        cometnmt.train(REPO / "configs" / "tiny.yaml", ["train.nonsense=1"])
    with pytest.raises(cometnmt.ConfigError, match="got dict"):
        cometnmt.train({"model": {}})
    assert not (tmp_path / "a").exists()  # refused before anything was written


def test_what_training_could_only_meet_at_its_end_is_refused_before_it(tmp_path, data_dir, monkeypatch):
    """Each of these trained a whole run first: a test pair that is missing, a folder, of unequal
    lengths, empty (evaluate's "the reference set is empty", naming no file) or too long for the
    model failed only at ``evaluate --split test``; a save_dir that is
    a file, or under one, was a traceback at its mkdir. ``~`` in save_dir was a folder named ``~``."""
    val_de, val_en = data_dir / "val.de.gz", data_dir / "val.en.gz"
    long_de, long_en = tmp_path / "long.de", tmp_path / "long.en"
    long_de.write_text("Ein Hund .\n" + "Hund " * 45 + "\n", encoding="utf-8")
    long_en.write_text("A dog .\nDogs .\n", encoding="utf-8")
    empty_de, empty_en = tmp_path / "empty.de", tmp_path / "empty.en"
    empty_de.write_bytes(b"")
    empty_en.write_bytes(b"")
    mine = ["data.corpus=files", f"data.train_src={data_dir / 'train.de.gz'}", f"data.train_tgt={data_dir / 'train.en.gz'}",
            f"data.valid_src={val_de}", f"data.valid_tgt={val_en}", "train.num_threads=1"]
    refused = [
        ([f"data.test_src={tmp_path / 'nowhere.de'}", f"data.test_tgt={val_en}"], cometnmt.DataError,
         r"config key 'data.test_src': .*nowhere.de: file not found"),
        ([f"data.test_src={tmp_path}", f"data.test_tgt={val_en}"], cometnmt.DataError, r"'data.test_src': .*: is a folder"),
        ([f"data.test_src={val_de}", f"data.test_tgt={data_dir / 'test_2016_flickr.en.gz'}"], cometnmt.DataError,
         r"val.de.gz has 1014 lines but .*test_2016_flickr.en.gz has 1000"),
        ([f"data.test_src={long_de}", f"data.test_tgt={long_en}", "model.max_positions=40", "data.max_len=30"],
         cometnmt.DataError, r"long.de:2: 45 positions, more than the model's 40 \(model.max_positions\); shorten the test"),
        ([f"data.test_src={empty_de}", f"data.test_tgt={empty_en}"], cometnmt.DataError,
         r"empty.de: no test pairs \(an empty file; evaluate --split test would have nothing to score\)"),
    ]
    for overrides, error, needle in refused:
        save = tmp_path / "run"
        with pytest.raises(error, match=needle):
            cometnmt.train(tiny_train_cfg(save, data_dir, *mine, *overrides))
        assert not (save / "last.pt").exists()
    (tmp_path / "a_file").write_text("x\n", encoding="utf-8")
    for save in (tmp_path / "a_file", tmp_path / "a_file" / "run"):
        with pytest.raises(cometnmt.ConfigError, match=r"config key 'train.save_dir': .*a_file.* is a file, not a folder"):
            cometnmt.train(tiny_train_cfg(save, data_dir, "train.num_threads=1"))
    with pytest.raises(cometnmt.ConfigError, match=r"config key 'data.src_lang': 'cs' is not a language of Multi30k task 1"):
        tiny_train_cfg(tmp_path / "cs", data_dir, "data.src_lang=cs", "train.num_threads=1")  # as the config loads
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    summary = cometnmt.train(tiny_train_cfg("~/tilde", data_dir, "train.num_threads=1", "data.max_train_pairs=60"))
    assert summary["save_dir"] == str(tmp_path / "home" / "tilde") and (tmp_path / "home" / "tilde" / "last.pt").exists()


def test_a_split_without_pairs_is_refused_before_the_run_folder(tmp_path, data_dir):
    """An empty training or validation file, or a training file whose every pair is empty on a side,
    was refused only after the vocabularies were built, leaving a run folder holding train.log
    (a bad data file leaves none), and an empty validation file was named "no validation pairs
    (data.max_valid_pairs=None)"."""
    files = _files(tmp_path, data_dir)  # data.train_src=..., train_tgt, valid_src, valid_tgt
    empty_de, empty_en, blank_en = tmp_path / "empty.de", tmp_path / "empty.en", tmp_path / "blank.en"
    empty_de.write_bytes(b"")
    empty_en.write_bytes(b"")
    blank_en.write_text(" \n" * 60, encoding="utf-8")  # as many lines as _files' train.de
    refused = [
        ([f"data.train_src={empty_de}", f"data.train_tgt={empty_en}"], r"empty.de: no training pairs \(an empty file\)"),
        ([f"data.train_tgt={blank_en}"],
         r"train.de: no training pairs \(all 60 line pairs are empty or whitespace-only on a side\)"),
        ([f"data.valid_src={empty_de}", f"data.valid_tgt={empty_en}"], r"empty.de: no validation pairs \(an empty file\)"),
        (["data.max_valid_pairs=0"], r"valid.de: no validation pairs \(data.max_valid_pairs=0\)"),
    ]
    for overrides, needle in refused:
        save = tmp_path / "run"
        with pytest.raises(cometnmt.DataError, match=needle):
            cometnmt.train(tiny_train_cfg(save, data_dir, *files, "train.num_threads=1", *overrides))
        assert not save.exists()


def test_evaluation_pairs_that_are_training_pairs_too_are_warned_of(tmp_path, data_dir, caplog):
    """A corpus cut into training and dev files without deduplicating first: the dev pairs the
    training files hold too were scored like the others (dev BLEU, early stopping), and nothing
    said so. A pair counts when both sentences match, spaces at their ends aside."""
    from cometnmt.training.run import read_splits

    files = _files(tmp_path, data_dir)  # the first 60 training and 6 validation pairs of Multi30k
    train_de = (tmp_path / "train.de").read_text(encoding="utf-8").splitlines()
    train_en = (tmp_path / "train.en").read_text(encoding="utf-8").splitlines()
    for lang, extra in (("de", [train_de[2], train_de[9], train_de[3]]),
                        ("en", [train_en[2] + " ", train_en[9], "Not the training target."])):
        with open(tmp_path / f"valid.{lang}", "a", encoding="utf-8") as f:  # lines 7, 8 and 9
            f.write("".join(line + "\n" for line in extra))
    test = [f"data.test_src={data_dir / 'val.de.gz'}", f"data.test_tgt={data_dir / 'val.en.gz'}"]
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        read_splits(tiny_train_cfg(tmp_path / "run", data_dir, *files, *test))
    warned = [r.getMessage() for r in caplog.records if "training pairs too" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{tmp_path / 'valid.de'} / {tmp_path / 'valid.en'}: 2 of the 9 "
                                                     "validation pairs are training pairs too (first: line 7)")


def test_a_checkpoint_whose_weights_do_not_fit_its_model_is_named(run_dir, data_dir, tmp_path):
    """A damaged (or hand-edited) checkpoint whose weights do not fit the model its config
    describes was torch's size-mismatch traceback in translate, and in a resume."""
    import torch

    payload = torch.load(run_dir / "last.pt", weights_only=True)
    payload["model"]["src_embed.embed.weight"] = payload["model"]["src_embed.embed.weight"][:1]
    shutil.copytree(run_dir, tmp_path / "run")
    torch.save(payload, tmp_path / "run" / "last.pt")
    with pytest.raises(cometnmt.CheckpointError, match=r"last.pt: its weights do not fit the model its config describes "
                                                       r"\(size mismatch for src_embed.embed.weight: .*\); the file is damaged"):
        cometnmt.Translator.from_checkpoint(tmp_path / "run" / "last.pt", device="cpu")
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "train.keep_checkpoints=1", "train.num_threads=1", "train.max_epochs=2")
    with pytest.raises(cometnmt.CheckpointError, match=r"last.pt: its weights do not fit"):
        cometnmt.train(cfg, resume=True)


def test_a_translator_maps_its_checkpoint_and_holds_its_weights(run_dir, monkeypatch):
    """from_checkpoint read the whole checkpoint, the optimizer state best.pt keeps for a resume
    (3 tensors a weight) included, through torch's unpickler: on an 80 MB COMET best.pt 0.14-0.21 s
    and 178 MB of peak memory. It now maps the file (0.09-0.11 s, 127 MB); the model's weights are
    the file's."""
    import torch

    from cometnmt.training import checkpoint

    seen = []
    load = checkpoint.torch.load
    monkeypatch.setattr(checkpoint.torch, "load", lambda *args, **kwargs: seen.append(kwargs["mmap"]) or load(*args, **kwargs))
    translator = cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    assert seen == [True]
    monkeypatch.undo()
    saved = checkpoint.load_checkpoint(run_dir / "best.pt")["model"]
    state = translator.model.state_dict()
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)


def test_a_checkpoint_whose_config_does_not_load_is_named(run_dir, tmp_path, cli):
    """A checkpoint of an architecture registered by the script that trained it (or of a config
    this version refuses) was "config key 'model.arch': 'mine' is not allowed", naming no file,
    in translate, evaluate, average and a resume; registered again, it loads."""
    from cometnmt.models import REGISTRY
    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(run_dir / "best.pt")
    save_checkpoint({**payload, "config": {**payload["config"], "model": {**payload["config"]["model"], "arch": "mine"}}},
                    tmp_path / "mine.pt")
    with pytest.raises(cometnmt.CheckpointError, match=r"mine.pt: its config does not load in this version of cometnmt: "
                                                       r"config key 'model.arch': 'mine' is not allowed.*register it"):
        cometnmt.Translator.from_checkpoint(tmp_path / "mine.pt", device="cpu")
    proc = cli("translate", str(tmp_path / "mine.pt"), input="Ein Hund.\n", check=False)
    assert proc.returncode == 2 and f"{tmp_path / 'mine.pt'}: its config does not load" in proc.stderr
    REGISTRY["mine"] = REGISTRY["transformer"]
    try:
        assert cometnmt.Translator.from_checkpoint(tmp_path / "mine.pt", device="cpu")("Ein Hund.")
    finally:
        del REGISTRY["mine"]


def test_train_resume_and_refusal(run_dir, data_dir, tmp_path):
    shutil.copytree(run_dir, tmp_path / "run")
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "train.keep_checkpoints=1", "train.num_threads=1")
    with pytest.raises(cometnmt.ConfigError, match=r"already holds a run .*; pass resume=True to continue it"):
        cometnmt.train(cfg)  # the API's keyword, not the CLI's --resume
    with pytest.raises(cometnmt.ConfigError, match=r"^init_from starts a new run .*; resume=True continues"):
        cometnmt.train(cfg, resume=True, init_from=run_dir / "best.pt")
    more = cometnmt.train(cfg, ["train.max_epochs=2"], resume=True)
    assert more["epochs"] == 2 and (tmp_path / "run" / "epoch002.pt").exists()
    assert "max_epochs: 2" in (tmp_path / "run" / "config.yaml").read_text(encoding="utf-8")  # the config it went on with


def test_translator_call_and_translate(translator):
    one = translator("Ein Mann fährt Fahrrad.")
    many = translator(["Ein Mann fährt Fahrrad.", "", "Zwei Hunde."])
    assert isinstance(one, str) and one and many[0] == one and many[1] == ""
    nbest = translator.translate(["Zwei Hunde."], beam=4, nbest=3)[0]
    assert len(nbest) == 3 and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)
    assert isinstance(translator("Zwei Hunde.", beam=4), str)
    assert translator.cfg.decode.method == "greedy"  # the settings are per call, not kept
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate("Zwei Hunde.")
    with pytest.raises(cometnmt.ConfigError, match=r"^beam=0: must be at least 1"):
        translator("Zwei Hunde.", beam=0)
    with pytest.raises(cometnmt.ConfigError, match=r"^nbest=5: more hypotheses than the beam keeps \(2\); use beam=5"):
        translator.translate(["Zwei Hunde."], beam=2, nbest=5)
    with pytest.raises(cometnmt.ConfigError, match=r"^beam='5': must be an integer"):
        translator("Zwei Hunde.", beam="5")
    with pytest.raises(cometnmt.ConfigError, match=r"^length_penalty=-1.0: must be a number from 0 to 10"):
        translator("Zwei Hunde.", length_penalty=-1.0)


def test_translator_samples(translator):
    """Sampling through the API: nbest samples a sentence, best score first; a seed repeats a call
    and another seed changes it; a line's samples depend on neither the batch size nor the other
    lines (they did: one generator served a call's batches in turn); top-k 1 is greedy
    search; bad settings are errors naming the keyword."""
    sents = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad.", ""]

    def sample(seed):
        return translator.translate(sents, sampling=True, nbest=4, temperature=1.5, seed=seed)

    first = sample(3)
    assert [len(r) for r in first] == [4, 4, 4] and all(h.text == "" for h in first[2])
    assert all([h.score for h in r] == sorted((h.score for h in r), reverse=True) for r in first)
    assert sample(3) == first and sample(4) != first
    assert len({h.text for h in first[0]}) > 1  # independent samples
    twice = translator.translate([sents[0]] * 2, sampling=True, nbest=3, temperature=1.5, seed=1, batch_size=1)
    assert twice[0] != twice[1]  # each line its own stream: a repeated sentence is sampled anew
    alone = translator.translate(sents, sampling=True, nbest=4, temperature=1.5, seed=3, batch_size=1)
    assert [[h.text for h in r] for r in alone] == [[h.text for h in r] for r in first]  # whatever the batch size
    beside = translator.translate([sents[0], "Eine Frau liest ein Buch am Strand.", sents[2]], sampling=True, nbest=4,
                                  temperature=1.5, seed=3)
    assert [h.text for h in beside[0]] == [h.text for h in first[0]]  # or the other lines
    pieces = [translator.translate([text], sampling=True, nbest=4, temperature=1.5, seed=3, start=i)[0]
              for i, text in enumerate(sents)]  # line by line, as translate --interactive does
    assert [[h.text for h in r] for r in pieces] == [[h.text for h in r] for r in first]
    assert translator(sents, sampling=True, topk=1, seed=0) == translator(sents)
    assert translator.translate(sents[:1], sampling=True, topk=1)[0][0].score == pytest.approx(translator.translate(sents[:1])[0][0].score)
    assert translator.cfg.decode.method == "greedy"  # per call, not kept
    for settings, message in [({"topk": -1}, r"^topk=-1: must be at least 0 \(0: the whole vocabulary\)"),
                              ({"topp": 0.0}, r"^topp=0.0: must be in \(0, 1\]"),
                              ({"temperature": 0}, r"^temperature=0: must be a positive finite number"),
                              ({"seed": -1}, r"^seed=-1: must be at least 0"),
                              ({"seed": 2**64}, r"^seed=18446744073709551616: must be below 2\*\*63"),  # torch's overflow
                              ({"seed": "1"}, r"^seed='1': must be an integer"),
                              ({"sampling": "yes"}, r"^sampling='yes': must be true or false"),
                              ({"sampling": True, "beam": 3}, r"^sampling=True and beam=3: choose one"),
                              ({"sampling": None, "topk": 5}, r"^topk=5: a sampling setting; add sampling=True"),
                              ({"sampling": False, "temperature": 0.5}, r"^temperature=0.5: a sampling setting")]:
        with pytest.raises(cometnmt.ConfigError, match=message):
            translator.translate(sents, **settings)


def test_sampling_false_leaves_a_sampling_config_for_greedy_search():
    from cometnmt.config import DecodeConfig
    from cometnmt.inference import decode_config

    base = DecodeConfig(method="sample", nbest=8, beam_size=2, sampling_topk=5)
    assert decode_config(base).method == "sample"  # nbest 8 > beam 2: samples, not a beam
    assert decode_config(base, nbest=1, sampling=False).method == "greedy"
    assert decode_config(base, beam=4, nbest=3).method == "beam"  # --beam picks the search
    assert decode_config(DecodeConfig(), nbest=3, beam=3, sampling=False).method == "beam"
    assert decode_config(DecodeConfig(), nbest=6, sampling=True, topp=0.5, seed=2) == DecodeConfig(
        method="sample", nbest=6, sampling_topp=0.5, sampling_seed=2)


def test_search_config_gives_the_checked_search_a_call_runs_without_translating():
    """cometnmt serve checked a request's search settings before queueing it through the private
    Translator._decode. Translator.search_config is that check, public: the DecodeConfig a
    translate call given the same keywords runs (normalised: greedy search of nbest 3 is a beam
    search), errors named as keywords, the translator's own config untouched. No model is run."""
    import types

    import torch

    from cometnmt.config import Config, DecodeConfig
    from cometnmt.inference import Translator

    words = types.SimpleNamespace(kind="spacy")
    translator = Translator(torch.nn.Linear(1, 1), types.SimpleNamespace(src_tok=words, tgt_tok=words), Config(),
                            torch.device("cpu"))
    assert translator.search_config() == translator.cfg.decode == DecodeConfig()
    assert translator.search_config(nbest=3) == DecodeConfig(method="beam", nbest=3)  # greedy with 3 hypotheses: a beam
    assert translator.search_config(beam=4, length_penalty=0.6, batch_size=8, replace_unk=True) == DecodeConfig(
        method="beam", beam_size=4, length_penalty=0.6, batch_sentences=8, replace_unk=True)
    assert translator.search_config(sampling=True, nbest=2, topk=5, seed=7) == DecodeConfig(
        method="sample", nbest=2, sampling_topk=5, sampling_seed=7)
    assert translator.search_config(DecodeConfig(method="beam", beam_size=3), nbest=2) == DecodeConfig(
        method="beam", beam_size=3, nbest=2)  # a given config, its settings replaced
    assert translator.cfg.decode == DecodeConfig()  # per call, not kept
    with pytest.raises(cometnmt.ConfigError, match=r"^beam=0: must be at least 1"):
        translator.search_config(beam=0)
    with pytest.raises(cometnmt.ConfigError, match=r"^topk=5: .*sampling"):
        translator.search_config(topk=5)
    translator.codec.tgt_tok = types.SimpleNamespace(kind="sentencepiece")
    with pytest.raises(cometnmt.ConfigError, match=r"^decode.replace_unk: copies source words"):
        translator.search_config(replace_unk=True)


def test_search_config_names_bad_settings_as_flags_for_the_commands():
    """cometnmt serve (make_server) and evaluate_checkpoint called the private Translator._decode(...,
    flags=True) to get errors named as the command's options. search_config(flags=True) is that,
    public: the same messages, named as flags; no module but inference.py calls a translator's _decode."""
    import pathlib
    import re
    import types

    import torch

    from cometnmt.config import Config
    from cometnmt.inference import Translator

    words = types.SimpleNamespace(kind="spacy")
    translator = Translator(torch.nn.Linear(1, 1), types.SimpleNamespace(src_tok=words, tgt_tok=words), Config(),
                            torch.device("cpu"))
    with pytest.raises(cometnmt.ConfigError, match=r"^--beam 0: must be at least 1"):
        translator.search_config(beam=0, flags=True)
    with pytest.raises(cometnmt.ConfigError, match=r"^--topk 5: .*sampling.*--sampling"):
        translator.search_config(topk=5, flags=True)
    translator.codec.tgt_tok = types.SimpleNamespace(kind="sentencepiece")
    with pytest.raises(cometnmt.ConfigError, match=r"^--replace-unk: copies source words"):
        translator.search_config(replace_unk=True, flags=True)
    package = pathlib.Path(cometnmt.__file__).parent
    callers = [str(path.relative_to(package)) for path in package.rglob("*.py")
               if re.search(r"translator\._decode\(", path.read_text(encoding="utf-8"))]
    assert callers == [] and not hasattr(Translator, "_decode")


def test_translate_takes_its_search_from_search_config(monkeypatch):
    """Translator.search_config passed its keywords one by one to a private _decode, which translate
    called too: two long signatures of the same ten settings, kept in step by hand. translate now
    asks search_config itself for the search it runs, and search_config keeps its documented
    keywords (help() and inspect show them), the same as translate's."""
    import inspect
    import types

    import torch

    from cometnmt.config import Config, DecodeConfig
    from cometnmt.inference import Translator

    def keywords(method, *besides):
        return [name for name, p in inspect.signature(method).parameters.items()
                if p.kind is p.KEYWORD_ONLY and name not in besides]

    assert keywords(Translator.search_config, "flags") == keywords(Translator.translate, "start") == [
        "beam", "nbest", "length_penalty", "batch_size", "sampling", "topk", "topp", "temperature", "seed", "replace_unk",
        "precision"]
    words = types.SimpleNamespace(kind="spacy")
    translator = Translator(torch.nn.Linear(1, 1), types.SimpleNamespace(src_tok=words, tgt_tok=words), Config(),
                            torch.device("cpu"))
    asked = []
    original = Translator.search_config

    def search_config(self, decode_cfg=None, **settings):
        asked.append((decode_cfg, settings))
        return original(self, decode_cfg, **settings)

    monkeypatch.setattr(Translator, "search_config", search_config)
    given = DecodeConfig(beam_size=3)
    with pytest.raises(cometnmt.ConfigError, match=r"^start=-1: "):  # checked after the search: no model runs
        translator.translate(["Ein Hund."], given, beam=2, topk=None, replace_unk=True, start=-1)
    assert len(asked) == 1 and asked[0][0] is given  # was []: translate called _decode
    assert {key: value for key, value in asked[0][1].items() if value is not None} == {"beam": 2, "replace_unk": True}
    with pytest.raises(cometnmt.ConfigError, match=r"^beam=0: must be at least 1"):
        translator.translate(["Ein Hund."], beam=0)
    assert len(asked) == 2


def test_greedy_search_of_several_hypotheses_is_a_beam_search_everywhere(run_dir, monkeypatch):
    """decode.method greedy with decode.nbest above 1 is a beam search of decode.beam_size
    (documented; translate and serve run one), but Translator.translate_ids took the config as it
    stood: one greedy hypothesis a sentence where translate gave three, and attention without
    targets attended greedy search's output, not translate's best. Both now read the search as
    translate does; validation BLEU (the trainer's greedy translator) stays greedy."""
    import types

    import cometnmt.inference as inference
    from cometnmt.training.trainer import Trainer

    translator = cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device="cpu")
    translator.cfg = dataclasses.replace(translator.cfg, decode=dataclasses.replace(
        translator.cfg.decode, method="greedy", nbest=3, beam_size=4))
    searched = []
    real = inference.search
    monkeypatch.setattr(inference, "search", lambda *a, **k: searched.append(a[5].method) or real(*a, **k))
    sources = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    expected = translator.translate(sources)
    ids = [translator.codec.encode_src(words) for words in translator.codec.src_tok.tokenize_many(sources)]
    got = translator.translate_ids(ids)
    assert [[h.tokens for h in r] for r in got] == [[h.tokens for h in r] for r in expected] and len(got[0]) == 3
    maps = translator.attention(sources)
    assert [m.target[:-1] for m in maps] == [r[0].tokens for r in expected]
    assert searched == ["beam"] * 3
    trainer = types.SimpleNamespace(model=translator.model, codec=translator.codec, cfg=translator.cfg, device=translator.device)
    searched.clear()
    Trainer._greedy_translator(trainer).translate_ids(ids)
    assert searched == ["greedy"]


def test_a_beam_narrower_than_the_default_nbest_names_what_was_given():
    """--beam 1 (or beam=2) on a checkpoint whose decode.nbest is 3 was refused as '--nbest 3: more
    hypotheses than the beam keeps', naming a flag nobody gave; the error names the beam and the
    key the 3 came from."""
    from cometnmt.config import DecodeConfig
    from cometnmt.inference import decode_config

    for flags, beam, needle in ((True, 1, "--beam 1: keeps fewer hypotheses than the default nbest, 3 (decode.nbest); "
                                          "give --nbest 1, or --beam 3 or more"),
                                (False, 2, "beam=2: keeps fewer hypotheses than the default nbest, 3 (decode.nbest); "
                                           "give nbest=1, or beam=3 or more")):
        with pytest.raises(cometnmt.ConfigError, match="^" + re.escape(needle) + "$"):
            decode_config(DecodeConfig(nbest=3), beam=beam, flags=flags)
    assert decode_config(DecodeConfig(nbest=3), beam=1, nbest=1, flags=True).method == "greedy"  # the way out it names
    with pytest.raises(cometnmt.ConfigError, match=r"^sampling=False: greedy search of the default nbest, 8 \(decode.nbest\), "
                                                   r"is a beam search, and the default beam, 2 \(decode.beam_size\)"):
        decode_config(DecodeConfig(method="sample", nbest=8, beam_size=2), sampling=False, flags=False)
    with pytest.raises(cometnmt.ConfigError, match=r"^--nbest 5: more hypotheses than the beam keeps \(2\)"):
        decode_config(DecodeConfig(nbest=3), beam=2, nbest=5, flags=True)  # a given --nbest is still the one named


def test_a_translator_shows_what_it_is(run_dir, translator):
    """A notebook showing `translator` printed <cometnmt.inference.Translator object at 0x...>:
    now the model, languages, size, default search, device and checkpoint(s)."""
    params = sum(p.numel() for p in translator.model.parameters()) / 1e6
    assert repr(translator) == (f"Translator('transformer', de->en, {params:.2f}M parameters, greedy search, "
                                f"device='cpu', checkpoint={str(run_dir / 'best.pt')!r})")
    ensemble = cometnmt.Translator.from_checkpoint([run_dir / "best.pt", run_dir / "last.pt"], device="cpu")
    ensemble.cfg.decode.method, ensemble.cfg.decode.beam_size = "beam", 4
    assert repr(ensemble) == (f"Translator(ensemble of 2, de->en, {2 * params:.2f}M parameters, beam search of 4, "
                              f"device='cpu', checkpoints={[str(run_dir / n) for n in ('best.pt', 'last.pt')]!r})")


def test_evaluate_checkpoint_and_score(run_dir, translator):
    result, out = cometnmt.evaluate_checkpoint(run_dir / "best.pt", "valid", limit=7, device="cpu")
    assert len(out.src) == len(out.refs) == len(out.hyps) == 7 == result["n_sentences"]
    assert out.hyps == translator(out.src)  # the checkpoint's own (greedy) search
    assert result["checkpoints"] == [str((run_dir / "best.pt").resolve())] and result["split"] == "valid" and result["limit"] == 7
    assert result["decode"]["method"] == "greedy"  # what was scored, kept with the scores (evaluate --json)
    again = cometnmt.score(out.hyps, out.refs, lang="en", src=out.src, src_lang="de")
    assert again["bleu"] == result["bleu"] and again["bleu_by_length"] == result["bleu_by_length"]
    _, sampled = cometnmt.evaluate_checkpoint(run_dir / "best.pt", "valid", limit=7, device="cpu", sampling=True,
                                              temperature=1.5, seed=2)
    assert sampled.hyps == translator(out.src, sampling=True, temperature=1.5, seed=2) != out.hyps  # one sample each
    bf16, _ = cometnmt.evaluate_checkpoint(run_dir / "best.pt", "valid", limit=7, device="cpu", precision="bf16")
    assert bf16["decode"]["precision"] == "bf16" and result["decode"]["precision"] == "fp32"
    with pytest.raises(cometnmt.ConfigError, match="split='dev'"):
        cometnmt.evaluate_checkpoint(run_dir / "best.pt", "dev")
    with pytest.raises(TypeError, match="lists of sentences"):
        cometnmt.score("a dog", "a dog")
    with pytest.raises(cometnmt.DataError, match="2 hypotheses but 1 references"):
        cometnmt.score(["a", "b"], ["a"])


def test_translate_split_checks_its_split_and_limit(translator):
    """Translator.translate_split and split_files, public as evaluate_checkpoint is, name a bad
    split or limit as it does (split='dev' was a KeyError 'dev'; limit=-1 translated all but the
    last sentence, as a slice does)."""
    for call in (lambda: translator.translate_split("dev", limit=2), lambda: translator.split_files("dev")):
        with pytest.raises(cometnmt.ConfigError, match=r"^split='dev': choose train, valid or test"):
            call()
    for limit in (-1, 0, 2.0, True):
        with pytest.raises(cometnmt.ConfigError, match=rf"^limit={limit!r}: a number of sentences"):
            translator.translate_split("valid", limit=limit)
    assert len(translator.translate_split("valid", limit=2).hyps) == 2


def test_a_bad_line_of_a_split_names_its_file(translator, tmp_path, monkeypatch):
    """evaluate --checkpoint (translate_split): a test line too long for the model's positions is
    an error naming the file and line (it named neither). A carriage return inside a line is text,
    as in training (before: an error, so a split that validated could not be evaluated)."""
    src, tgt = tmp_path / "test.de", tmp_path / "test.en"
    tgt.write_text("A dog.\nA cat.\n", encoding="utf-8")
    ours = copy.copy(translator)
    ours.cfg = dataclasses.replace(translator.cfg, data=dataclasses.replace(
        translator.cfg.data, corpus="files", test_src=str(src), test_tgt=str(tgt)))
    src.write_text(f"Ein Hund.\n{' '.join(['Hund'] * 1100)}\n", encoding="utf-8")
    with pytest.raises(cometnmt.DataError, match=rf"^{re.escape(str(src))}: input line 2: 1100 source tokens"):
        ours.translate_split("test")
    src.write_text("Ein Hund.\nEine\rKatze.\n", encoding="utf-8", newline="")
    assert ours.translate_split("test").hyps == translator(["Ein Hund.", "Eine Katze."])
    # the training split skips blank pairs: its lines were counted after them ("input line 2" for line 3)
    ours.cfg = dataclasses.replace(ours.cfg, data=dataclasses.replace(
        ours.cfg.data, train_src=str(src), train_tgt=str(tgt), max_train_pairs=None))
    src.write_text(f"Ein Hund.\n\n{' '.join(['Hund'] * 1100)}\n", encoding="utf-8")
    tgt.write_text("A dog.\nA cat.\nA dog.\n", encoding="utf-8")
    with pytest.raises(cometnmt.DataError, match=rf"^{re.escape(str(src))}: input line 3: 1100 source tokens"):
        ours.translate_split("train")
    # evaluate_checkpoint of an empty split (files emptied since training) named no file
    src.write_bytes(b"")
    tgt.write_bytes(b"")
    with monkeypatch.context() as m:
        m.setattr(cometnmt.Translator, "from_checkpoint", classmethod(lambda cls, path, device="auto": ours))
        with pytest.raises(cometnmt.DataError, match=rf"^{re.escape(str(tgt))}: no references in the test split \(an empty file\)"):
            cometnmt.evaluate_checkpoint("unused.pt", split="test")


def test_a_translation_is_one_line(translator, monkeypatch):
    """A line separator in a detokenised output (a SentencePiece piece learned from text holding
    one) becomes a space, so outputs written one per line stay aligned with their inputs."""
    monkeypatch.setattr(type(translator.codec.tgt_tok), "detokenize", lambda self, tokens: "A\rdog\u2028runs\x85.")
    assert translator("Ein Hund.") == "A dog runs ."


def test_a_translation_has_single_spaces(translator, monkeypatch):
    """A lone "▁" piece next to a word (an undertrained SentencePiece model emits them) decoded to
    two spaces, or one at the start; a non-breaking space (French before "?") stays."""
    monkeypatch.setattr(type(translator.codec.tgt_tok), "detokenize", lambda self, tokens: " A  dog\u00a0?   runs. ")
    assert translator("Ein Hund.") == "A dog\u00a0? runs."


def test_average_checkpoints(run_dir, tmp_path, caplog):
    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    paths = cometnmt.last_epoch_checkpoints(run_dir, 1)
    assert [p.name for p in paths] == ["epoch001.pt"]
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        out = cometnmt.average_checkpoints([run_dir / "best.pt", *paths], tmp_path / "avg.pt")
    assert cometnmt.Translator.from_checkpoint(out, device="cpu")("Zwei Hunde.")
    assert [r.getMessage() for r in caplog.records] == [  # the one epoch is also the best: it weighed double
        f"{run_dir / 'best.pt'} and {paths[0]} hold the same weights (step {load_checkpoint(out)['step']}; best.pt is a copy "
        "of its epoch's): the average counts them twice"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cometnmt"):  # another model of the same step: no word
        payload = load_checkpoint(paths[0])
        first = next(k for k, v in payload["model"].items() if v.is_floating_point())
        payload["model"][first] = payload["model"][first] + 1
        save_checkpoint(payload, tmp_path / "changed.pt")
        cometnmt.average_checkpoints([tmp_path / "changed.pt", *paths], tmp_path / "avg2.pt")
    assert not caplog.records
    with pytest.raises(cometnmt.CheckpointError, match=r"^last=3: only 1 epoch checkpoints"):
        cometnmt.last_epoch_checkpoints(run_dir, 3)
    with pytest.raises(cometnmt.CheckpointError, match=r"^last=0: must be an integer at least 1"):
        cometnmt.last_epoch_checkpoints(run_dir, 0)
    with pytest.raises(cometnmt.CheckpointError, match=r"^run_dir=.*: not a folder"):
        cometnmt.last_epoch_checkpoints(tmp_path / "nope", 1)
    with pytest.raises(cometnmt.CheckpointError, match="a list of checkpoint paths"):
        cometnmt.average_checkpoints(str(run_dir / "best.pt"), tmp_path / "x.pt")


def test_averaging_checkpoints_of_different_runs_is_warned_of(run_dir, tmp_path, data_dir, caplog):
    """Two runs of other seeds share every config and vocabulary check, and their average was
    written without a word, though separately trained weights do not average into a working model.
    Each run's checkpoints now carry its id (kept by a resume), and average warns of several."""
    from cometnmt.training.checkpoint import load_checkpoint

    other = tmp_path / "seed2"
    cometnmt.train(tiny_train_cfg(other, data_dir, "train.keep_checkpoints=2", "train.num_threads=1", "train.seed=2"))
    mine, theirs = run_dir / "epoch001.pt", other / "epoch001.pt"
    assert re.fullmatch(r"[0-9a-f]{32}", load_checkpoint(mine)["run_id"])
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        cometnmt.average_checkpoints([mine, theirs, run_dir / "best.pt"], tmp_path / "avg.pt")
    assert f"the checkpoints are of 2 training runs ({mine} and {theirs} are of different ones)" in caplog.text
    caplog.clear()
    cometnmt.train(tiny_train_cfg(other, data_dir, "train.keep_checkpoints=2", "train.num_threads=1", "train.seed=2",
                                  "train.max_epochs=2"), resume=True)
    assert load_checkpoint(other / "epoch002.pt")["run_id"] == load_checkpoint(theirs)["run_id"]
    with caplog.at_level(logging.WARNING, logger="cometnmt"):  # one run, resumed: no word
        cometnmt.average_checkpoints([theirs, other / "epoch002.pt"], tmp_path / "avg2.pt")
    assert "training runs" not in caplog.text


def test_the_last_epoch_checkpoints_are_the_newest_past_epoch_999(tmp_path):
    """epoch999.pt, epoch1000.pt, ...: sorted by name, epoch1000.pt came first, so --last 2
    averaged epochs 998 and 999 and left out the newest; a file of another name is no epoch."""
    for epoch in (997, 998, 999, 1000, 1001):
        (tmp_path / f"epoch{epoch:03d}.pt").write_bytes(b"")
    (tmp_path / "epoch_avg.pt").write_bytes(b"")
    assert [p.name for p in cometnmt.last_epoch_checkpoints(tmp_path, 3)] == ["epoch999.pt", "epoch1000.pt", "epoch1001.pt"]
    with pytest.raises(cometnmt.CheckpointError, match=r"^last=6: only 5 epoch checkpoints"):
        cometnmt.last_epoch_checkpoints(tmp_path, 6)


def test_averaging_is_the_mean_of_one_models_weights(run_dir, tmp_path):
    """average_checkpoints: the element-wise mean of the weights, whatever the dropout; weights of
    the same shapes under another model config (4 heads or 2 share their matrices' shapes) are
    refused, naming the key: averaged and run as the last file's model, they were neither model."""
    import torch

    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(run_dir / "best.pt")
    config = copy.deepcopy(payload["config"])
    config["model"]["dropout"] = 0.3  # training only: these still average
    doubled = {**payload, "config": config, "model": {k: v * 2 if v.is_floating_point() else v
                                                      for k, v in payload["model"].items()}}
    save_checkpoint(doubled, tmp_path / "doubled.pt")
    avg = load_checkpoint(cometnmt.average_checkpoints([tmp_path / "doubled.pt", run_dir / "best.pt"], tmp_path / "avg.pt"))
    for key, value in payload["model"].items():
        assert torch.equal(avg["model"][key], value * 1.5 if value.is_floating_point() else value), key
    assert avg["config"] == payload["config"]  # the last file's
    config = copy.deepcopy(payload["config"])
    config["model"]["n_heads"] = payload["config"]["model"]["n_heads"] // 2
    save_checkpoint({**payload, "config": config}, tmp_path / "heads.pt")
    with pytest.raises(cometnmt.CheckpointError, match=r"heads.pt: its model differs from that of .*best.pt in "
                                                       r"model.n_heads \(2, 4 in .*best.pt\); only checkpoints of one run"):
        cometnmt.average_checkpoints([tmp_path / "heads.pt", run_dir / "best.pt"], tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_a_checkpoint_finds_its_relative_data_paths_from_anywhere(tmp_path, data_dir, monkeypatch):
    """data.corpus=files with paths relative to the folder a run was trained in: evaluating the
    checkpoint from another folder reads the same files (it failed with 'file not found')."""
    import gzip

    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("de", "en"):
            with gzip.open(data_dir / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(200 if split == "train" else 12)]
            (work / "data" / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    files = [f"data.{split}_{side}=data/{split}.{lang}" for split in ("train", "valid", "test")
             for side, lang in (("src", "de"), ("tgt", "en"))]
    monkeypatch.chdir(work)
    cometnmt.train(tiny_train_cfg("run", data_dir, "data.corpus=files", *files, "train.num_threads=1"))
    here, _ = cometnmt.evaluate_checkpoint("run/best.pt", "test", device="cpu")
    monkeypatch.chdir(tmp_path)
    there, out = cometnmt.evaluate_checkpoint(work / "run" / "best.pt", "test", device="cpu")
    assert there == here and len(out.refs) == 12
    avg = cometnmt.average_checkpoints([work / "run" / "best.pt"], tmp_path / "avg.pt")
    averaged = cometnmt.evaluate_checkpoint(avg, "test", device="cpu")[0]  # averaging keeps the anchor
    assert averaged.pop("checkpoints") == [str(avg.resolve())]
    assert here.pop("checkpoints") == [str((work / "run" / "best.pt").resolve())]
    assert averaged == here

    # hyp_out/json_out onto the split's own files: before, --hyp-out wrote over the reference
    reference = (work / "data" / "test.en").read_bytes()
    for kwargs, needle in (({"hyp_out": work / "data" / "test.en"}, "hyp_out=.*test.en and the test split's reference "),
                           ({"json_out": work / "data" / "test.de"}, "json_out=.*test.de and the test split's source "),
                           ({"hyp_out": avg}, "hyp_out=.*avg.pt and checkpoint=.*avg.pt: the same file")):
        with pytest.raises(cometnmt.CometNMTError, match=needle):
            cometnmt.evaluate_checkpoint(avg, "test", device="cpu", **kwargs)
    assert (work / "data" / "test.en").read_bytes() == reference
    result, out = cometnmt.evaluate_checkpoint(avg, "test", device="cpu", hyp_out=tmp_path / "h.txt", json_out=tmp_path / "r.json")
    assert (tmp_path / "h.txt").read_text(encoding="utf-8") == "".join(h + "\n" for h in out.hyps)
    assert json.loads((tmp_path / "r.json").read_text())["bleu"] == result["bleu"]


def test_a_multi30k_folder_beside_corpus_files_is_named(tmp_path, data_dir, caplog):
    """data.multi30k_dir set beside data.corpus files is read by nothing (relative file paths are not
    taken from it either), and training said nothing of it. train warns, naming both keys; nothing
    is said without the key, nor of $COMETNMT_MULTI30K_DIR (a machine's setting, which tests set)."""
    files = _files(tmp_path, data_dir)
    assert os.environ.get("COMETNMT_MULTI30K_DIR")
    for save, folder, warned in (("a", [f"data.multi30k_dir={data_dir}"], True), ("b", [], False)):
        caplog.clear()
        cfg = tiny_train_cfg(tmp_path / save, data_dir, *files, *folder, "train.max_steps=1", "train.num_threads=1")
        assert (cfg.data.multi30k_dir is not None) == warned
        with caplog.at_level(logging.WARNING, logger="cometnmt"):
            cometnmt.train(cfg)
        found = [r.getMessage() for r in caplog.records if "data.multi30k_dir" in r.getMessage()]
        assert found == ([f"config key 'data.multi30k_dir' is set ({str(data_dir)!r}) but unused: data.corpus is 'files', "
                          "which reads the data.<split>_src/_tgt files (relative paths from the current folder, not from "
                          "that one); remove the key (or null it) to silence this"] if warned else [])
        assert ("data.multi30k_dir" in (tmp_path / save / "train.log").read_text(encoding="utf-8")) == warned


def _files(tmp_path, data_dir, n_train=60, n_valid=6):
    """A data.corpus=files copy of the first Multi30k lines; returns the --set overrides."""
    import gzip

    out = []
    for split, name, n in (("train", "train", n_train), ("valid", "val", n_valid)):
        for side, lang in (("src", "de"), ("tgt", "en")):
            with gzip.open(data_dir / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            path = tmp_path / f"{split}.{lang}"
            path.write_text("".join(lines), encoding="utf-8")
            out.append(f"data.{split}_{side}={path}")
    return ["data.corpus=files", *out]


def test_data_that_cannot_train_is_refused_before_training(tmp_path, data_dir):
    """Each of these trained a full epoch first (and then crashed in validation, or wrote an
    untrained best.pt as a success)."""
    files = _files(tmp_path, data_dir)
    with pytest.raises(cometnmt.DataError, match=r"train.de: no training pairs left of 60 read \(.*data.max_len=1"):
        cometnmt.train(tiny_train_cfg(tmp_path / "a", data_dir, *files, "data.max_len=1"))
    with pytest.raises(cometnmt.ConfigError, match=r"'data.max_len' and 'model.max_positions': 30 tokens \(\+2 for <s> </s> around sources\) exceed the model's 31"):
        cometnmt.train(tiny_train_cfg(tmp_path / "b", data_dir, *files, "data.max_len=30", "data.src_sos_eos=true",
                                      "model.max_positions=31"))
    long_line = " ".join(["Hund"] * 40)
    valid = tmp_path / "valid.de"
    valid.write_text(valid.read_text(encoding="utf-8") + long_line + "\n", encoding="utf-8")
    (tmp_path / "valid.en").write_text((tmp_path / "valid.en").read_text(encoding="utf-8") + "dog\n", encoding="utf-8")
    with pytest.raises(cometnmt.DataError, match=r"valid.de:7: 40 positions, more than the model's 32"):
        cometnmt.train(tiny_train_cfg(tmp_path / "c", data_dir, *files, "data.max_len=20", "model.max_positions=32"))
    for name in ("a", "b", "c"):
        assert not (tmp_path / name / "best.pt").exists()


def test_a_byte_order_mark_is_not_text(tmp_path, data_dir):
    from cometnmt.data.corpus import read_lines

    bom = tmp_path / "bom.en"
    bom.write_bytes("\ufeffA dog runs.\nTwo cats.\n".encode("utf-8"))
    assert read_lines(bom) == ["A dog runs.", "Two cats."]
    assert cometnmt.score(read_lines(bom), ["A dog runs.", "Two cats."])["bleu"] == pytest.approx(100.0)
    # saved twice with a mark, and two such files concatenated: every mark opening a line goes,
    # one inside a line (not a mark there) stays
    twice = tmp_path / "twice.en"
    twice.write_bytes("\ufeff\ufeffA dog runs.\r\n\ufeffTwo cats.\nA\ufeffB\n".encode("utf-8"))
    assert read_lines(twice) == ["A dog runs.", "Two cats.", "A\ufeffB"]


def test_a_byte_order_mark_opening_a_sentence_is_not_text_to_the_translator(translator):
    # the file readers drop it (above), the API took it for text: a first line read with
    # open(path, encoding="utf-8") kept it, and its first word became "\ufeffEin", <unk> to the model
    plain, targets = ["Ein Mann fährt Fahrrad.", "Zwei Hunde."], ["A man rides a bike.", "Two dogs."]
    marked = ["\ufeff" + plain[0], "\ufeff\ufeff" + plain[1]]
    assert translator.translate(marked, beam=2, nbest=2) == translator.translate(plain, beam=2, nbest=2)
    assert translator.log_prob(marked, ["\ufeff" + targets[0], targets[1]]) == translator.log_prob(plain, targets)
    assert [m.source for m in translator.attention(marked, targets)] == [m.source for m in translator.attention(plain, targets)]
    assert translator(["\ufeff", "A\ufeffB"]) == ["", translator("A\ufeffB")]  # a mark alone is a blank line


def test_a_blank_line_is_not_decoded(translator, monkeypatch):
    """A blank line has nothing to translate: its nbest translations are blank, score 0, and no
    search runs for it (docs/translation.md: translate leaves it blank, undecoded). It was searched from a
    source of </s> alone, a whole beam search up to the length bound, and the output dropped. A
    line's translations and samples do not depend on the blank lines beside it."""
    import cometnmt.inference as inference

    searched = []

    def counting(model, src, src_pad_mask, *args, **kwargs):
        searched.append(src.size(0))  # sentences in this search
        return real(model, src, src_pad_mask, *args, **kwargs)

    real = inference.search
    monkeypatch.setattr(inference, "search", counting)
    texts = ["", "Ein Hund läuft.", " \t ", "Zwei Männer."]
    results = translator.translate(texts, beam=3, nbest=2)
    assert sum(searched) == 2  # before: 4
    assert [[(h.text, h.score, h.tokens) for h in results[i]] for i in (0, 2)] == [[("", 0.0, [])] * 2] * 2
    assert [h.text for h in results[1] + results[3]] == \
           [h.text for r in translator.translate([texts[1], texts[3]], beam=3, nbest=2) for h in r]
    searched.clear()
    assert translator.translate_ids([[]], translator.search_config(nbest=3)) == [[inference.Translation("", 0.0, [])] * 3]
    assert searched == []
    sampled = translator.translate(texts, sampling=True, seed=5, nbest=2)  # keyed by place, blank lines counted
    alone = translator.translate(texts[3:], sampling=True, seed=5, nbest=2, start=3)[0]
    assert [h.tokens for h in sampled[3]] == [h.tokens for h in alone]


def test_sentences_not_in_nfc_are_warned_about_as_the_file_readers_warn(translator, caplog):
    """The file readers warn of text not in Unicode NFC (decomposed accents, as macOS writes
    them: its words are not the vocabulary's); the Python API took such sentences without a word.
    Translator.translate, log_prob and attention now warn once for each argument holding any,
    naming it, how many and the first; text the readers read (the commands) is not warned twice."""
    import unicodedata

    from cometnmt.inference import read_from_files

    nfd = unicodedata.normalize("NFD", "Ein Mädchen läuft.")
    sources, targets = ["Zwei Hunde.", nfd, nfd], ["Two dogs.", "A girl runs.", "A girl runs."]

    def warned(call) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cometnmt"):
            call()
        return [r.getMessage() for r in caplog.records if "NFC" in r.getMessage()]

    (message,) = warned(lambda: translator.translate(sources))
    assert message.startswith("Translator.translate texts: 2 sentences are not in Unicode NFC (first: sentence 2)")
    assert "unicodedata.normalize('NFC', text)" in message
    (message,) = warned(lambda: translator.log_prob(sources, targets))
    assert message.startswith("Translator.log_prob sources: 2 sentences are not in Unicode NFC (first: sentence 2)")
    assert warned(lambda: translator.attention(targets, sources[:2] + ["Zwei Hunde."])) == [
        "Translator.attention targets: 1 sentence is not in Unicode NFC (first: sentence 2)" + message.split("(first: sentence 2)")[1]]
    assert warned(lambda: translator(unicodedata.normalize("NFC", nfd))) == []
    with read_from_files():
        assert warned(lambda: translator.translate(sources)) == []
    from cometnmt.cli import _translate_chunk  # translate -i's chunks: its reader warned, naming the file

    assert warned(lambda: _translate_chunk(translator, None, False, sources, 0, "in.de", None)) == []


def test_averaging_into_a_folder_is_refused_first(run_dir, tmp_path):
    with pytest.raises(cometnmt.CheckpointError, match=f"{tmp_path}: is a directory"):
        cometnmt.average_checkpoints([run_dir / "best.pt"], tmp_path)


def test_averaging_over_an_input_is_refused(tmp_path):
    """average_checkpoints(paths, out) with out one of paths (or a link to one) replaced that
    checkpoint; a trainer's name in the run's folder (best.pt, epochNNN.pt) replaced or joined the
    run's own checkpoints. Refused naming the keywords, before anything is loaded."""
    run = tmp_path / "run"
    run.mkdir()
    paths = [run / "epoch001.pt", run / "epoch002.pt"]
    for p in [*paths, run / "best.pt"]:
        p.write_bytes(b"PK\x03\x04 dummy")
    (tmp_path / "link.pt").symlink_to(paths[1])
    with pytest.raises(cometnmt.CheckpointError, match=r"^output=\S+epoch002.pt and paths\[1\]=\S+epoch002.pt: the same file"):
        cometnmt.average_checkpoints(paths, str(run / "." / "epoch002.pt"))
    with pytest.raises(cometnmt.CheckpointError, match=r"^output=\S+link.pt and paths\[1\]=\S+: the same file"):
        cometnmt.average_checkpoints(paths, tmp_path / "link.pt")
    for name in ("best.pt", "last.pt", "epoch003.pt"):
        with pytest.raises(cometnmt.CheckpointError, match=rf"^output=\S+{name}: a name the trainer gives the run's own"):
            cometnmt.average_checkpoints(paths, run / name)
    other = tmp_path / "other"  # another run's folder: its last.pt is what its --resume continues from
    other.mkdir()
    (other / "last.pt").write_bytes(b"PK\x03\x04 other")
    with pytest.raises(cometnmt.CheckpointError, match=rf"^output=\S+last.pt: a name the trainer gives the run's own "
                                                       rf"checkpoints, in {other}, another run's folder"):
        cometnmt.average_checkpoints(paths, other / "last.pt")  # before: replaced, with no training state
    assert all(p.read_bytes() == b"PK\x03\x04 dummy" for p in [*paths, run / "best.pt"])
    assert (other / "last.pt").read_bytes() == b"PK\x03\x04 other"
    with pytest.raises(cometnmt.CheckpointError, match="not a readable cometnmt checkpoint"):  # avg.pt: its own name
        cometnmt.average_checkpoints(paths, run / "avg.pt")
    with pytest.raises(cometnmt.CheckpointError, match="not a readable cometnmt checkpoint"):  # best.pt where no run is
        cometnmt.average_checkpoints(paths, tmp_path / "serve" / "best.pt")


def test_sentencepiece_models_of_languages_spacy_cannot_tokenise(tmp_path, data_dir, monkeypatch, caplog):
    """The paper metric needs spaCy's tokenizer of the target language; a SentencePiece model of
    another language trains and validates on BLEU and chrF (before: an error at start), and
    evaluate scores it on BLEU and chrF too, saying why before it decodes (before: an error)."""
    files = _files(tmp_path, data_dir)
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, *files, "data.tokenizer=sentencepiece", "data.sp_vocab_size=200",
                         "data.tgt_lang=foo", "train.valid_bleu=true")
    with caplog.at_level("WARNING"):
        cometnmt.train(cfg)
    assert "spaCy has no tokenizer for language 'foo'" in caplog.text
    [valid] = [h for h in load_history(tmp_path / "run") if h["event"] == "valid"]
    assert "val_bleu" in valid and "val_paper_bleu" not in valid
    caplog.clear()
    decode = cometnmt.Translator.translate_split

    def warned_first(*args, **kwargs):
        assert "spaCy has no tokenizer for language 'foo'" in caplog.text, "decoded before saying why"
        return decode(*args, **kwargs)

    monkeypatch.setattr(cometnmt.Translator, "translate_split", warned_first)
    with caplog.at_level("WARNING"):
        result, out = cometnmt.evaluate_checkpoint(tmp_path / "run" / "best.pt", "valid", device="cpu")
    assert result["bleu"] == cometnmt.score(out.hyps, out.refs, lang="en")["bleu"]
    assert "paper_bleu" not in result and "bleu_by_length" not in result
    assert result["not_computed"] == "the COMET paper's metric and BLEU by length: spaCy cannot tokenise 'foo'"


def test_score_without_spacy_for_a_language(caplog):
    """score() of a language spaCy cannot tokenise gives BLEU and chrF and says what is missing;
    the table shows it; without the source language's tokenizer only BLEU by length is left out
    (lengths in the target language's tokens would be wrong), and misaligned sources still fail."""
    from cometnmt.evaluation import format_table

    hyps, refs, src = ["A dog runs .", "Two cats ."], ["A dog runs .", "Two cats sleep ."], ["x y z", "x y"]
    with caplog.at_level("WARNING"):
        result = cometnmt.score(hyps, refs, lang="foo")
    assert "spaCy has no tokenizer for language 'foo'" in caplog.text
    assert result["bleu"] == cometnmt.score(hyps, refs, lang="en")["bleu"] and "paper_bleu" not in result
    assert "paper BLEU" not in format_table(result) and "spaCy cannot tokenise 'foo'" in format_table(result)
    assert result["not_computed"] == "the COMET paper's metric: spaCy cannot tokenise 'foo'"  # no sources: no BLEU by length asked
    assert cometnmt.score(hyps, refs, lang="foo", src=src, src_lang="en")["not_computed"] == \
        "the COMET paper's metric and BLEU by length: spaCy cannot tokenise 'foo'"
    with_src = cometnmt.score(hyps, refs, lang="en", src=src, src_lang="foo")
    assert "paper_bleu" in with_src and "bleu_by_length" not in with_src
    assert with_src["not_computed"] == "BLEU by length: spaCy cannot tokenise 'foo'"
    with pytest.raises(cometnmt.DataError, match="got 1 source sentences but 2 references"):
        cometnmt.score(hyps, refs, lang="en", src=src[:1], src_lang="foo")


def load_history(run):
    import json

    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def test_a_run_folder_is_not_a_checkpoint(run_dir):
    with pytest.raises(cometnmt.CheckpointError, match=r"is a folder, not a checkpoint file \(best.pt or last.pt in it\?\)"):
        cometnmt.Translator.from_checkpoint(run_dir)


def test_a_lowercased_model_is_scored_on_lowercased_references(tmp_path, data_dir):
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, "data.lowercase=true", "train.valid_bleu=true",
                         "data.max_valid_pairs=8", "train.num_threads=1")
    cometnmt.train(cfg)
    [valid] = [h for h in load_history(tmp_path / "run") if h["event"] == "valid"]
    assert "case:lc" in valid["bleu_signature"]
    result, out = cometnmt.evaluate_checkpoint(tmp_path / "run" / "best.pt", "valid", device="cpu")
    assert "case:lc" in result["bleu_signature"] and result["paper_bleu_label"].endswith("lowercased")
    assert result["bleu"] == cometnmt.score(out.hyps, out.refs, lowercase=True)["bleu"]


def test_a_length_penalty_under_greedy_search_is_warned_about(translator, caplog):
    with caplog.at_level("WARNING"):
        translator("Zwei Hunde.", length_penalty=0.5)
    assert "length_penalty=0.5: greedy search has no length penalty" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        translator("Zwei Hunde.", beam=3, length_penalty=0.5)
    assert "length penalty" not in caplog.text


def test_translator_checks_each_sentence(translator):
    with pytest.raises(TypeError, match="sentence 2 is an int, not a string"):
        translator(["Ein Hund.", 3])
    # bytes were iterated as numbers ("sentence 1 is an int"); None was "not iterable"
    with pytest.raises(TypeError, match=r"^Translator.translate: texts is bytes; decode it"):
        translator(b"Ein Hund.")
    with pytest.raises(TypeError, match=r"^Translator.translate: texts must be a list of sentences, got a NoneType"):
        translator.translate(None)
    with pytest.raises(TypeError, match=r"^Translator.log_prob: targets must be a list of sentences, got an int"):
        translator.log_prob(["Ein Hund."], 5)
    with pytest.raises(TypeError, match=r"^Translator.attention: sources is bytes"):
        translator.attention(b"Ein Hund.")
    # a dict was iterated as its keys ("id1" translated), a set in no order the results could be matched by
    with pytest.raises(TypeError, match=r"^Translator.translate: texts is a dict; give a list of sentences \(list\(d.values"):
        translator.translate({"id1": "Ein Hund."})
    with pytest.raises(TypeError, match=r"^Translator.log_prob: sources is a set, which has no order"):
        translator.log_prob({"Ein Hund."}, ["A dog."])
    with pytest.raises(cometnmt.DataError, match="sentence 1 holds a newline"):
        translator("Ein Hund.\nZwei Katzen.")
    with pytest.raises(cometnmt.DataError, match="lone surrogate at column 3"):
        translator("Ei\ud800n")
    assert translator([]) == [] and translator(s for s in ["Ein Hund."]) == [translator("Ein Hund.")]


def test_translator_refuses_a_nul_character_as_the_file_readers_do(translator):
    """A UTF-16 file without a byte order mark read with open(path, encoding="utf-8") gives strings
    full of NUL characters ("A\\x00 \\x00d\\x00..."), which the Translator translated without a word
    while the file readers refuse them. Each method now refuses a sentence holding one, naming it,
    the column and the likely cause."""
    utf16 = "A dog runs.".encode("utf-16-le").decode("utf-8")  # read as UTF-8: valid, NULs between the letters
    needle = r"holds a NUL character \(U\+0000\) at column 2, which never belongs in text: UTF-16 decoded as UTF-8\?"
    with pytest.raises(cometnmt.DataError, match=rf"^sentence 2 {needle}"):
        translator(["Ein Hund.", utf16])
    with pytest.raises(cometnmt.DataError, match=rf"^sentence 1 {needle}"):
        translator.log_prob(["Ein Hund."], [utf16])
    with pytest.raises(cometnmt.DataError, match=rf"^sentence 1 {needle}"):
        translator.attention([utf16])
    with pytest.raises(cometnmt.DataError, match=r"encoding='utf-16-be'\), or convert the file with iconv -f UTF-16BE"):
        translator("A dog runs.".encode("utf-16-be").decode("utf-8"))  # the byte order its bytes show


def test_api_arguments_python_callers_pass(run_dir, tmp_path, data_dir):
    import torch

    before = torch.get_num_threads()
    cfg = tiny_train_cfg("unused", data_dir, "train.num_threads=1", "data.max_train_pairs=60")
    cfg.train.save_dir = tmp_path / "as_path"  # a pathlib.Path is taken as its string
    torch.set_num_threads(2)
    cometnmt.train(cfg)
    assert torch.get_num_threads() == 2 and (tmp_path / "as_path" / "best.pt").exists()  # the caller's setting is back
    torch.set_num_threads(before)
    for device in (None, "mps", "meta"):
        with pytest.raises(cometnmt.ConfigError, match="device="):
            cometnmt.Translator.from_checkpoint(run_dir / "best.pt", device=device)
    with pytest.raises(TypeError, match=r"hyps\[0\] is a list, not a string \(Translator.translate gives"):
        cometnmt.score([[1]], ["a"])
    with pytest.raises(cometnmt.CheckpointError, match="given twice"):
        cometnmt.average_checkpoints([run_dir / "best.pt", str(run_dir / "best.pt")], tmp_path / "avg.pt")
    os.link(run_dir / "best.pt", tmp_path / "hard.pt")  # another name of the same file
    with pytest.raises(cometnmt.CheckpointError, match="given twice"):
        cometnmt.average_checkpoints([run_dir / "best.pt", tmp_path / "hard.pt"], tmp_path / "avg.pt")
    # a generator was read up by the duplicate check, leaving nothing to average
    out = cometnmt.average_checkpoints((p for p in [run_dir / "best.pt", run_dir / "last.pt"]), tmp_path / "avg.pt")
    assert cometnmt.Translator.from_checkpoint(out, device="cpu")("Zwei Hunde.")


def test_a_decode_config_given_to_translate_is_checked(translator):
    """Translator.translate(texts, decode_cfg): a DecodeConfig of the caller's is checked as a
    config's decode section (beam_size=0 was "nbest=1: more hypotheses than the beam keeps (0)",
    naming a keyword not given); anything else is a TypeError (a dict was "asdict() should be
    called on dataclass instances")."""
    decode = translator.cfg.decode
    for changes, message in (({"method": "beam", "beam_size": 0}, "'decode.beam_size': must be at least 1, got 0"),
                             ({"batch_sentences": 0}, "'decode.batch_sentences': must be at least 1, got 0"),
                             ({"method": "beam", "beam_size": 2, "nbest": 3}, "'decode.nbest': 3 exceeds decode.beam_size=2"),
                             ({"temperature": 0.0}, "'decode.temperature'")):
        with pytest.raises(cometnmt.ConfigError, match=rf"^config key {re.escape(message)}"):
            translator.translate(["Ein Hund."], dataclasses.replace(decode, **changes))
    with pytest.raises(TypeError, match="decode_cfg must be a cometnmt.config.DecodeConfig .*got a dict"):
        translator.translate(["Ein Hund."], {"method": "beam"})
    beam = dataclasses.replace(decode, method="beam", beam_size=3, nbest=2)
    assert translator.translate(["Ein Hund."], beam) == translator.translate(["Ein Hund."], beam=3, nbest=2)


def test_numpy_numbers_are_taken_as_the_numbers_they_hold(run_dir, translator):
    """A sweep over np.arange or a NumPy array hands the API NumPy scalars: np.int64(2) was refused
    as "beam=np.int64(2): must be an integer", np.float32 as "must be a number"; bools stay refused."""
    np = pytest.importorskip("numpy")
    text = ["Zwei Hunde spielen im Schnee."]
    assert translator(text, beam=np.int64(2), length_penalty=np.float32(0.5)) == translator(text, beam=2, length_penalty=0.5)
    assert translator.translate(text, beam=np.int32(3), nbest=np.int64(2), batch_size=np.uint8(4)) == \
        translator.translate(text, beam=3, nbest=2, batch_size=4)
    sampled = dict(sampling=True, topk=np.int64(5), topp=np.float32(0.5), temperature=np.float16(2), seed=np.int64(3))
    assert translator(text, **sampled) == translator(text, sampling=True, topk=5, topp=0.5, temperature=2.0, seed=3)
    amap = translator.attention(text, layer=np.int64(0))[0]
    assert amap.layer == 0 and type(amap.layer) is int
    result, _ = cometnmt.evaluate_checkpoint(run_dir / "best.pt", "valid", limit=np.int64(2), device="cpu")
    assert result["limit"] == 2 and type(result["limit"]) is int  # json-serialisable
    assert len(cometnmt.last_epoch_checkpoints(run_dir, np.int64(1))) == 1
    with pytest.raises(cometnmt.ConfigError, match=r"^beam=np.True_: must be an integer"):
        translator(text, beam=np.bool_(True))
    with pytest.raises(cometnmt.ConfigError, match=r"^beam=0: must be at least 1"):
        translator(text, beam=np.int64(0))


def test_start_is_a_place_in_the_input(translator):
    """translate's ``start`` (a piece's place in a longer input, for seeded samples): "x" was a
    TypeError from an addition and -5 was taken; a NumPy integer is the integer it holds."""
    text = ["Ein Hund.", "Zwei Katzen schlafen."]
    def texts(results):  # the scores may differ in the last bits with the batch
        return [[h.text for h in hyps] for hyps in results]

    whole = texts(translator.translate(["Ein Mann."] + text, sampling=True, seed=7))
    assert texts(translator.translate(text, sampling=True, seed=7, start=1)) == whole[1:]
    assert texts(translator.translate(text, sampling=True, seed=7)) != whole[1:]  # the place matters
    np = pytest.importorskip("numpy")
    assert texts(translator.translate(text, sampling=True, seed=7, start=np.int64(1))) == whole[1:]
    for start in ("x", -5, 1.0, True):
        with pytest.raises(cometnmt.ConfigError, match=rf"^start={re.escape(repr(start))}: must be an integer at least 0"):
            translator.translate(text, sampling=True, seed=7, start=start)


def test_an_ensemble_of_checkpoints(run_dir, translator, tmp_path, cli):
    """Several checkpoints are one Translator (their probabilities averaged): a checkpoint with
    itself translates as it does alone; checkpoints whose vocabularies differ are refused naming
    the file; `translate` and `evaluate --checkpoint` take several."""
    import torch

    from cometnmt.models.ensemble import Ensemble

    sents = ["Ein Hund läuft.", "Zwei Kinder spielen im Park."]
    twice = cometnmt.Translator.from_checkpoint([run_dir / "best.pt", run_dir / "best.pt"], device="cpu")
    assert isinstance(twice.model, Ensemble) and twice(sents, beam=3) == translator(sents, beam=3)
    pair = cometnmt.Translator.from_checkpoint([run_dir / "best.pt", run_dir / "epoch001.pt"], device="cpu")
    assert len(pair(sents)) == 2
    other = torch.load(run_dir / "best.pt", weights_only=True)
    other["codec"]["src_vocab"]["itos"] = other["codec"]["src_vocab"]["itos"][:4] + other["codec"]["src_vocab"]["itos"][4:][::-1]
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(cometnmt.CheckpointError, match=r"other.pt: its source vocabulary differs from those of"):
        cometnmt.Translator.from_checkpoint([run_dir / "best.pt", tmp_path / "other.pt"], device="cpu")
    other = torch.load(run_dir / "best.pt", weights_only=True)
    other["codec"]["src_sos_eos"] = True  # was blamed on the vocabularies or tokenizers
    torch.save(other, tmp_path / "other.pt")
    with pytest.raises(cometnmt.CheckpointError, match=r"other.pt: its <s> </s> around sources \(data.src_sos_eos\) differs"):
        cometnmt.Translator.from_checkpoint([run_dir / "best.pt", tmp_path / "other.pt"], device="cpu")
    src = tmp_path / "src.de"
    src.write_text("\n".join(sents) + "\n", encoding="utf-8")
    out = cli("translate", str(run_dir / "best.pt"), str(run_dir / "best.pt"), "-i", str(src), "--device", "cpu").stdout
    assert out.splitlines() == translator(sents)
    assert "BLEU" in cli("evaluate", "--checkpoint", str(run_dir / "best.pt"), str(run_dir / "epoch001.pt"),
                         "--split", "valid", "--device", "cpu").stdout


def test_log_prob_is_forced_decoding(run_dir, translator):
    """Translator.log_prob scores given translations: on the validation pairs its nats per token
    are the trainer's validation loss of the same weights; it does not depend on the batch, and an
    ensemble of a model with itself scores as the model (test_decoding: it equals search scores)."""
    import json

    from cometnmt.data.pipeline import read_split

    valid = read_split(translator.cfg.data, "valid")
    scores = translator.log_prob(valid.src[:20], valid.tgt[:20])  # the run validated on 20 pairs (tiny_train_cfg)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val_loss = [r["val_loss"] for r in records if r["event"] == "valid"][-1]  # one epoch: best.pt's weights
    assert -sum(s.log_prob for s in scores) / sum(s.tokens for s in scores) == pytest.approx(val_loss, rel=1e-5)
    assert all(s.tokens >= 2 and 0 <= s.unknown < s.tokens for s in scores)
    singly = translator.log_prob(valid.src[:20], valid.tgt[:20], batch_size=1)
    assert [s.log_prob for s in singly] == pytest.approx([s.log_prob for s in scores], abs=1e-4)
    twice = cometnmt.Translator.from_checkpoint([run_dir / "best.pt", run_dir / "best.pt"], device="cpu")
    assert [s.log_prob for s in twice.log_prob(valid.src[:5], valid.tgt[:5])] == \
           pytest.approx([s.log_prob for s in scores[:5]], abs=1e-4)
    empty = translator.log_prob(["Ein Hund."], [""])[0]  # the probability of stopping at once
    assert empty.tokens == 1 and empty.log_prob < 0
    with pytest.raises(cometnmt.DataError, match="2 sources but 1 targets"):
        translator.log_prob(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="lists of sentences; targets is one string"):
        translator.log_prob(["Ein Hund."], "A dog.")
    with pytest.raises(cometnmt.DataError, match=r"^target line 2: 1100 target tokens and <s>, more than the model's"):
        translator.log_prob(["Ein Hund.", "Ein Hund."], ["A dog.", " ".join(["dog"] * 1100)])


def test_log_prob_and_attention_check_their_batch_size(translator):
    """batch_size=-1 made no batches: log_prob returned 0.0 for every pair, attention None for
    every map; 0 was taken for the default. Refused by name, as translate refuses it."""
    for bad, message in ((-1, "batch_size=-1: must be at least 1"), (0, "batch_size=0: must be at least 1"),
                         (2.5, "batch_size=2.5: must be an integer")):
        with pytest.raises(cometnmt.ConfigError, match=re.escape(message)):
            translator.log_prob(["Ein Hund."], ["A dog."], batch_size=bad)
        with pytest.raises(cometnmt.ConfigError, match=re.escape(message)):
            translator.attention(["Ein Hund."], ["A dog."], batch_size=bad)
        with pytest.raises(cometnmt.ConfigError, match=re.escape(message)):
            translator.attention(["Ein Hund."], batch_size=bad)
    with pytest.raises(cometnmt.ConfigError, match=re.escape("--batch-size -1: must be at least 1")):
        translator.attention(["Ein Hund."], batch_size=-1, flags=True)
    assert translator.log_prob(["Ein Hund."], ["A dog."], batch_size=1)[0].log_prob < 0


def test_log_prob_of_translations_is_their_search_score(translator):
    """Forced decoding of translate's own n-best texts (detokenised, then tokenised again, as
    logprob --nbest-input reads them) gives beam search's scores (length penalty 0), for
    hypotheses of the unknown word too (its text "<unk>" was read back as "<", "unk", ">")."""
    import torch

    from cometnmt.data.vocab import EOS

    model = copy.deepcopy(translator.model)  # the one-epoch model never stops by itself: make it
    with torch.no_grad():
        model.out_proj.bias[EOS] += 2.0
    stopping = cometnmt.Translator(model, translator.codec, translator.cfg, translator.device)
    sources = ["Ein Mann mit einem Zzyzxqw-Hut läuft über die Straße.", "Zwei Hunde spielen im Schnee."]
    nbest = stopping.translate(sources, beam=4, nbest=4, length_penalty=0.0)
    rows = [(src, h) for src, hyps in zip(sources, nbest) for h in hyps if len(h.tokens) < 10]  # ended by </s>
    assert len(rows) > 4 and sum(h.tokens.count("<unk>") > 1 for _, h in rows) > 1
    scores = stopping.log_prob([src for src, _ in rows], [h.text for _, h in rows])
    assert [s.log_prob for s in scores] == pytest.approx([h.score for _, h in rows], abs=1e-4)
    assert [s.tokens for s in scores] == [len(h.tokens) + 1 for _, h in rows]


def test_a_wrong_attention_layer_of_an_rnn_counts_its_one_attention(translator):
    """The RNN's decoder attends to the source once, after its top layer: with model.rnn.dec_layers 2
    the refusal of layer=1 said 'the decoder has 1 layers', which that decoder does not."""
    from cometnmt.config import ModelConfig
    from cometnmt.models import build_model

    cfg = ModelConfig(arch="rnn")
    cfg.rnn.embed_dim, cfg.rnn.hidden_size, cfg.rnn.dec_layers = 8, 16, 2
    codec = translator.codec
    model = build_model(cfg, len(codec.src_vocab), len(codec.tgt_vocab), 0)
    rnn = cometnmt.Translator(model, codec, translator.cfg, translator.device)
    with pytest.raises(cometnmt.ConfigError, match=r"^layer=1: the decoder has 1 layer attending to the source \(0\.\.0, or -1"):
        rnn.attention(["Ein Hund läuft."], ["A dog runs."], layer=1)
    assert rnn.attention(["Ein Hund läuft."], ["A dog runs."], layer=0)[0].layer == 0


def test_attention_through_the_api(translator):
    """Translator.attention: one map per pair, rows summing to 1 over the source tokens, teacher-forced
    on given targets or on the model's own greedy translation; a wrong layer is named as the keyword."""
    sources = ["Ein Hund läuft.", "Zwei Männer stehen am Strand."]
    given = translator.attention(sources, ["A dog runs.", "Two men stand on the beach."])
    assert [len(m.weights) for m in given] == [len(m.target) for m in given]
    for amap in given:
        assert amap.target[-1] == "</s>"
        assert all(len(row) == len(amap.source) and sum(row) == pytest.approx(1.0, abs=1e-5) for row in amap.weights)
    own = translator.attention(sources[:1])
    assert translator.codec.tgt_tok.detokenize(own[0].target[:-1]) == translator(sources[0])  # its greedy translation
    with pytest.raises(cometnmt.ConfigError, match=r"^layer=9: the decoder has"):
        translator.attention(sources, layer=9)
    for layer in ("1", 1.0, True, None):  # "1" was a TypeError from a comparison, True taken as layer 1
        with pytest.raises(cometnmt.ConfigError, match=rf"^layer={re.escape(repr(layer))}: must be an integer"):
            translator.attention(sources, layer=layer)


def test_threads_sharing_a_translator_get_what_each_gets_alone(translator):
    """Two threads calling one Translator at once: attention() (and replace_unk) keeps the weights
    on the model's attention modules while it runs, so two such calls swapped each other's lists:
    a RuntimeError (tensor sizes do not match), an AttributeError ('keep_weights'), or another
    call's weights, in 3 of 3 tries. Calls now take a lock; each thread gets exactly the results
    of the same call made alone, for every pair of translate, attention and log_prob."""
    import threading

    sources = [["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Kind lacht.", "Eine Frau liest ein Buch."],
               ["Drei Männer stehen auf der Straße.", "Ein Hund.", "Menschen sitzen in einem Café und trinken."]]
    targets = [["A man rides a bike.", "Two dogs play in the snow.", "A child laughs.", "A woman reads a book."],
               ["Three men stand on the street.", "A dog.", "People sit in a cafe and drink."]]
    calls = {
        "translate": lambda i: [[(h.text, h.score) for h in r] for r in translator.translate(sources[i], beam=2, nbest=2)],
        "replace_unk": lambda i: translator(sources[i], replace_unk=True),
        "attention": lambda i: translator.attention(sources[i], targets[i]),
        "own attention": lambda i: translator.attention(sources[i]),
        "log_prob": lambda i: translator.log_prob(sources[i], targets[i]),
    }
    alone = {(name, i): call(i) for name, call in calls.items() for i in (0, 1)}
    pairs = [("attention", "attention"), ("own attention", "replace_unk"), ("attention", "translate"),
             ("replace_unk", "log_prob"), ("own attention", "attention"), ("translate", "log_prob")]
    for first, second in pairs * 2:
        together, start = {}, threading.Barrier(2)

        def run(name: str, i: int) -> None:
            start.wait()
            try:
                together[(name, i)] = calls[name](i)
            except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
                together[(name, i)] = exc

        threads = [threading.Thread(target=run, args=(first, 0)), threading.Thread(target=run, args=(second, 1))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert together == {(first, 0): alone[(first, 0)], (second, 1): alone[(second, 1)]}, (first, second)


def test_replace_unk_copies_the_source_word_each_unknown_attends_to_most(translator):
    """With replace_unk, each <unk> of each hypothesis (beam 2, 2-best) becomes the source word its
    row of the last layer's attention (as ``attention_ids`` gives it) weighs most; every other token
    and the score stay the search's, and a blank line stays blank."""
    sources = ["Zwei junge Männer spielen Fußball im Park.", "Ein Hund läuft über die Wiese.", "",
               "Eine Frau mit Hut verkauft Blumen auf dem Markt."]
    plain = translator.translate(sources, beam=2, nbest=2)
    copied = translator.translate(sources, beam=2, nbest=2, replace_unk=True)
    vocab, unk = translator.codec.tgt_vocab, "<unk>"
    assert sum(h.tokens.count(unk) for hyps in plain for h in hyps) > 5  # the tiny model has few words
    assert copied[2] == plain[2] and copied[2][0].text == ""
    for source, p_hyps, c_hyps in zip(sources, plain, copied):
        if not source:
            continue
        words = translator.codec.src_tok.tokenize(source)
        src_ids = [translator.codec.encode_src(words)]
        for p, c in zip(p_hyps, c_hyps):
            assert c.score == p.score and len(c.tokens) == len(p.tokens) and unk not in c.tokens
            rows = translator.attention_ids(src_ids, [vocab.encode(p.tokens)])[0].weights
            expected = [words[max(range(len(words)), key=rows[t].__getitem__)] if tok == unk else tok
                        for t, tok in enumerate(p.tokens)]
            assert c.tokens == expected
            assert c.text == translator.codec.tgt_tok.detokenize(expected)
    assert translator(sources[0], replace_unk=True) == copied[0][0].text
    with pytest.raises(cometnmt.ConfigError, match=r"^replace_unk='yes': must be true or false"):
        translator.translate(sources, replace_unk="yes")


def test_replace_unk_averages_an_ensembles_attention_and_never_copies_the_source_s(translator, monkeypatch):
    """An ensemble's members' attention is averaged before the peak is taken, and with source
    <s>/</s> (``data.src_sos_eos``) the peak is among the words: for "a b c", the first <unk>
    attends (a, b, c) 0.6/0.4/0 in one member and 0/0.4/0.6 in the other (each alone would copy a
    or c; together b), the second puts most weight on <s> in both and copies c, the runner-up."""
    import torch

    from cometnmt.inference import Translation, Translator
    from cometnmt.models.ensemble import Ensemble

    codec = copy.deepcopy(translator.codec)
    codec.src_sos_eos = True
    members = [copy.deepcopy(translator.model) for _ in range(2)]
    #               <s>   a    b    c   </s>
    rows = [[[0.0, 0.6, 0.4, 0.0, 0.0], [0.0] * 5, [0.5, 0.2, 0.0, 0.3, 0.0], [0.0] * 5],
            [[0.0, 0.0, 0.4, 0.6, 0.0], [0.0] * 5, [0.5, 0.0, 0.2, 0.3, 0.0], [0.0] * 5]]
    for member, weights in zip(members, rows):
        member.cross_attention = lambda src, mask, tgt_in, w=weights: [torch.tensor(w)[None, None]]  # B,H,T,S
    ensemble = Translator(Ensemble(members), codec, translator.cfg, torch.device("cpu"))
    monkeypatch.setattr(ensemble, "translate_ids", lambda ids, cfg, progress, start=0:
                        [[Translation("", -1.0, ["<unk>", "x", "<unk>"])] for _ in ids])
    [[hyp]] = ensemble.translate(["a b c"], replace_unk=True)
    assert hyp.tokens == ["b", "x", "c"] and hyp.score == -1.0


def test_replace_unk_is_for_word_vocabularies(translator, tmp_path, data_dir):
    """Copied SentencePiece pieces are no target pieces: a config or a model with SentencePiece refuses it."""
    import types

    import torch

    from cometnmt.inference import Translator

    with pytest.raises(cometnmt.ConfigError, match=r"config key 'decode.replace_unk': copies source words .* not 'sentencepiece'"):
        tiny_train_cfg(tmp_path, data_dir, "data.tokenizer=sentencepiece", "decode.replace_unk=true")
    codec = copy.deepcopy(translator.codec)
    codec.tgt_tok = types.SimpleNamespace(kind="sentencepiece")
    pieces = Translator(translator.model, codec, translator.cfg, torch.device("cpu"))
    with pytest.raises(cometnmt.ConfigError, match=r"^decode.replace_unk: .* tokenizer is sentencepiece and spacy"):
        pieces.translate(["Ein Hund."], replace_unk=True)
    with pytest.raises(cometnmt.ConfigError, match=r"^--replace-unk: copies source words"):  # as the commands name it
        pieces.search_config(flags=True, replace_unk=True)


def test_a_failed_run_says_why_in_its_train_log(tmp_path, data_dir, monkeypatch):
    """train.log of a run that stopped on an error held only the lines before it (nothing at all
    when the data were refused): it now ends with the error, and with the traceback of anything
    that is not a usage error."""
    from cometnmt.errors import DataError
    from cometnmt.training import trainer

    with pytest.raises(DataError, match="no training pairs left"):
        cometnmt.train(tiny_train_cfg(tmp_path / "a", data_dir, "data.max_len=1"))
    log = (tmp_path / "a" / "train.log").read_text(encoding="utf-8")
    assert "ERROR cometnmt.training.run: the run stopped: " in log and "no training pairs left" in log
    assert "Traceback" not in log

    def boom(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer.Trainer, "fit", boom)
    with pytest.raises(RuntimeError, match="boom"):
        cometnmt.train(tiny_train_cfg(tmp_path / "b", data_dir, "train.num_threads=1"))
    log = (tmp_path / "b" / "train.log").read_text(encoding="utf-8")
    assert "the run stopped: boom" in log and "Traceback" in log and log.rstrip().endswith("RuntimeError: boom")


def test_the_data_s_log_lines_reach_train_log_and_a_resume_appends_to_it(tmp_path, data_dir, caplog):
    """The splits are read before the run folder and its train.log are made (a missing or bad data
    file left a folder holding a train.log with the error alone): what reading them logs is held
    and written to train.log once it is open. A resumed run appends to its train.log; one whose
    data file has gone stops before it opens the log, which keeps what it held."""
    files = _files(tmp_path, data_dir)
    for lang in ("de", "en"):  # an empty pair: the reader warns that it skipped it
        path = tmp_path / f"train.{lang}"
        path.write_text(path.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    cfg = tiny_train_cfg(tmp_path / "run", data_dir, *files, "train.max_steps=1", "train.num_threads=1")
    log = tmp_path / "run" / "train.log"
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        cometnmt.train(cfg)
        first = log.read_text(encoding="utf-8")
        assert "skipped 1 line pair(s) empty or whitespace-only" in first and first.index("skipped") < first.index("data: ")
        cometnmt.train(cfg, resume=True)
    again = log.read_text(encoding="utf-8")
    assert again.startswith(first) and "resumed from step 1" in again[len(first):]
    assert again[len(first):].count("skipped 1 line pair(s)") == 1  # the resumed run's reading, held and written once
    (tmp_path / "train.en").unlink()
    with pytest.raises(cometnmt.DataError, match=r"train.en: file not found"):
        cometnmt.train(cfg, resume=True)
    assert log.read_text(encoding="utf-8") == again


def test_tied_embeddings_train_resume_translate_and_average(tmp_path, data_dir):
    """model.tie_embeddings end to end: the checkpoint's model is tied again when loaded (for
    decoding, --resume and averaging), and a resumed run goes on exactly as an uninterrupted one."""
    import torch

    from cometnmt.training.checkpoint import load_checkpoint

    tied = ("model.tie_embeddings=true", "train.num_threads=1", "train.keep_checkpoints=2")
    full = cometnmt.train(tiny_train_cfg(tmp_path / "full", data_dir, *tied, "train.max_epochs=2"))
    cometnmt.train(tiny_train_cfg(tmp_path / "part", data_dir, *tied, "train.max_epochs=1"))
    cometnmt.train(tiny_train_cfg(tmp_path / "part", data_dir, *tied, "train.max_epochs=2"), resume=True)
    a, b = load_checkpoint(tmp_path / "full" / "last.pt"), load_checkpoint(tmp_path / "part" / "last.pt")
    assert full["steps"] == a["step"] == b["step"]
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=0, atol=0, msg=key)
    assert torch.equal(a["model"]["out_proj.weight"], a["model"]["tgt_embed.embed.weight"])

    model = cometnmt.Translator.from_checkpoint(tmp_path / "full" / "last.pt", device="cpu").model
    assert model.out_proj.weight is model.tgt_embed.embed.weight
    avg = cometnmt.average_checkpoints(cometnmt.last_epoch_checkpoints(tmp_path / "full", 2), tmp_path / "avg.pt")
    translator = cometnmt.Translator.from_checkpoint(avg, device="cpu")
    assert translator.model.out_proj.weight is translator.model.tgt_embed.embed.weight
    assert translator("Zwei Hunde.")


def test_checkpoint_arguments_of_the_wrong_type_say_what_they_got(run_dir):
    """from_checkpoint(None) or (5) said "'NoneType' object is not iterable"; bytes were taken as
    a list of numbers; last_epoch_checkpoints(dir, "2") showed last=2, as if it were the number."""
    for bad, got in [(None, "got None$"), (5, r"got an int \(5\)$"), (str(run_dir / "best.pt").encode(), "got a bytes"),
                     ([run_dir / "best.pt", None], "got None$")]:
        with pytest.raises(TypeError, match=f"^a checkpoint is a path \\(str or pathlib.Path\\), or a list of paths for an ensemble; {got}"):
            cometnmt.Translator.from_checkpoint(bad, device="cpu")
    ensemble = cometnmt.Translator.from_checkpoint(iter([run_dir / "best.pt", run_dir / "last.pt"]), device="cpu")
    assert type(ensemble.model).__name__ == "Ensemble"  # any iterable of paths still works
    with pytest.raises(cometnmt.CheckpointError, match=r"^last='2': must be an integer at least 1"):
        cometnmt.last_epoch_checkpoints(run_dir, "2")


def test_precision_runs_the_search_under_autocast_and_a_bad_one_is_named(translator, monkeypatch):
    """decode.precision (translate's precision=): bf16 runs the model's products in bfloat16 (the
    output layer's logits come out bf16: the search would see float32 ones if the setting were
    ignored), fp32 does not; the translations stay translations; a value not offered is an error
    naming the keyword, and the checkpoint's setting is the default."""
    seen = []
    hook = translator.model.out_proj.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    try:
        sentences = ["Ein Hund läuft.", "Zwei Kinder spielen im Park."]
        fp32 = translator.translate(sentences, beam=2)
        assert set(seen) == {torch.float32}
        seen.clear()
        bf16 = translator.translate(sentences, beam=2, precision="bf16")
        assert set(seen) == {torch.bfloat16}
        assert [len(h) for h in bf16] == [len(h) for h in fp32] and all(h[0].text for h in bf16)
        assert all(math.isfinite(h[0].score) for h in bf16)
    finally:
        hook.remove()
    assert translator.cfg.decode.precision == "fp32" and translator.search_config(precision="bf16").precision == "bf16"
    with pytest.raises(ConfigError, match=r"precision='int8': must be one of fp32, bf16, fp16"):
        translator.translate(["Ein Hund."], precision="int8")
