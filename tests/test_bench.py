"""The benchmark scripts run end to end on tiny settings (their numbers are not asserted: speed
lives in bench/, never in tests). A change that breaks a bench path the training tests do not
take (the meta-device FLOP count, the rounds, decoding three ways, the operator counter) fails
here rather than on the next GPU session."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

TINY = ["--set", "data.max_train_pairs=300", "--set", "model.d_model=32", "--set", "model.n_heads=2",
        "--set", "model.d_ff=64", "--set", "train.batch_tokens=256"]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_bench_py_trains_decodes_and_compares_in_rounds(data_dir, tmp_path):
    out = tmp_path / "cpu.json"
    proc = run("bench.py", "--steps", "2", "--warmup", "1", "--rounds", "2", "--decode-sentences", "8",
               "--threads", "1", *TINY, "--out", str(out))
    result = json.loads(out.read_text())
    assert [m["arch"] for m in result["models"]] == ["transformer", "comet"]
    for m in result["models"]:
        training, decoding = m["training"], m["decoding"]
        assert training["timed_steps"] == 2 and training["tokens_per_s"] > 0
        assert training["flops_per_target_token"] > 0 and training["aten_ops_per_step"] > 0
        assert decoding["sentences"] == 8 and decoding["greedy_equals_full_prefix"] == 1.0
    ratio = result["comet_over_transformer"]
    assert len(ratio["rounds"]["ratios"]) == 2 and ratio["ratio"] == ratio["rounds"]["median_ratio"]
    # the FLOP-normalised ratio normalises the verdict's ratio (the rounds'), not the one-after-the-other
    # runs' MFU; the rounds (2 x 1 step) time the same 2 batches as the runs, so the FLOPs per token agree
    transformer, comet = (m["training"]["flops_per_target_token"] for m in result["models"])
    assert ratio["mfu_ratio"] == pytest.approx(ratio["ratio"] * comet / transformer)
    assert "COMET/Transformer training tokens/s" in proc.stdout


def test_count_ops_compares_two_presets_operator_by_operator():
    proc = run("count_ops.py", "--presets", "comet", "transformer", "--batch", "4", "--src-len", "5", "--tgt-len", "6",
               "--vocab", "50", "--conv1d", "--precision", "bf16")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("comet: ") and "bf16, conv1d" in lines[0] and lines[1].startswith("transformer: ")
    assert lines[2].startswith("ratio comet / transformer: ")
    assert any(line.startswith("convolution ") for line in lines)  # COMET's convolutions, absent from the Transformer


def test_bench_transformer_pp_steps_both_models(data_dir, tmp_path):
    out = tmp_path / "pp.json"
    run("bench_transformer_pp.py", "--steps", "2", "--warmup", "1", "--no-tags", "--threads", "1", "--max-pairs", "300",
        "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.transformer_pp.conv_heads=2",
        "--set", "model.d_ff=64", "--batch-tokens", "256",
        "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"transformer_pp", "transformer"}
    assert all(r["timed_steps"] == 2 for r in result["results"].values()) and result["ratio_pp_over_transformer"] > 0


def test_each_checkpoint_replaces_the_model_it_was_trained_as(tmp_path):
    """--checkpoint files are matched to --models entries by config name, else by the only entry
    of their architecture; one that matches none, or a second for one entry, stops the bench
    (before: filed by architecture and looked up by preset name, so a comet_bn_length checkpoint
    left comet_bn_length a random-init model without a word)."""
    import importlib.util

    import torch

    from cometnmt.training.checkpoint import FORMAT_VERSION

    spec = importlib.util.spec_from_file_location("bench_script", REPO / "bench" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def ckpt(file: str, name: str, arch: str) -> str:
        torch.save({"format_version": FORMAT_VERSION, "config": {"name": name, "model": {"arch": arch}}, "codec": {},
                    "model": {}}, tmp_path / file)
        return str(tmp_path / file)

    bn, mine, other = ckpt("bn.pt", "comet_bn_length", "comet"), ckpt("mine.pt", "mine", "transformer"), ckpt("o.pt", "x", "comet")
    found = bench.assign_checkpoints([bn, mine], ["transformer", "comet_bn_length"])
    assert {k: v["config"]["name"] for k, v in found.items()} == {"comet_bn_length": "comet_bn_length", "transformer": "mine"}
    with pytest.raises(SystemExit, match="matches no single entry of --models comet comet_bn_length"):
        bench.assign_checkpoints([other], ["comet", "comet_bn_length"])  # two entries are COMETs
    with pytest.raises(SystemExit, match="a second checkpoint for --models entry 'comet_bn_length'"):
        bench.assign_checkpoints([bn, bn], ["comet_bn_length"])
