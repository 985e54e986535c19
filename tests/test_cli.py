"""The CLI end to end on configs/tiny.yaml, and every bad input exits non-zero with a clear message."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import tiny_train_cfg

TINY = ["configs/tiny.yaml", "--set", "data.max_train_pairs=600", "--set", "data.max_valid_pairs=40",
        "--set", "train.max_epochs=1", "--set", "train.progress=false", "--set", "train.attention_plots=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """One tiny training run shared by the tests of this module."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    run_dir = tmp_path_factory.mktemp("tiny")
    env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir)}
    proc = subprocess.run([sys.executable, "-m", "cometnmt", "train", *TINY, "--set", f"train.save_dir={run_dir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_every_option_of_every_command_says_what_it_is():
    """--help lists each option with its meaning (average's -o OUTPUT had none)."""
    import argparse

    from cometnmt.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    bare = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in commands.items() for a in p._actions
            if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not bare


def test_precision_flag_offers_the_configs_choices():
    """--precision's choices are written out in cli.py (config imports torch, which the parser does
    not load); they must be decode.precision's, and those train.precision's (config.PRECISIONS)."""
    import argparse
    import typing

    from cometnmt.cli import build_parser
    from cometnmt.config import PRECISIONS, DecodeConfig

    assert typing.get_args(typing.get_type_hints(DecodeConfig)["precision"]) == PRECISIONS

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("translate", "evaluate", "serve"):
        [flag] = [a for a in commands[name]._actions if "--precision" in a.option_strings]
        assert tuple(flag.choices) == PRECISIONS and flag.default is None


def test_train_help_points_to_the_keys_and_the_own_corpus_config():
    """train --help named one preset and nothing else: where the keys are listed, or how to train
    on one's own files (data.corpus: files), was in the README alone (a practitioner's walk)."""
    text = " ".join(_help_of("train").split())  # argparse wraps lines
    assert "configs/reference.yaml" in text and "data.corpus: files" in text and "Your own parallel text" in text


def _help_of(command: str) -> str:
    import argparse

    from cometnmt.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command].format_help()


COMMANDS = ["train", "translate", "logprob", "attention", "evaluate", "average", "serve", "reproduce", "compare", "render"]
# each command's help, a bad option and a missing argument (or, where none is required, what it
# parses to); the top level's help, no command, a typo, -v before the command, an invalid choice
# and a bad number
LINES = [*([command, *rest] for command in COMMANDS for rest in (["--help"], ["--no-such-option"], [])),
         ["--help"], [], ["-v"], ["tranlsate", "a.pt"], ["-v", "translate", "--help"], ["--verbose", "render"],
         ["evaluate", "--split", "dev"], ["translate", "a.pt", "--beam", "five"], ["-v", "--", "average", "-o"]]


def _subcommands(parser):
    import argparse

    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_commands_are_the_ones_listed_here():
    from cometnmt.cli import build_parser

    assert list(_subcommands(build_parser())) == COMMANDS


@pytest.mark.parametrize("argv", LINES, ids=" ".join)
def test_the_typed_commands_parser_says_what_the_whole_parser_says(capsys, argv):
    """main builds the typed command's options alone (the others' took most of a `translate --help`):
    its help, errors and exit status are the whole parser's, byte for byte, and so is what it parses."""
    from cometnmt.cli import _command_at, build_parser

    def outcome(parser):
        try:
            result = vars(parser.parse_args(argv))
        except SystemExit as exit:
            result = exit.code
        out = capsys.readouterr()
        return result, out.out, out.err

    whole, typed = outcome(build_parser()), outcome(build_parser(_command_at(argv)))
    assert typed == whole and (whole[1] or whole[2] or isinstance(whole[0], dict))


@pytest.mark.parametrize("command", [*COMMANDS, "tranlsate", ""])
def test_a_commands_parser_holds_its_own_options_alone(command):
    """build_parser(COMMAND): every command is there, with its help line, but only COMMAND has options
    (a name that is no command: none has)."""
    from cometnmt.cli import build_parser

    def options(parser):
        return [(a.dest, a.option_strings) for a in parser._actions]

    whole, typed = _subcommands(build_parser()), _subcommands(build_parser(command))
    assert list(typed) == list(whole)
    for name, parser in typed.items():
        assert options(parser) == (options(whole[name]) if name == command else [("help", ["-h", "--help"])])
        assert parser.get_default("func") is whole[name].get_default("func")


@pytest.mark.parametrize("argv, command", [(["translate", "a.pt", "-i", "x"], "translate"), (["-v", "train", "c.yaml"], "train"),
                                           (["--verbose", "--version", "serve"], "serve"), (["-v", "--help"], ""), ([], "")])
def test_the_command_typed_is_found_after_the_global_options(argv, command):
    from cometnmt.cli import _command_at

    assert _command_at(argv) == command


def test_train_writes_run_folder(trained):
    for name in ("best.pt", "last.pt", "metrics.jsonl", "config.yaml", "train.log"):
        assert (trained / name).exists(), name
    # train.attention_plots=2: two heatmaps per validation (one epoch)
    assert sorted(p.name for p in (trained / "attention").iterdir()) == ["epoch_001_line_0001.png", "epoch_001_line_0002.png"]
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["event"] == "valid"]
    assert valid and {"val_loss", "val_loss_per_100_tokens", "val_bleu", "val_chrf", "val_paper_bleu"} <= set(valid[0])
    assert any(r["event"] == "train" and r["tgt_tokens_per_s"] > 0 for r in records)


def test_translate_file_and_stdin(trained, cli, tmp_path, data_dir):
    src = tmp_path / "src.de"
    with gzip.open(data_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        src.write_text("".join(next(f) for _ in range(12)), encoding="utf-8")
    out = tmp_path / "hyp.en"
    cli("translate", str(trained / "best.pt"), "-i", str(src), "-o", str(out))
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 12
    proc = cli("translate", str(trained / "best.pt"), input=src.read_text(encoding="utf-8"))
    assert proc.stdout.splitlines() == lines  # same checkpoint, same greedy search
    # '-' is standard input/output (it was a file named '-'), and evaluate --hyp - reads a pipe
    dash = cli("translate", str(trained / "best.pt"), "-i", "-", "-o", "-", input=src.read_text(encoding="utf-8"))
    assert dash.stdout.splitlines() == lines and not (tmp_path / "-").exists()
    ref = tmp_path / "ref.en"
    with gzip.open(data_dir / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        ref.write_text("".join(next(f) for _ in range(12)), encoding="utf-8")
    piped = cli("evaluate", "--hyp", "-", "--ref", str(ref), "--json", str(tmp_path / "piped.json"), input=dash.stdout)
    cli("evaluate", "--hyp", str(out), "--ref", str(ref), "--json", str(tmp_path / "file.json"))
    assert json.loads((tmp_path / "piped.json").read_text()) == json.loads((tmp_path / "file.json").read_text())
    assert "BLEU" in piped.stdout
    short = cli("evaluate", "--hyp", "-", "--ref", str(ref), input="one line\n", check=False)
    assert short.returncode != 0 and "<stdin> has 1 lines but" in short.stderr
    nbest = cli("translate", str(trained / "best.pt"), "--beam", "3", "--nbest", "2", input="Ein Hund läuft.\n\nZwei.\n")
    rows = [line.split("\t") for line in nbest.stdout.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "1", "1", "2", "2"] and all(len(r) == 3 for r in rows)  # 2 rows a line
    assert rows[2][2] == rows[3][2] == ""  # the blank line: blank hypotheses
    one = cli("translate", str(trained / "best.pt"), "--nbest", "1", input=src.read_text(encoding="utf-8"))
    rows = [line.split("\t") for line in one.stdout.splitlines()]  # asked for: the columns logprob --nbest-input reads
    assert [r[0] for r in rows] == [str(i) for i in range(12)] and [r[2] for r in rows] == lines


def test_translate_samples(trained, cli, tmp_path):
    """--sampling end to end: --nbest samples a line, best score first; --seed repeats the output and
    another seed changes it; --topk 1 is the greedy translation."""
    src = "Ein Hund läuft im Schnee.\nZwei Männer spielen Fußball.\n"
    ckpt = str(trained / "best.pt")

    def sample(*options):
        return cli("translate", ckpt, "--sampling", "--nbest", "4", "--temperature", "1.5", *options, input=src).stdout

    out = sample("--seed", "1", "--topp", "0.95")
    rows = [line.split("\t") for line in out.splitlines()]
    assert [r[0] for r in rows] == ["0"] * 4 + ["1"] * 4
    for i in (0, 4):
        scores = [float(r[1]) for r in rows[i : i + 4]]
        assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    assert len({r[2] for r in rows}) > 2  # samples, not one translation repeated
    assert sample("--seed", "1", "--topp", "0.95") == out and sample("--seed", "2", "--topp", "0.95") != out
    assert cli("translate", ckpt, "--sampling", "--topk", "1", input=src).stdout == cli("translate", ckpt, input=src).stdout


def test_evaluate_checkpoint_on_split(trained, cli, tmp_path):
    out_json = tmp_path / "result.json"
    proc = cli("evaluate", "--checkpoint", str(trained / "best.pt"), "--split", "valid", "--json", str(out_json))
    result = json.loads(out_json.read_text())
    assert result["n_sentences"] == 40
    assert "COMET paper metric" in proc.stdout and "nrefs:1" in proc.stdout
    assert result["bleu_by_length"] is not None


def test_evaluate_checkpoint_names_the_files_sacrebleu_scores_alike(trained, cli, tmp_path):
    """evaluate --checkpoint printed its scores but not the split's files, so a reader checking them
    with sacreBLEU itself had to find the reference (in $COMETNMT_MULTI30K_DIR or the cache), and
    learned only from a failed or different score that tiny.yaml's data.max_valid_pairs had scored
    the first 40 of its lines. The table and the JSON name both files and how many lines were
    scored; sacreBLEU on --hyp-out and that many reference lines gives the same BLEU and chrF."""
    from cometnmt.data.corpus import read_lines

    hyp, out = tmp_path / "valid.hyp", tmp_path / "valid.json"
    proc = cli("evaluate", "--checkpoint", str(trained / "best.pt"), "--split", "valid", "--hyp-out", str(hyp),
               "--json", str(out))
    result = json.loads(out.read_text())
    n, refs = result["n_sentences"], read_lines(result["reference_file"])
    assert result["reference_file"].endswith("val.en.gz") and result["source_file"].endswith("val.de.gz")
    assert result["reference_lines"] == len(refs) > n == 40
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith(("source ", "reference "))}
    assert rows["reference"].split(maxsplit=1)[1] == f"{result['reference_file']} (the first 40 of its {len(refs)} lines)"
    assert rows["source"].split(maxsplit=1)[1].startswith(result["source_file"])
    hyps = read_lines(hyp)
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs[:n]]).score, abs=1e-9)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs[:n]]).score, abs=1e-9)


def test_replace_unk_through_translate_and_evaluate(trained, cli, tmp_path):
    """--replace-unk: translate writes the API's copies (no <unk> left), evaluate --checkpoint records
    it with its scores, and evaluate without --checkpoint refuses it rather than ignore it."""
    from cometnmt.inference import Translator

    lines = ["Zwei junge Männer spielen Fußball im Park.", "Eine Frau verkauft Blumen."]
    proc = cli("translate", str(trained / "best.pt"), "--replace-unk", input="\n".join(lines) + "\n")
    expected = Translator.from_checkpoint(trained / "best.pt", device="cpu")(lines, replace_unk=True)
    assert proc.stdout.splitlines() == expected and not any("<unk>" in line for line in expected)
    assert "<unk>" in cli("translate", str(trained / "best.pt"), input=lines[0] + "\n").stdout  # the tiny model's words are few
    out = tmp_path / "e.json"
    cli("evaluate", "--checkpoint", str(trained / "best.pt"), "--split", "valid", "--replace-unk", "--json", str(out))
    assert json.loads(out.read_text())["decode"]["replace_unk"] is True
    (tmp_path / "h").write_text("A dog.\n", encoding="utf-8")
    proc = cli("evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "h"), "--replace-unk", check=False)
    assert proc.returncode != 0 and "--replace-unk: only with --checkpoint" in proc.stderr


def test_evaluate_matches_sacrebleu(cli, tmp_path, data_dir):
    with gzip.open(data_dir / "val.en.gz", "rt", encoding="utf-8") as f:
        refs = [next(f).rstrip("\n") for _ in range(50)]
    hyps = [" ".join(r.split()[::-1][:6]) if i % 3 else r for i, r in enumerate(refs)]
    (tmp_path / "h").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "r").write_text("\n".join(refs) + "\n", encoding="utf-8")
    out = tmp_path / "e.json"
    cli("evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), "--json", str(out))
    expected = sacrebleu.corpus_bleu(hyps, [refs])
    assert json.loads(out.read_text())["bleu"] == pytest.approx(expected.score, abs=1e-9)


def test_average_checkpoints(trained, cli, tmp_path):
    out = tmp_path / "avg.pt"
    cli("average", str(trained / "best.pt"), str(trained / "last.pt"), "-o", str(out))
    proc = cli("translate", str(out), input="Ein Mann.\n")
    assert proc.returncode == 0


# -- bad input -------------------------------------------------------------------------------


def _err(proc) -> str:
    assert proc.returncode != 0, "expected a non-zero exit"
    return proc.stderr


def test_mismatched_line_counts_name_both_files(cli, tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    args = ["train", "configs/tiny.yaml", "--set", "data.corpus=files", "--set", f"data.train_src={tmp_path}/a.de",
            "--set", f"data.train_tgt={tmp_path}/a.en", "--set", f"data.valid_src={tmp_path}/a.de",
            "--set", f"data.valid_tgt={tmp_path}/a.en", "--set", f"train.save_dir={tmp_path}/run"]
    err = _err(cli(*args, check=False))
    assert "a.de" in err and "a.en" in err and "3" in err and "2" in err
    assert not (tmp_path / "run").exists()  # was the folder with a train.log holding the error alone


def test_a_missing_train_file_leaves_no_run_folder(capsys, tmp_path, monkeypatch):
    """`cometnmt train` made train.save_dir (and the folders above it) and its train.log before it
    read the data: a config whose train file was missing left a run folder behind, holding a
    train.log with the error alone. The splits are read, with every check of their files, first."""
    from conftest import REPO

    monkeypatch.chdir(tmp_path)
    for name in ("v.de", "v.en", "t.en"):
        (tmp_path / name).write_text("ein Hund\nzwei Hunde\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ndata:\n  corpus: files\n  train_src: t.de\n"
                                     "  train_tgt: t.en\n  valid_src: v.de\n  valid_tgt: v.en\ntrain:\n  save_dir: runs/a\n",
                                     encoding="utf-8")
    code, err = _main(capsys, "train", "c.yaml")
    assert code == 2 and "c.yaml: config key 'data.train_src': t.de: file not found" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "t.en", "v.de", "v.en"]  # no runs/a/train.log


def test_undecodable_bytes_name_file_and_line(cli, tmp_path):
    (tmp_path / "h").write_bytes(b"fine\nbad \xff byte\n")
    (tmp_path / "r").write_text("fine\nalso fine\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), check=False))
    assert f"{tmp_path / 'h'}:2" in err


def test_empty_reference_line_is_an_error_in_evaluation(cli, tmp_path):
    (tmp_path / "h").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "r").write_text("a\n\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), check=False))
    assert "empty" in err and ":2" in err


def test_missing_file(cli, tmp_path):
    err = _err(cli("evaluate", "--hyp", str(tmp_path / "nope"), "--ref", str(tmp_path / "nope2"), check=False))
    assert "nope" in err and "not found" in err


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.lrr=0.1", "train.lrr"),
        ("train.lr=fast", "train.lr"),
        ("model.arch=lstm9", "model.arch"),
        ("train.stopping=never", "train.stopping"),
        ("model.comet.unit=ffn9", "model.comet.unit"),
        ("decode.beam_size=0", "decode.beam_size"),
        ("train.device=tpu", "config key 'train.device': 'tpu' is not a device"),
        ("model.n_heads=0", "model.n_heads"),
        ("model.d_model=0", "model.d_model"),
        ("model.max_positions=0", "model.max_positions"),
        ("data.max_train_pairs=-1", "data.max_train_pairs"),
        ("train.lr=nan", "train.lr"),
        ("train.lr=-1", "train.lr"),
        ("train.label_smoothing=1.5", "train.label_smoothing"),
    ],
)
def test_bad_config_names_the_key(cli, override, needle, tmp_path):
    err = _err(cli("train", "configs/tiny.yaml", "--set", override, "--set", f"train.save_dir={tmp_path}", check=False))
    assert needle in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_device_without_cuda_names_the_key(cli, tmp_path):
    err = _err(cli("train", "configs/tiny.yaml", "--set", "train.device=cuda", "--set", f"train.save_dir={tmp_path}", check=False))
    assert "train.device='cuda', but CUDA is not available" in err and "Traceback" not in err


def test_missing_and_corrupt_checkpoint(cli, tmp_path):
    err = _err(cli("translate", str(tmp_path / "none.pt"), input="x\n", check=False))
    assert "none.pt" in err and "not found" in err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x80\x02garbage" * 100)
    err = _err(cli("translate", str(bad), input="x\n", check=False))
    assert "bad.pt" in err and "Traceback" not in err
    text = tmp_path / "notes.pt"  # was "corrupt or truncated? KeyError: 101"
    text.write_text("epoch 3 was best\n", encoding="utf-8")
    err = _err(cli("translate", str(text), input="x\n", check=False))
    assert "notes.pt: not a checkpoint; a PyTorch checkpoint is a zip archive, this file begins with b'epoc'" in err


def test_a_config_given_as_the_checkpoint_says_which_file_to_give(capsys, monkeypatch):
    """`cometnmt translate configs/tiny.yaml` (the config where its trained checkpoint belongs) said
    only that the file is no zip archive and begins with b'# Se'; it now says it is a config and
    that the checkpoint `cometnmt train` of it writes is what to give."""
    from cometnmt import cli
    from conftest import REPO

    monkeypatch.chdir(REPO)
    assert cli.main(["translate", "configs/tiny.yaml", "-i", "/dev/null"]) == 2
    assert capsys.readouterr().err.strip() == (
        "cometnmt: error: configs/tiny.yaml: not a checkpoint; a PyTorch checkpoint is a zip archive, this file begins "
        "with b'# Se'; it is a YAML config: give the checkpoint that `cometnmt train configs/tiny.yaml` writes, best.pt "
        "in its train.save_dir")


def test_truncated_checkpoint(trained, cli, tmp_path):
    data = (trained / "best.pt").read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    err = _err(cli("translate", str(cut), input="x\n", check=False))
    assert "cut.pt" in err and "corrupt" in err
    assert err.rstrip().endswith("failed finding central directory)"), err  # was cut mid-way through torch's advice


def test_refuses_to_overwrite_a_run(trained, cli):
    err = _err(cli("train", *TINY, "--set", f"train.save_dir={trained}", check=False))
    assert "--resume" in err


def test_refuses_a_run_folder_without_last_pt(trained, cli, tmp_path):
    """A run whose last.pt is gone (deleted after a 'truncated checkpoint' error, say) still holds
    best.pt, metrics.jsonl and maybe epoch checkpoints: a new run there would overwrite or mix them."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(trained, old)
    (old / "last.pt").unlink()
    before = {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()}
    err = _err(cli("train", *TINY, "--set", f"train.save_dir={old}", check=False))
    assert "already holds a run" in err and "best.pt" in err and "no last.pt" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()} == before  # nothing written


def test_resume_without_a_run_writes_nothing(cli, tmp_path):
    err = _err(cli("train", *TINY, "--set", f"train.save_dir={tmp_path / 'new'}", "--resume", check=False))
    assert "--resume: no checkpoint at" in err and "Traceback" not in err
    assert not (tmp_path / "new").exists()  # not even a train.log


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_save_dir_is_refused(capsys, tmp_path, monkeypatch, value):
    """`--set train.save_dir=` was Path(''), the current folder: the run's checkpoints, metrics
    and train.log went in among the user's files."""
    from conftest import REPO

    monkeypatch.chdir(tmp_path)
    code, err = _main(capsys, "train", str(REPO / "configs" / "tiny.yaml"), "--set", f"train.save_dir={value}",
                      "--set", "data.max_train_pairs=100", "--set", "train.max_epochs=1")  # short, on the old code
    assert code == 2 and "config key 'train.save_dir': empty" in err, err
    assert list(tmp_path.iterdir()) == []


def test_resume_names_the_changed_config_key(trained, cli):
    err = _err(cli("train", *TINY, "--set", f"train.save_dir={trained}", "--set", "model.d_ff=48", "--resume", check=False))
    assert "model.d_ff" in err and "Traceback" not in err


def test_translate_input_errors_name_the_line(trained, cli, tmp_path):
    """Too long a source line fails before any decoding (no output written); standard input is
    split and checked as a file is: only on newlines, strict UTF-8 with line and column."""
    src = tmp_path / "long.de"
    src.write_text("Ein Hund läuft.\n" + " ".join(["Hund"] * 1100) + "\nEin Kind.\n", encoding="utf-8")
    out = tmp_path / "long.en"
    err = _err(cli("translate", str(trained / "best.pt"), "-i", str(src), "-o", str(out), check=False))
    assert "long.de: input line 2: 1100 source tokens" in err and "model.max_positions" in err and "Traceback" not in err
    assert not out.exists()
    odd = "Ein Mann\u2028läuft.\nZwei Hunde\x0cspielen.\nEin Kind.\n"  # U+2028 and form feed inside lines
    (tmp_path / "odd.de").write_text(odd, encoding="utf-8")
    from_file = cli("translate", str(trained / "best.pt"), "-i", str(tmp_path / "odd.de")).stdout
    assert cli("translate", str(trained / "best.pt"), input=odd).stdout == from_file and from_file.count("\n") == 3
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt")], cwd=REPO,
                          input=b"Ein Mann.\n\nZwei Hunde \xff laufen.\n", capture_output=True, timeout=600)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "<stdin>:3: not valid UTF-8 (byte 0xff at column 12)" in err and "Traceback" not in err, err


@pytest.mark.parametrize("options, needle", [
    (["--batch-size", "0"], "--batch-size 0: must be at least 1"),
    (["--beam", "0"], "--beam 0: must be at least 1"),
    (["--beam", "2", "--nbest", "5"], "--nbest 5: more hypotheses than the beam keeps (2)"),
    (["--sampling", "--topk", "-1"], "--topk -1: must be at least 0 (0: the whole vocabulary)"),
    (["--sampling", "--topp", "0"], "--topp 0.0: must be in (0, 1] (1: off)"),
    (["--sampling", "--topp", "1.2"], "--topp 1.2: must be in (0, 1] (1: off)"),
    (["--sampling", "--temperature", "0"], "--temperature 0.0: must be a positive finite number"),
    (["--sampling", "--temperature", "nan"], "--temperature nan: must be a positive finite number"),
    (["--sampling", "--temperature", "1e-46"], "--temperature 1e-46: must be from 1e-30 to 1e+30"),  # gave NaN logits
    (["--beam", "3", "--length-penalty", "400"], "--length-penalty 400.0: must be a number from 0 to 10"),  # overflowed
    (["--sampling", "--seed", "-2"], "--seed -2: must be at least 0"),
    (["--sampling", "--beam", "4"], "--sampling and --beam 4: choose one"),
    (["--topk", "5"], "--topk 5: a sampling setting; add --sampling"),
    (["--seed", "5"], "--seed 5: a sampling setting; add --sampling"),
])
def test_bad_decode_options(trained, cli, options, needle):
    err = _err(cli("translate", str(trained / "best.pt"), *options, input="Ein Hund.\n", check=False))
    assert needle in err and "Traceback" not in err


def test_outputs_that_cannot_be_written(trained, cli, tmp_path):
    err = _err(cli("translate", str(trained / "best.pt"), "-o", str(tmp_path), input="Ein Hund.\n", check=False))
    assert "is a directory" in err and "Traceback" not in err
    hyp = tmp_path / "h.en"
    hyp.write_text("a dog\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--json", str(tmp_path), check=False))
    assert f"{tmp_path}: is a directory" in err and "Traceback" not in err


def test_evaluate_says_which_language_counts_the_source_words(cli, tmp_path):
    """evaluate --hyp --ref --src tokenised the source with spaCy's German rules for BLEU by length
    unless --src-lang said otherwise, and said so nowhere (a French source was counted as German,
    found walking the README with one's own corpus); it is now logged, as --lang's default is."""
    for name, text in (("h", "A dog runs.\n"), ("r", "A dog runs.\n"), ("s", "Un chien court.\n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
    args = ["evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), "--src", str(tmp_path / "s")]
    assert "German rules: give --src-lang for another source language" in cli(*args).stderr
    assert "--src-lang" not in cli(*args, "--src-lang", "fr").stderr


def test_a_device_this_machine_lacks_is_named_as_the_flag_before_the_checkpoint_is_read(cli, tmp_path):
    """--device cuda on a machine without CUDA was refused as "device='cuda'" (the Python keyword),
    after the checkpoint was read; each command with --device now names the flag, first."""
    import torch

    missing = str(tmp_path / "none.pt")  # not read: the device is checked first
    src = tmp_path / "src.de"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    bad = "cuda:x" if torch.cuda.is_available() else "cuda"
    for command in (["translate", missing, "-i", str(src)], ["logprob", missing, "-i", str(src), "-t", str(src)],
                    ["attention", missing, "-i", str(src), "--out", str(tmp_path / "att")],
                    ["evaluate", "--checkpoint", missing, "--split", "test"], ["serve", missing]):
        err = _err(cli(*command, "--device", bad, check=False))
        assert f"error: --device {bad}" in err and "none.pt" not in err and "Traceback" not in err, (command, err)


def test_average_without_checkpoints_says_how_to_give_them(cli, tmp_path):
    """`cometnmt average -o avg.pt` alone said only "no checkpoints to average", and --last N on a run
    that kept no epoch checkpoints (train.keep_checkpoints' default, 0) did not say how to keep them:
    each now says what to do (found walking the README with one's own corpus)."""
    err = _err(cli("average", "-o", str(tmp_path / "avg.pt"), check=False))
    assert "cometnmt average A.pt B.pt -o avg.pt" in err and "--dir RUN_FOLDER --last N" in err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "best.pt").write_bytes(b"")
    err = _err(cli("average", "--dir", str(tmp_path / "run"), "--last", "3", "-o", str(tmp_path / "avg.pt"), check=False))
    assert "--last 3: only 0 epoch checkpoints" in err and "0 by default" in err
    assert "train.keep_checkpoints=3" in err and "Traceback" not in err
    assert not (tmp_path / "avg.pt").exists()


def test_average_refuses_checkpoints_of_different_runs(trained, cli, tmp_path):
    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(trained / "best.pt")
    wider = {**payload, "model": dict(payload["model"])}
    key = next(k for k in wider["model"] if wider["model"][k].dim() == 2)
    wider["model"][key] = torch.zeros(wider["model"][key].shape[0] + 3, wider["model"][key].shape[1])
    save_checkpoint(wider, tmp_path / "wider.pt")
    err = _err(cli("average", str(tmp_path / "wider.pt"), str(trained / "best.pt"), "-o", str(tmp_path / "x.pt"), check=False))
    assert f"wider.pt: weight {key}" in err and "Traceback" not in err
    other_vocab = {**payload, "codec": {**payload["codec"], "src_vocab": ["x"]}}
    save_checkpoint(other_vocab, tmp_path / "vocab.pt")
    err = _err(cli("average", str(tmp_path / "vocab.pt"), str(trained / "best.pt"), "-o", str(tmp_path / "x.pt"), check=False))
    assert "vocabularies differ" in err and "Traceback" not in err
    err = _err(cli("average", "--dir", str(trained), "--last", "0", "-o", str(tmp_path / "x.pt"), check=False))
    assert "--last 0: must be an integer at least 1" in err
    err = _err(cli("average", "--dir", str(trained), "-o", str(tmp_path / "x.pt"), check=False))
    assert "--dir and --last go together" in err
    assert not (tmp_path / "x.pt").exists()


def test_config_file_errors_name_the_file(cli, tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("base: " + str((Path("configs/tiny.yaml")).resolve()) + "\ntrain:\n  max_epoch: 3\n", encoding="utf-8")
    err = _err(cli("train", str(bad), "--set", f"train.save_dir={tmp_path / 'run'}", check=False))
    assert f"{bad}: unknown config key 'train.max_epoch'" in err and "Traceback" not in err


def test_reproduce_checks_overrides_before_any_run(cli, tmp_path):
    out = tmp_path / "rp"
    proc = cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), "--set", "train.lrr=1", check=False)
    assert proc.returncode == 2 and "train.lrr" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "runs").exists()


def test_evaluate_misaligned_files_are_named(cli, tmp_path):
    hyp, ref = tmp_path / "h.en", tmp_path / "r.en"
    hyp.write_text("a dog\n", encoding="utf-8")
    ref.write_text("a dog\na cat\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), check=False))
    assert f"{hyp} has 1 lines but {ref} has 2 (--hyp and --ref)" in err and "Traceback" not in err
    src = tmp_path / "s.de"
    src.write_text("ein Hund\n", encoding="utf-8")
    hyp.write_text("a dog\na cat\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--src", str(src), check=False))
    assert f"{src} has 1 lines but {ref} has 2 (--src and --ref)" in err


def test_evaluate_names_an_empty_reference_file(cli, tmp_path):
    """Empty --hyp and --ref files were 'no sentences to evaluate: the reference set is empty',
    naming neither."""
    hyp, ref = tmp_path / "h.en", tmp_path / "r.en"
    hyp.write_bytes(b"")
    ref.write_bytes(b"")
    proc = cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), check=False)
    assert proc.returncode == 2 and f"cometnmt: error: {ref}: no references (an empty file)" in _err(proc)


def test_evaluate_refuses_translate_nbest_columns_as_hypotheses(cli, tmp_path):
    """translate --nbest 1 | evaluate --hyp - scored 'index<TAB>score<TAB>text' lines as
    translations: wrong numbers, no word (9.73 BLEU for 11.14 on 100 Multi30k test lines)."""
    hyp, ref = tmp_path / "h.en", tmp_path / "r.en"
    hyp.write_text("0\t-1.25\ta dog\n0\t-0.5\ta cat\n", encoding="utf-8")
    ref.write_text("a dog\na cat\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), check=False))
    assert f"{hyp}: every line is 'index<TAB>score<TAB>text'" in err and "Traceback" not in err
    # translate --nbest 2: two lines a reference, named as n-best output, not as misaligned
    hyp.write_text("0\t-1.25\ta dog\n0\t-2.5\tdog\n1\t-0.5\ta cat\n1\t-0.75\tcat\n", encoding="utf-8")
    err = _err(cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), check=False))
    assert f"{hyp}: every line is 'index<TAB>score<TAB>text'" in err and "line-aligned" not in err
    hyp.write_text("0\t-1.25\ta dog\na cat\n", encoding="utf-8")  # one such line is text
    assert cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), check=False).returncode == 0


def test_version(cli):
    from cometnmt import __version__

    assert cli("--version").stdout.strip() == f"cometnmt {__version__}"


def test_logprob_scores_translations_and_nbest_lists(trained, cli, tmp_path, data_dir):
    """`cometnmt logprob`: a score and token count per line, totals in --json; translate --nbest
    output rescored in place (indices and texts kept); the perplexity is that of the scores."""
    import math

    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    for path, name in ((src, "test_2016_flickr.de.gz"), (ref, "test_2016_flickr.en.gz")):
        with gzip.open(data_dir / name, "rt", encoding="utf-8") as f:
            path.write_text("".join(next(f) for _ in range(9)), encoding="utf-8")
    ckpt = str(trained / "best.pt")
    out, summary = tmp_path / "scores.txt", tmp_path / "scores.json"
    proc = cli("logprob", ckpt, "-i", str(src), "-t", str(ref), "-o", str(out), "--json", str(summary), "--device", "cpu")
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 9 and all(float(r[0]) < 0 and int(r[1]) >= 2 for r in rows)
    totals = json.loads(summary.read_text())
    assert totals["pairs"] == 9 and totals["target_tokens"] == sum(int(r[1]) for r in rows)
    nll = -sum(totals["log_probs"]) / totals["target_tokens"]
    assert totals["nll_per_token"] == pytest.approx(nll) and totals["perplexity"] == pytest.approx(math.exp(nll))
    assert f"perplexity {totals['perplexity']:.2f}" in proc.stderr
    small = [line.split("\t") for line in cli("logprob", ckpt, "-i", str(src), "-t", str(ref), "--batch-size", "2").stdout.splitlines()]
    assert [float(r[0]) for r in small] == pytest.approx([float(r[0]) for r in rows], abs=1e-3)  # batches of 2
    nbest = tmp_path / "nbest.txt"
    cli("translate", ckpt, "-i", str(src), "-o", str(nbest), "--beam", "3", "--nbest", "2")
    rescored = cli("logprob", ckpt, "-i", str(src), "-t", str(nbest), "--nbest-input").stdout.splitlines()
    before = [line.split("\t") for line in nbest.read_text(encoding="utf-8").splitlines()]
    after = [line.split("\t") for line in rescored]
    assert [(r[0], r[2]) for r in after] == [(r[0], r[2]) for r in before] and len(after) == 18


def test_logprob_json_of_scores_that_are_not_numbers_is_strict_json(trained, tmp_path, capsys):
    """A checkpoint whose weights hold NaN (a diverged run's) scores NaN: logprob --json wrote NaN
    for the scores, the nats per token and the perplexity, which is not JSON (JavaScript, Go and
    jq refuse the file). They are null now, as serve answers them."""
    import torch

    from cometnmt.cli import main
    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(trained / "best.pt")
    first = next(iter(payload["model"]))
    payload["model"][first] = torch.full_like(payload["model"][first], float("nan"))
    nan_ckpt = tmp_path / "nan.pt"
    save_checkpoint(payload, nan_ckpt)
    src, tgt, out = tmp_path / "s.de", tmp_path / "t.en", tmp_path / "scores.json"
    src.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    tgt.write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    assert main(["logprob", str(nan_ckpt), "-i", str(src), "-t", str(tgt), "--json", str(out), "--device", "cpu"]) == 0
    summary = json.loads(out.read_text(encoding="utf-8"), parse_constant=lambda name: pytest.fail(f"{name} in the file"))
    assert summary["log_probs"] == [None, None] and summary["nll_per_token"] is None and summary["perplexity"] is None
    assert summary["tokens"] == [4, 4] and summary["pairs"] == 2
    capsys.readouterr()


def test_logprob_input_errors_name_the_file_and_line(trained, cli, tmp_path):
    ckpt = str(trained / "best.pt")
    src, tgt = tmp_path / "s.de", tmp_path / "t.en"
    src.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    tgt.write_text("A dog.\n", encoding="utf-8")
    err = _err(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), check=False))
    assert "t.en has 1 lines but" in err and "s.de has 2 (-t and -i)" in err and "--nbest-input" in err
    tgt.write_text("A dog.\n" + " ".join(["dog"] * 1100) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    err = _err(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), "-o", str(out), check=False))
    assert "t.en: target line 2: 1100 target tokens and <s>" in err and "Traceback" not in err and not out.exists()
    nbest = tmp_path / "n.txt"
    nbest.write_text("0\t-1.0\tA dog.\n1\tTwo cats.\n", encoding="utf-8")
    assert "n.txt, line 2: expected 'INDEX<tab>SCORE<tab>TEXT'" in _err(
        cli("logprob", ckpt, "-i", str(src), "-t", str(nbest), "--nbest-input", check=False))
    nbest.write_text("0\t-1.0\tA dog.\n2\t-1.0\tTwo cats.\n", encoding="utf-8")
    assert "n.txt, line 2: source index 2, but the source has 2 lines" in _err(
        cli("logprob", ckpt, "-i", str(src), "-t", str(nbest), "--nbest-input", check=False))
    src.write_text("Ein Hund.\n" + " ".join(["Hund"] * 1100) + "\n", encoding="utf-8")
    nbest.write_text("1\t-1.0\tA dog.\n", encoding="utf-8")  # row 1 is source line 2
    assert "s.de: source line 2: 1100 source tokens" in _err(
        cli("logprob", ckpt, "-i", str(src), "-t", str(nbest), "--nbest-input", check=False))
    src.write_text("", encoding="utf-8")
    tgt.write_text("", encoding="utf-8")  # was "0 pairs ... perplexity 1.00", exit 0
    assert "s.de: no lines to score" in _err(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), check=False))


def test_logprob_refuses_translate_nbest_columns_as_targets(trained, cli, tmp_path):
    """translate --nbest 1 output given to logprob without --nbest-input had its index and score
    scored as words of each translation: wrong numbers, no word (on 100 Multi30k validation
    lines, 1085 tokens and 2.18 nats per token for the translations' 885 and 1.72)."""
    ckpt = str(trained / "best.pt")
    src, tgt = tmp_path / "s.de", tmp_path / "t.en"
    src.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    tgt.write_text("0\t-1.2500\tA dog.\n1\t-0.5000\tTwo cats.\n", encoding="utf-8")
    err = _err(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), check=False))
    assert f"{tgt}: every line is 'index<TAB>score<TAB>text'" in err and "--nbest-input" in err and "Traceback" not in err
    assert len(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), "--nbest-input").stdout.splitlines()) == 2
    # translate --nbest 2: two lines a source, named as n-best output, not as misaligned
    tgt.write_text("0\t-1.2500\tA dog.\n0\t-2.5000\tDog.\n1\t-0.5000\tTwo cats.\n1\t-0.7500\tCats.\n", encoding="utf-8")
    err = _err(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), check=False))
    assert f"{tgt}: every line is 'index<TAB>score<TAB>text'" in err and "line-aligned" not in err
    assert len(cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), "--nbest-input").stdout.splitlines()) == 4
    tgt.write_text("0\t-1.2500\tA dog.\nTwo cats.\n", encoding="utf-8")  # one such line is text
    assert cli("logprob", ckpt, "-i", str(src), "-t", str(tgt), check=False).returncode == 0


def test_attention_heatmap_of_a_two_layer_rnn_names_its_one_attention(tmp_path, data_dir, monkeypatch):
    """The RNN attends to the source once, after the top of its model.rnn.dec_layers layers: a
    two-layer decoder's heatmap was titled 'decoder layer 1 of 1'. The title counts attention
    layers, as --layer does."""
    import cometnmt.plots
    from cometnmt.cli import main
    from cometnmt.training.run import train

    save = tmp_path / "rnn"
    train(tiny_train_cfg(save, data_dir, "data.max_train_pairs=60", "model.arch=rnn", "model.rnn.embed_dim=8",
                         "model.rnn.hidden_size=16", "model.rnn.dec_layers=2", "train.num_threads=1"))
    titles = []
    monkeypatch.setattr(cometnmt.plots, "plot_attention", lambda amap, path, title: titles.append(title))
    src = tmp_path / "s.de"
    src.write_text("Ein Hund läuft.\n", encoding="utf-8")
    assert main(["attention", str(save / "best.pt"), "-i", str(src), "-t", str(src), "--out", str(tmp_path / "att"),
                 "--plots", "1", "--device", "cpu"]) == 0
    assert titles == ["s.de, line 1; attention layer 1 of 1, heads averaged"]


def test_attention_layer_help_counts_attentions_not_decoder_layers():
    """attention --layer's help said "decoder layer, 0-based", but it counts the decoder's
    attentions over the source: one per layer for the Transformer family and ConvS2S, one for the
    RNN whatever model.rnn.dec_layers is (a two-layer RNN's --layer 1 is refused, its heatmap
    titled 'attention layer 1 of 1'). The help now says so."""
    import argparse

    from cometnmt.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["attention"]
    (layer,) = [a for a in sub._actions if "--layer" in a.option_strings]
    assert layer.help.startswith("which of the decoder's attentions over the source, 0-based (default -1, the last)")
    assert "the RNN's one, after its top layer, whatever model.rnn.dec_layers" in layer.help


def test_attention_writes_weights_and_heatmaps(trained, cli, tmp_path):
    """`cometnmt attention`: one JSON line per pair (source and target tokens, </s> last; rows of
    weights summing to 1), the model's own translations by default, heatmaps for the first --plots
    lines; bad options and misaligned files are errors naming them."""
    ckpt = str(trained / "best.pt")
    src, tgt = tmp_path / "s.de", tmp_path / "t.en"
    src.write_text("Ein Hund läuft.\nZwei Männer sitzen auf einer Bank.\nEin Kind.\n", encoding="utf-8")
    tgt.write_text("A dog runs.\nTwo men sit on a bench.\nA child.\n", encoding="utf-8")
    out = tmp_path / "att"
    cli("attention", ckpt, "-i", str(src), "-t", str(tgt), "--out", str(out), "--plots", "2", "--device", "cpu")
    records = [json.loads(line) for line in (out / "attention.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3] and records[1]["source"][:2] == ["Zwei", "Männer"]
    for r in records:
        assert r["target"][-1] == "</s>" and len(r["weights"]) == len(r["target"])
        assert all(len(row) == len(r["source"]) and abs(sum(row) - 1) < 1e-3 for row in r["weights"])
    assert len(records[0]["target"]) == 5 and all(t in (w, "<unk>") for t, w in zip(records[0]["target"], ["A", "dog", "runs", "."]))
    assert sorted(p.name for p in out.glob("*.png")) == ["line_0001.png", "line_0002.png"]
    own = tmp_path / "own"
    cli("attention", ckpt, "-i", str(src), "--out", str(own), "--plots", "0", "--layer", "0")
    records = [json.loads(line) for line in (own / "attention.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(r["layer"] == 0 for r in records) and not list(own.glob("*.png"))
    from cometnmt.inference import Translator

    translator = Translator.from_checkpoint(ckpt, device="cpu")
    sentences = src.read_text(encoding="utf-8").splitlines()
    assert [r["target"][:-1] for r in records] == [hyps[0].tokens for hyps in translator.translate(sentences)]  # its own best
    assert "--layer 9: the decoder has 2 layers" in _err(cli("attention", ckpt, "-i", str(src), "--out", str(own), "--layer", "9", check=False))
    tgt.write_text("A dog.\n", encoding="utf-8")
    assert "t.en has 1 lines but" in (err := _err(cli("attention", ckpt, "-i", str(src), "-t", str(tgt), "--out", str(own), check=False)))
    assert "(-t and -i); they must be line-aligned" in err


def test_attention_refuses_translate_nbest_columns_as_targets(trained, cli, tmp_path):
    """attention -t with translate --nbest 1 output attended with the index and score as the
    first target tokens ('0', '-1.2500', then the translation): rows and labels of words no
    translation holds, exit 0."""
    ckpt = str(trained / "best.pt")
    src, tgt, out = tmp_path / "s.de", tmp_path / "t.en", tmp_path / "att"
    src.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    tgt.write_text("0\t-1.2500\tA dog.\n1\t-0.5000\tTwo cats.\n", encoding="utf-8")
    err = _err(cli("attention", ckpt, "-i", str(src), "-t", str(tgt), "--out", str(out), check=False))
    assert f"{tgt}: every line is 'index<TAB>score<TAB>text'" in err and "Traceback" not in err
    assert not (out / "attention.jsonl").exists()
    tgt.write_text("0\t-1.2500\tA dog.\n0\t-2.5000\tDog.\n1\t-0.5000\tTwo cats.\n1\t-0.7500\tCats.\n", encoding="utf-8")
    err = _err(cli("attention", ckpt, "-i", str(src), "-t", str(tgt), "--out", str(out), check=False))
    assert f"{tgt}: every line is 'index<TAB>score<TAB>text'" in err and "line-aligned" not in err

def test_attention_of_blank_lines_and_a_rerun_into_the_same_folder(trained, cli, tmp_path):
    """Without -t, a blank or whitespace-only line was decoded ('<unk>' x 11 where translate leaves
    it blank); its translation is now empty (</s> alone). A rerun into the same --out with fewer
    plots left the earlier run's line_*.png beside the new attention.jsonl."""
    ckpt, out = str(trained / "best.pt"), tmp_path / "att"
    src = tmp_path / "s.de"
    src.write_text("Ein Hund läuft.\n\n   \nEin Kind.\n", encoding="utf-8")
    cli("attention", ckpt, "-i", str(src), "--out", str(out), "--plots", "4", "--device", "cpu")
    records = [json.loads(line) for line in (out / "attention.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["target"] for r in records[1:3]] == [["</s>"], ["</s>"]] and len(records[0]["target"]) > 1
    assert len(list(out.glob("line_*.png"))) == 4
    (out / "notes.png").write_bytes(b"mine")
    cli("attention", ckpt, "-i", str(src), "--out", str(out), "--plots", "1", "--device", "cpu")
    assert sorted(p.name for p in out.glob("*.png")) == ["line_0001.png", "notes.png"]  # only its own names go


def test_evaluate_refuses_the_other_modes_options(cli, tmp_path):
    """--hyp/--ref beside --checkpoint scored the checkpoint's translations and ignored the file; --beam beside
    --hyp/--ref was ignored: each is an error naming the option, before any checkpoint is read."""
    (tmp_path / "h").write_text("a\n", encoding="utf-8")
    err = _err(cli("evaluate", "--checkpoint", str(tmp_path / "none.pt"), "--hyp", str(tmp_path / "h"),
                   "--ref", str(tmp_path / "h"), check=False))
    assert "--hyp, --ref: only without --checkpoint" in err and "not found" not in err
    err = _err(cli("evaluate", "--checkpoint", str(tmp_path / "none.pt"), "--lang", "fr", check=False))
    assert "--lang: only without --checkpoint" in err
    err = _err(cli("evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "h"), "--beam", "5",
                   "--split", "valid", check=False))
    assert "--split, --beam: only with --checkpoint" in err and "Traceback" not in err


@pytest.fixture
def clash_files(tmp_path, monkeypatch):
    """A folder of inputs for the output-clash tests (run in-process from it): dummy checkpoints
    (refused before any is loaded) and one-line text files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "att").mkdir()
    for name in ("copy.pt", "other.pt", "run/epoch001.pt", "run/epoch002.pt", "run/best.pt"):
        (tmp_path / name).write_bytes(b"PK\x03\x04 a dummy checkpoint " + name.encode())
    for name in ("src.txt", "s2.txt", "ref.txt", "r2.txt", "hyp.txt", "att/attention.jsonl", "att/line_0001.png"):
        (tmp_path / name).write_text(f"{name}\n", encoding="utf-8")
    (tmp_path / "link.pt").symlink_to("other.pt")
    return tmp_path


def _main(capsys, *args: str) -> tuple[int, str]:
    from cometnmt import cli

    code = cli.main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["translate", "copy.pt", "-i", "src.txt", "-o", "copy.pt"], "-o copy.pt and checkpoint copy.pt: the same file"),
    (["translate", "copy.pt", "-i", "s2.txt", "-o", "./s2.txt"], "-o ./s2.txt and -i s2.txt: the same file"),
    (["translate", "copy.pt", "other.pt", "-i", "src.txt", "-o", "link.pt"],  # a symlink to the ensemble's second
     "-o link.pt and checkpoint other.pt: the same file"),
    (["evaluate", "--checkpoint", "copy.pt", "--split", "valid", "--hyp-out", "copy.pt"],
     "--hyp-out copy.pt and --checkpoint copy.pt: the same file"),
    (["evaluate", "--hyp", "hyp.txt", "--ref", "r2.txt", "--json", "r2.txt"], "--json r2.txt and --ref r2.txt: the same file"),
    (["evaluate", "--hyp", "hyp.txt", "--ref", "ref.txt", "--src", "s2.txt", "--json", "s2.txt"],
     "--json s2.txt and --src s2.txt: the same file"),
    (["evaluate", "--checkpoint", "copy.pt", "--json", "same.out", "--hyp-out", "same.out"],
     "--json same.out and --hyp-out same.out: the same file; one output would replace the other"),
    (["logprob", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "--json", "copy.pt"],
     "--json copy.pt and checkpoint copy.pt: the same file"),
    (["logprob", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "-o", "ref.txt"], "-o ref.txt and -t ref.txt: the same file"),
    (["logprob", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "-o", "same.out", "--json", "./same.out"],
     "-o same.out and --json ./same.out: the same file; one output would replace the other"),
    (["attention", "copy.pt", "-i", "src.txt", "-t", "att/attention.jsonl", "--out", "att"],
     "--out att/attention.jsonl and -t att/attention.jsonl: the same file"),
    (["attention", "copy.pt", "-i", "att/line_0001.png", "--out", "att"],
     "--out att/line_0001.png and -i att/line_0001.png: the same file"),
    (["average", "run/epoch001.pt", "run/epoch002.pt", "-o", "run/epoch002.pt"],
     "-o run/epoch002.pt and checkpoint run/epoch002.pt: the same file"),
    (["average", "--dir", "run", "--last", "2", "-o", "run/epoch001.pt"], "-o run/epoch001.pt and checkpoint run/epoch001.pt"),
    (["average", "run/epoch001.pt", "run/epoch002.pt", "-o", "run/best.pt"],
     "-o run/best.pt: a name the trainer gives the run's own checkpoints"),
    (["average", "run/epoch001.pt", "run/epoch002.pt", "-o", "run/epoch003.pt"],  # --dir run --last 2 would take it
     "-o run/epoch003.pt: a name the trainer gives the run's own checkpoints"),
])
def test_an_output_that_is_an_input_or_another_output_is_refused(clash_files, capsys, args, needle):
    """Each wrote over its input (the checkpoint, the source, the reference) or one output over
    the other, and exited 0: now exit 2 naming both options and the path, before anything is read."""
    before = {p: p.read_bytes() for p in clash_files.rglob("*") if p.is_file()}
    code, err = _main(capsys, *args)
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in clash_files.rglob("*") if p.is_file()} == before  # nothing written


@pytest.mark.parametrize("args, flag", [
    (["evaluate", "--checkpoint", "copy.pt", "--split", "valid", "--hyp-out", "-"], "--hyp-out"),
    (["evaluate", "--hyp", "hyp.txt", "--ref", "ref.txt", "--json", "-"], "--json"),
    (["evaluate", "--hyp", "hyp.txt", "--ref", "-"], "--ref"),
    (["logprob", "copy.pt", "-i", "src.txt", "-t", "-"], "-t"),
    (["logprob", "copy.pt", "-i", "-", "-t", "ref.txt"], "-i"),
    (["logprob", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "--json", "-"], "--json"),
    (["attention", "copy.pt", "-i", "-", "--out", "att"], "-i"),
    (["attention", "copy.pt", "-i", "src.txt", "--out", "-"], "--out"),
    (["average", "run/epoch001.pt", "run/epoch002.pt", "-o", "-"], "-o"),
])
def test_dash_where_it_is_no_stream_is_refused_by_name(clash_files, capsys, args, flag):
    """'-' is stdin/stdout for translate -i/-o, logprob -o and evaluate --hyp; elsewhere an input
    '-' was "-: file not found" and an output was written to a file named '-' (evaluate
    --hyp-out - beside its table on stdout, exit 0): now exit 2 naming the option, nothing written."""
    code, err = _main(capsys, *args)
    assert code == 2 and f"{flag} -: give a file name" in err, err
    assert not (clash_files / "-").exists()


def test_a_source_file_given_as_a_checkpoint_gets_a_hint(clash_files, capsys):
    """`translate best.pt src.de` (no -i) read the source as an ensemble's second checkpoint and
    said only "src.txt: not a checkpoint"; now the error says to give it with -i."""
    code, err = _main(capsys, "translate", "src.txt", "src.txt")
    assert code == 2 and "src.txt: not a checkpoint" in err and "a source file? give it as -i FILE" in err, err
    code, err = _main(capsys, "translate", "src.txt", "-i", "s2.txt")  # with -i given, no such hint
    assert code == 2 and "not a checkpoint" in err and "-i FILE" not in err, err


def test_outputs_of_their_own_are_not_clashes(clash_files, capsys):
    """A new name in the run folder (the README's avg.pt), or distinct outputs, pass the check
    (and reach the dummy checkpoint)."""
    for args in (["average", "--dir", "run", "--last", "2", "-o", "run/avg.pt"],
                 ["translate", "copy.pt", "-i", "src.txt", "-o", "out.txt"],
                 ["logprob", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "-o", "scores.txt", "--json", "scores.json"],
                 ["evaluate", "--checkpoint", "copy.pt", "--json", "r.json", "--hyp-out", "hyp.out"],
                 ["attention", "copy.pt", "-i", "src.txt", "-t", "ref.txt", "--out", "att"]):
        code, err = _main(capsys, *args)
        assert code == 2 and "not a readable cometnmt checkpoint" in err and "the same file" not in err, (args, err)


def test_missing_data_file_names_the_config_key(cli, tmp_path):
    err = _err(cli("train", "configs/tiny.yaml", "--set", "data.corpus=files", "--set", "data.train_src=nope.de",
                   "--set", "data.train_tgt=nope.en", "--set", "data.valid_src=nope.de", "--set", "data.valid_tgt=nope.en",
                   "--set", f"train.save_dir={tmp_path}/run", check=False))
    assert "config key 'data.train_src': nope.de: file not found" in err and "current folder" in err


def test_translate_names_replace_unk_as_the_flag_given(trained, monkeypatch, capsys):
    """translate --replace-unk on a SentencePiece model named 'decode.replace_unk', a config key
    the checkpoint has false, where evaluate --checkpoint and serve name '--replace-unk'."""
    import copy
    import types

    from cometnmt import cli
    from cometnmt.inference import Translator

    load = Translator.from_checkpoint

    def pieces(*args, **kwargs):  # the tiny model with a SentencePiece target side, as far as the check looks
        translator = load(*args, **kwargs)
        translator.codec = copy.deepcopy(translator.codec)
        translator.codec.tgt_tok = types.SimpleNamespace(kind="sentencepiece")
        return translator

    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(pieces))
    code = cli.main(["translate", str(trained / "best.pt"), "--replace-unk", "--device", "cpu", "-i", "/dev/null"])
    assert code == 2 and capsys.readouterr().err.startswith("cometnmt: error: --replace-unk: copies source words")


def test_ctrl_c_outside_training_is_one_line(monkeypatch, capsys):
    from cometnmt import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_translate", interrupted)
    try:
        code = cli.main(["translate", "x.pt"])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main() (a traceback on the command line)")
    assert code == 130
    assert capsys.readouterr().err.strip() == "cometnmt translate: interrupted"


@pytest.mark.parametrize("interrupted", [False, True])
def test_another_ranks_usage_error_is_named_in_one_line_not_shown_again(monkeypatch, capsys, tmp_path, interrupted):
    """Rank 1 of 2 stops with rank 0's usage error (a DataError rank 0 sent while it prepared the
    data), alone or with an interrupt it held: ``cometnmt train`` on rank 1 says which rank failed
    doing what, and not the error, which rank 0 shows on the terminal the ranks share (exit 2, as
    rank 0's; 130 for the interrupt). Before, it showed the error a second time ("rank 0 failed
    preparing the data: data/train.de:7: ..."). A Python caller still gets a DataError with the
    whole message."""
    from cometnmt import cli
    from cometnmt.errors import DataError
    from cometnmt.training import run as run_module
    from cometnmt.training.distributed import rank_error

    error = rank_error(0, "DataError", "data/train.de:7: a tab in the line", "Traceback ...", "preparing the data")
    assert type(error) is DataError and str(error) == "rank 0 failed preparing the data: data/train.de:7: a tab in the line"

    def train(cfg, **kwargs):
        if not interrupted:
            raise error
        raise KeyboardInterrupt from error  # as interrupts.deferred raises a signal held during a failure

    monkeypatch.setattr(run_module, "train", train)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "configs/tiny.yaml", "--set", f"train.save_dir={tmp_path / 'run'}"]) == (
        130 if interrupted else 2)
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("cometnmt: error: rank 1 of 2 stopped training: rank 0 failed preparing the data "
                                   "(DataError); that rank's own output shows the error"), err
    assert "a tab in the line" not in err, err


def test_another_ranks_usage_error_keeps_the_config_keys_it_names(monkeypatch, capsys, tmp_path):
    """A usage error relayed from another rank kept its message and lost ``keys``, the config keys
    it names: on the failing rank the error names the file (or --set) that gave them, on the others
    (a Python caller's) it named none. The keys travel with it now (distributed.sent), so the relayed
    error is named as the failing rank's, and ``cometnmt train`` still shows its one line."""
    from cometnmt import cli
    from cometnmt.config import name_origin
    from cometnmt.errors import DataError
    from cometnmt.training import run as run_module
    from cometnmt.training.distributed import rank_error, sent

    found = DataError("config key 'data.max_train_pairs': 2000 is more than the corpus holds",
                      keys=("data.max_train_pairs",))
    kind, message, trace, keys = sent(found)
    error = rank_error(0, kind, message, trace, "preparing the data", keys)
    assert type(error) is DataError and error.keys == ("data.max_train_pairs",)  # before: ()
    named = name_origin(error, "configs/tiny.yaml", [])
    assert str(named) == f"configs/tiny.yaml: {error}" and named.relayed_line == error.relayed_line
    assert name_origin(error, "configs/tiny.yaml", ["data.max_train_pairs=5"]) is error  # the override's

    def train(cfg, **kwargs):
        raise error

    monkeypatch.setattr(run_module, "train", train)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "configs/tiny.yaml", "--set", f"train.save_dir={tmp_path / 'run'}"]) == 2
    assert capsys.readouterr().err == ("cometnmt: error: rank 1 of 2 stopped training: rank 0 failed preparing "
                                       "the data (DataError); that rank's own output shows the error\n")


def test_an_error_line_is_one_write(monkeypatch, tmp_path):
    """``cometnmt: error: ...`` reaches standard error in one write, its newline included: print()
    wrote the text and the newline apart, so with an unbuffered standard error (PYTHONUNBUFFERED=1)
    two ranks' lines on a shared terminal ran together."""
    import io
    import sys

    from cometnmt import cli
    from cometnmt.training import run as run_module
    from cometnmt.training.distributed import rank_error

    writes = []

    class Unbuffered(io.StringIO):  # every write as it came, as an unbuffered stream passes them on
        def write(self, text):
            writes.append(text)
            return super().write(text)

    def train(cfg, **kwargs):
        raise rank_error(0, "DataError", "data/train.de:7: a tab in the line", "", "preparing the data")

    monkeypatch.setattr(run_module, "train", train)
    monkeypatch.setattr(sys, "stderr", Unbuffered())
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train", "configs/tiny.yaml", "--set", f"train.save_dir={tmp_path / 'run'}"]) == 2
    line = ("cometnmt: error: rank 1 of 2 stopped training: rank 0 failed preparing the data (DataError); "
            "that rank's own output shows the error\n")
    assert line in writes, writes


def test_ctrl_c_while_train_starts_says_nothing_was_written(monkeypatch, capsys):
    """Importing torch and checking the config take seconds; Ctrl-C then escaped cmd_train's
    handler (only 'cometnmt train: interrupted', no word on what to do)."""
    from cometnmt import cli, config

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(config, "load_config", interrupted)
    assert cli.main(["train", "configs/tiny.yaml"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted while starting; nothing was written (run the same command again)"


def test_a_second_signal_while_the_first_is_handled_is_not_a_traceback(monkeypatch, capsys):
    """SIGTERM right behind SIGINT (reproduce stopping a training the terminal's Ctrl-C reached):
    the second was raised in the command's own interrupt handling and cut it short (here the
    print; in main's except clause, a _Terminated traceback and exit 1). Now it is noted: the
    handling finishes, exit 130 with the one line, and SIGTERM's handler is put back."""
    import signal
    import sys
    import threading

    from cometnmt import cli

    def interrupted(args):
        both = {signal.SIGINT, signal.SIGTERM}
        try:  # both arrive at once: SIGINT (the lower number) is raised first, SIGTERM at the next check
            signal.pthread_sigmask(signal.SIG_BLOCK, both)  # pending on this thread (os.kill's could
            try:  # reach another thread at once)
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            finally:  # never left blocked: the children pytest starts later would inherit it
                signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
            pytest.fail("no interrupt")
        except KeyboardInterrupt as exc:
            assert type(exc) is KeyboardInterrupt  # the SIGINT
            print("handled", file=sys.stderr)  # the command's own handling (train saves last.pt here)
            raise

    monkeypatch.setattr(cli, "cmd_translate", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    code = cli.main(["translate", "x.pt"])
    assert code == 130 and capsys.readouterr().err.strip().splitlines() == ["handled", "cometnmt translate: interrupted"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_language_spacy_lacks_names_the_config_key(cli, tmp_path):
    (tmp_path / "a").write_text("one\ntwo\n", encoding="utf-8")
    files = [f"data.{key}={tmp_path}/a" for key in ("train_src", "train_tgt", "valid_src", "valid_tgt")]
    args = ["train", "configs/tiny.yaml", "--set", "data.corpus=files", "--set", "data.tgt_lang=xq",
            "--set", f"train.save_dir={tmp_path}/run"]
    for override in files:
        args += ["--set", override]
    err = _err(cli(*args, check=False))
    assert "config key 'data.tgt_lang': spaCy has no tokenizer for language 'xq'" in err and "sentencepiece" in err


def test_sigterm_is_ctrl_c_for_every_command(trained, data_dir):
    """SIGTERM killed translate (and the other commands but train, reproduce, compare and serve)
    outright: no message, and a half-written output's temporary file left behind. It now ends a
    command as Ctrl-C does, with exit 143."""
    import os
    import select
    import signal
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt"), "--interactive"],
                            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write("Ein Hund läuft.\n".encode())
        proc.stdin.flush()
        assert select.select([proc.stdout], [], [], 300)[0] and proc.stdout.readline()  # loaded and answering
        proc.send_signal(signal.SIGTERM)  # while it waits for the next line
        assert proc.wait(timeout=60) == 143
    finally:
        proc.kill()
    err = proc.stderr.read().decode("utf-8")
    assert err.rstrip().endswith("cometnmt translate: interrupted") and "Traceback" not in err


def test_translate_interactively_answers_each_line_as_it_comes(trained, data_dir):
    """--interactive (the default on a terminal): each line's translation is written before the next
    line is read, a line that cannot be translated gets its error and the session goes on, and the
    translations are those of the file mode."""
    import os
    import select
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt"), "--interactive"],
                            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def answer(line: bytes) -> str:
        proc.stdin.write(line)
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        assert ready, "no translation came back before the next line was sent"
        return proc.stdout.readline().decode("utf-8")

    try:
        first = answer("Ein Hund läuft.\n".encode())
        proc.stdin.write(("Hund " * 1100 + "\n").encode() + b"Zwei \xff Katzen.\n")  # too long; not UTF-8
        second = answer("Zwei Kinder spielen.\n".encode())
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    err = proc.stderr.read().decode("utf-8")
    assert "line 2: 1100 source tokens" in err and "line 3: not valid UTF-8" in err and "Traceback" not in err
    batch = subprocess.run([sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt")], cwd=REPO, env=env,
                           input="Ein Hund läuft.\nZwei Kinder spielen.\n", capture_output=True, text=True, check=True)
    assert [first, second] == [line + "\n" for line in batch.stdout.splitlines()]
    refused = subprocess.run([sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt"), "--interactive",
                              "-o", "x.txt"], cwd=REPO, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "leave out -i and -o" in refused.stderr


def test_an_interactive_sessions_warnings_and_errors_name_its_line(monkeypatch, caplog, capsys):
    """Each line of a session is read on its own: its NFC warning named "line 1" whatever the
    line, where its errors named the session's line."""
    import io
    import logging
    import sys
    import types
    import unicodedata

    from cometnmt.cli import _translate_interactively
    from cometnmt.inference import Translation

    nfd = unicodedata.normalize("NFD", "Ein Mädchen.").encode("utf-8")
    stdin = types.SimpleNamespace(buffer=io.BytesIO(b"Ein Hund.\n" + nfd + b"\nZwei \xff Katzen.\n"), isatty=lambda: False)
    monkeypatch.setattr(sys, "stdin", stdin)
    translator = types.SimpleNamespace(translate=lambda texts, decode, start: [[Translation("x", 0.0, [])] for _ in texts])
    with caplog.at_level(logging.WARNING, logger="cometnmt.data.corpus"):
        assert _translate_interactively(translator, None, False) == 0
    (record,) = caplog.records
    assert "<stdin>: 1 line is not in Unicode NFC (first: line 2)" in record.getMessage()
    out, err = capsys.readouterr()
    assert out == "x\nx\n" and "cometnmt: error: line 3: not valid UTF-8 (byte 0xff at column 6)" in err


def _interactive_errors(monkeypatch, capsys, stdin_bytes, ready: bool = True) -> list[str]:
    """The error lines a translate --interactive session writes for standard input ``stdin_bytes``
    (read from a file, as `translate --interactive < FILE` reads it; not ``ready``: from a stream
    whose next bytes cannot be seen before they are read, as a pipe's whose writer sends a line at a
    time), no model needed: a stand-in translator answers 'x'."""
    import io
    import sys
    import tempfile
    import types

    from cometnmt.cli import _translate_interactively
    from cometnmt.inference import Translation

    translator = types.SimpleNamespace(translate=lambda texts, decode, start: [[Translation("x", 0.0, [])]
                                                                               for _ in texts])
    with tempfile.TemporaryFile() as f:
        f.write(stdin_bytes)
        f.seek(0)
        with open(f.fileno(), "rb", closefd=False) if ready else io.BytesIO(stdin_bytes) as buffer:
            monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=buffer, isatty=lambda: False))
            assert _translate_interactively(translator, None, False) == 0
    out, err = capsys.readouterr()
    return err.splitlines()


def test_interactive_keeps_the_byte_order_its_first_line_shows(monkeypatch, capsys):
    """translate --interactive splits its input at b"\\n" before decoding: every line of UTF-16BE
    after the first that opens with a character below U+0100 ("\\0Two men") is the same bytes as a
    UTF-16LE line cut after its b"\\n" and was named UTF-16LE, with an iconv command that garbles
    the file (line 1: UTF-16BE). The encoding is judged once, from line 1, and every line is named
    so, at its line of the input, once: little-endian's last piece, the NULs ending line 3's line
    break (b"\\n" | b"\\0"), got a second error of line 3; an input without NUL bytes is read as before."""
    for encoding in ("UTF-16BE", "UTF-32BE", "UTF-16LE", "UTF-32LE"):
        errors = _interactive_errors(monkeypatch, capsys, "A dog runs.\nTwo men talk.\nЕще.\n".encode(encoding))
        numbers = [1, 2, 3]
        assert len(errors) == len(numbers), (encoding, errors)
        for number, error in zip(numbers, errors):
            assert error.startswith(f"cometnmt: error: line {number}: "), (encoding, error)
            assert error.endswith(f"iconv -f {encoding} -t UTF-8 FILE > FILE.utf8"), (encoding, error)
    (stray,) = _interactive_errors(monkeypatch, capsys, "Ein Hund.\nZwei\0 Männer.\n".encode())
    assert stray.startswith("cometnmt: error: line 2: a NUL character") and "stray byte in UTF-8 text" in stray, stray
    # stray NULs in a UTF-8 first line (where they stand tells no encoding): that line alone is refused
    (stray,) = _interactive_errors(monkeypatch, capsys, "Zwei\0\0 Männer.\nDrei Hunde.\n".encode())
    assert stray.startswith("cometnmt: error: line 1: a NUL character"), stray


def test_interactive_names_the_line_and_column_of_utf16_and_utf32_in_their_characters(monkeypatch, capsys):
    """translate --interactive refuses every line of UTF-16 or UTF-32 input, and the session goes
    on: each line of such input after the first was numbered by the 0x0a bytes read before it, more
    than one a line where its characters hold them (U+0A0A, U+010A) and the line break's, so the
    CJK character on line 41 (U+72D7, whose 0xd7 byte is no UTF-8) was named at line 164,
    column 2 or 4, and a file of 42 lines had errors up to line 168 or 169. Each error names the
    input's own line and column: line 41, column 3, and lines 1 to 42 alone, in order."""
    import re

    text = "ਊĊ ein Hund.\n" * 40 + "ਊĊ狗\n" + "ਊĊ.\n"
    for codec, encoding in (("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"), ("utf-32-le", "UTF-32LE"),
                            ("utf-32-be", "UTF-32BE"), ("utf-16", "UTF-16"), ("utf-32", "UTF-32")):
        errors = _interactive_errors(monkeypatch, capsys, text.encode(codec))
        assert len(errors) > 120, (codec, len(errors))  # a piece ends at each 0x0a byte: each refused
        (bad,) = [error for error in errors if "0xd7" in error]
        assert bad.startswith("cometnmt: error: line 41: not valid UTF-8 (byte 0xd7 at column 3); "), (codec, bad)
        assert bad.endswith(f"it looks like {encoding}: convert it with iconv -f {encoding} -t UTF-8 FILE > FILE.utf8")
        numbers = [int(re.match(r"cometnmt: error: line (\d+): ", error).group(1)) for error in errors]
        assert numbers == sorted(numbers) and set(numbers) == set(range(1, 43)), (codec, numbers)


def test_cjk_utf16_and_utf32_are_named_by_every_reader_that_splits_its_input(monkeypatch, capsys, tmp_path):
    """translate's chunks and --interactive's lines are split at b"\\n" before they are decoded: of
    CJK text in UTF-16 or UTF-32 without a byte order mark a character whose code unit holds 0x0a
    (上 U+4E0A: b"\\x0a\\x4e" in UTF-16LE) is cut there, so the first chunk of --buffer-size 1 was
    b"\\x0a", an empty line translated without a word (UTF-16BE's b"N\\n": the line 'N'), and the
    pieces after it got another byte order or none. The encoding is judged from the input's start
    before it is split (the first chunk or line and the bytes there after it), and every reader
    refuses it naming it (its lines numbered by 0x0a bytes, as before), with the iconv command that converts the text."""
    import sys
    import types

    from cometnmt.data.corpus import read_lines
    from cometnmt.errors import DataError
    from cometnmt.streaming import ChunkedInput

    text = "上海的一只狗在草地上奔跑。\n两个男人在街上说话。\n"
    for encoding in ("UTF-16LE", "UTF-16BE", "UTF-32LE", "UTF-32BE"):
        data = text.encode(encoding)
        path = tmp_path / f"zh.{encoding}.txt"
        path.write_bytes(data)
        zipped = tmp_path / f"zh.{encoding}.gz"
        zipped.write_bytes(gzip.compress(data))
        for name in (path, zipped):
            with pytest.raises(DataError, match=rf"^{name}:\d+: .*iconv -f {encoding} -t UTF-8 ") as info:
                read_lines(name)
            for size in (1, 2, 100):  # translate --buffer-size
                chunked = ChunkedInput(str(name), size)
                try:
                    with pytest.raises(DataError, match=rf"^{name}:\d+: ") as info:
                        next(chunked.chunks())  # the first chunk: none is translated
                finally:
                    chunked.close()
                assert f"iconv -f {encoding} -t UTF-8 " in str(info.value), (encoding, name, size, str(info.value))
        with open(path, "rb") as stdin:  # translate < FILE
            monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=stdin))
            chunked = ChunkedInput(None, 1)
            with pytest.raises(DataError, match=rf"^<stdin>:\d+: .*iconv -f {encoding} -t UTF-8 FILE > FILE.utf8$"):
                next(chunked.chunks())  # the first chunk: none is translated
        errors = _interactive_errors(monkeypatch, capsys, data)  # translate --interactive < FILE
        assert errors and errors[0].startswith("cometnmt: error: line 1: "), (encoding, errors)  # not translated
        for error in errors:
            assert error.endswith(f"iconv -f {encoding} -t UTF-8 FILE > FILE.utf8"), (encoding, error)


def test_utf16_whose_start_does_not_show_it_is_refused_by_the_later_piece_that_does(monkeypatch, capsys):
    """Of a pipe whose first line comes alone (no bytes there after it to judge: a writer sending a
    line at a time) the readers that split at b"\\n" judge UTF-16 from that line only. CJK text
    without a byte order mark whose first character is 上 (U+4E0A: b"\\x0a\\x4e" in UTF-16LE) gives
    a first piece of b"\\x0a", an empty line (UTF-16BE's b"N\\n": the line 'N'), which shows nothing
    and is translated. The pieces after it were read alone, from a byte inside a character: the
    second chunk was named UTF-16BE for UTF-16LE text, and --interactive translated the pieces that
    happened to be UTF-8 ('NTY\u044d0'), named others WINDOWS-1252 or a stray NUL, and numbered
    them by 0x0a bytes. The first piece that shows UTF-16, read from its first whole code unit, is
    refused saying the input is UTF-16 in the byte order it has, that its start did not show it,
    and how to convert it; --interactive refuses every piece after it too, naming it."""
    import io
    import re
    import sys
    import types

    from cometnmt.errors import DataError
    from cometnmt.streaming import ChunkedInput

    text = "上海的一只狗在草地上奔跑。\n两个男人在街上说话。\n"
    for order in ("LE", "BE"):
        data = text.encode(f"utf-16-{order.lower()}")
        iconv = f"convert it with iconv -f UTF-16{order} -t UTF-8 FILE > FILE.utf8"
        misread = (rf"the input is probably UTF-16{order} without a byte order mark, which its first (byte|\d+ bytes) "
                   rf"did not show: .*; {iconv}$")
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))  # translate --buffer-size 1
        chunks = ChunkedInput(None, 1).chunks()
        assert next(chunks)[1] == ["" if order == "LE" else "N"]  # the start shows nothing
        with pytest.raises(DataError, match=f"^<stdin>:2: {misread}"):
            next(chunks)
        errors = _interactive_errors(monkeypatch, capsys, data, ready=False)
        assert re.match(f"cometnmt: error: line 2: {misread}", errors[0]), (order, errors[0])
        assert all(error.endswith(iconv) for error in errors), (order, errors)
        # every piece after the first refused, once (LE's last piece, the NUL ending the line break, is none)
        numbers = [int(re.match(r"cometnmt: error: line (\d+): ", error).group(1)) for error in errors]
        assert numbers == [2, 3, 4, 5], (order, numbers)
    for later, error in (("Zwei\0 Männer.\n".encode(), "stray byte in UTF-8 text"),  # still named as they were
                         ("Zwei Männer.\n".encode("cp1252"), "it looks like WINDOWS-1252")):
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(b"Ein Hund.\n" + later)))
        chunks = ChunkedInput(None, 1).chunks()
        assert next(chunks)[1] == ["Ein Hund."]
        with pytest.raises(DataError, match=f"^<stdin>:2: .*{error}"):
            next(chunks)


def test_seeded_interactive_sampling_is_the_file_modes(trained, data_dir):
    """translate --interactive translates line by line; seeded, each line restarted the seed's
    stream, so line 2 was sampled as line 1 would be, not as line 2 of the same file."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    env = {**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir)}
    lines = "Ein Hund läuft.\nEin Hund läuft.\nZwei Kinder spielen.\n"
    args = [sys.executable, "-m", "cometnmt", "translate", str(trained / "best.pt"), "--sampling", "--seed", "4",
            "--temperature", "1.5", "--nbest", "2"]
    outputs = [subprocess.run(args + extra, cwd=REPO, env=env, input=lines, capture_output=True, text=True,
                              check=True).stdout for extra in ([], ["--interactive"])]
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 6


def test_file_pairs_under_the_multi30k_corpus_are_refused_when_training(cli, trained, tmp_path):
    """data.train_src/train_tgt set while data.corpus stayed 'multi30k' (the default) trained on
    Multi30k without a word: the files were never read. Training now refuses it before writing
    anything; a checkpoint whose config has such keys still loads (the check is not in validate)."""
    import torch

    from cometnmt.api import Translator

    (tmp_path / "a.de").write_text("eins\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("one\n", encoding="utf-8")
    err = _err(cli("train", "configs/tiny.yaml", "--set", f"data.train_src={tmp_path}/a.de",
                   "--set", f"data.train_tgt={tmp_path}/a.en", "--set", f"train.save_dir={tmp_path}/run", check=False))
    assert ("config keys 'data.train_src', 'data.train_tgt': set, but data.corpus is 'multi30k', which reads no file "
            "pairs") in err and "set data.corpus: files" in err
    assert not (tmp_path / "run").exists()
    payload = torch.load(trained / "best.pt", map_location="cpu", weights_only=False)
    payload["config"]["data"].update(test_src=str(tmp_path / "a.de"), test_tgt=str(tmp_path / "a.en"))
    torch.save(payload, tmp_path / "old.pt")
    assert Translator.from_checkpoint(tmp_path / "old.pt").translate(["ein Hund"])[0] == \
        Translator.from_checkpoint(trained / "best.pt").translate(["ein Hund"])[0]


def test_perplexity_past_a_floats_range_is_inf_not_an_overflow_error():
    """logprob's totals took math.exp of the nats per token, which raises OverflowError above
    ~709.78: the scores were written, then the command stopped with a traceback, without its totals
    or --json. It is inf now (--json writes it as null)."""
    import math

    from cometnmt.cli import perplexity

    assert perplexity(0.0) == 1.0 and perplexity(math.log(7.5)) == pytest.approx(7.5)
    assert perplexity(710.0) == math.inf and perplexity(math.inf) == math.inf


def test_the_help_imports_neither_torch_nor_spacy():
    """``cometnmt --help`` built its parser through reproduce/compare's options, whose
    ``cometnmt.data.corpus`` import ran ``cometnmt/data/__init__.py``: torch and spaCy, ~6 s of CPU
    on every call. The data package's names are now imported on first use."""
    import subprocess
    import sys

    from conftest import REPO

    code = ("import sys; from cometnmt.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'spacy', 'sacremoses', 'sentencepiece') if m in sys.modules)); "
            "import cometnmt.data as d; print(d.PAD, d.make_batches.__module__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "0 cometnmt.data.batching True"  # the names still there, on first use


@pytest.mark.parametrize("argv, fixed", [
    (["train", "--config", "configs/tiny.yaml", "--set", "train.lr=1e-3"], "cometnmt train configs/tiny.yaml --set train.lr=1e-3"),
    (["-v", "train", "--config=configs/tiny.yaml"], "cometnmt -v train configs/tiny.yaml"),
    (["translate", "--checkpoint", "runs/x/best.pt", "-i", "src.de"], "cometnmt translate runs/x/best.pt -i src.de"),
    (["attention", "--model", "best.pt", "-i", "src.de", "--out", "att"], "cometnmt attention best.pt -i src.de --out att"),
    (["compare", "--configs", "a.yaml", "b.yaml", "--seeds", "1"], "cometnmt compare a.yaml b.yaml --seeds 1"),
])
def test_a_positional_argument_given_as_an_option_gets_the_command_to_type(capsys, argv, fixed):
    """`cometnmt train --config X.yaml` (other toolkits' habit) said only 'unrecognized arguments:
    --config', and `--config=X.yaml` that the argument config was required; `translate --checkpoint
    CKPT` the same. The error now names the option and prints the command line without it."""
    from cometnmt import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "there is no such option" in err and "by position: " + fixed in err, err


def test_evaluate_keeps_its_checkpoint_option(capsys, tmp_path):
    """evaluate's --checkpoint is an option (it scores --hyp/--ref without one): not refused as above."""
    from cometnmt import cli

    assert cli.main(["evaluate", "--checkpoint", str(tmp_path / "none.pt")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_the_attention_heatmaps_colour_bar_says_what_it_measures(monkeypatch, tmp_path):
    """The heatmap's colour bar ran 0 to 1 under no label, the reader left to guess it was the
    attention weight (and not, say, a probability of the target token)."""
    import matplotlib.figure

    from cometnmt.inference import AttentionMap
    from cometnmt.plots import plot_attention

    labels = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: labels.append([ax.get_ylabel() for ax in fig.axes]))
    plot_attention(AttentionMap(["a", "b"], ["x", "</s>"], [[0.3, 0.7], [0.9, 0.1]], 0), tmp_path / "a.png", "t")
    assert labels == [["target", "attention weight"]]


def test_evaluate_checkpoint_limit_scores_the_first_lines_of_the_split(trained, cli, tmp_path, capsys):
    """The API's evaluate_checkpoint(limit=N) had no command-line form: a smoke check of a trained
    model with `cometnmt evaluate --checkpoint` decoded the whole split. --limit N scores its first N
    sentences, said in the table; it is refused without --checkpoint, and below 1."""
    from cometnmt import cli as cli_module
    from cometnmt.data.corpus import read_lines

    hyp, out = tmp_path / "valid.hyp", tmp_path / "valid.json"
    proc = cli("evaluate", "--checkpoint", str(trained / "best.pt"), "--split", "valid", "--limit", "7",
               "--hyp-out", str(hyp), "--json", str(out))
    result = json.loads(out.read_text())
    assert result["n_sentences"] == 7 == len(read_lines(hyp)) and result["limit"] == 7
    assert f"(the first 7 of its {result['reference_lines']} lines)" in proc.stdout
    assert cli_module.main(["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--limit", "3"]) == 2
    assert "--limit: only with --checkpoint" in capsys.readouterr().err
    assert cli_module.main(["evaluate", "--checkpoint", str(trained / "best.pt"), "--limit", "0"]) == 2
    assert "--limit 0: a number of sentences, at least 1" in capsys.readouterr().err
