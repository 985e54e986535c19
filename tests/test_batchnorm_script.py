"""The analysis scripts on tiny COMET runs, none touching the checkpoint: batchnorm_by_length.py
(statistics by length bucket; decoding with running vs per-length statistics),
bn_length_ablation.py (a per-length checkpoint, encoder or decoder, decoded with its per-length and its pooled statistics),
decoder_bn_leak.py (a temporal-convolution decoder scored with its batch norms on four kinds of statistics), and
replace_unk_effect.py (outputs scored with <unk>, a placeholder word and the copied source words)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch

from test_arch_cli import REPO, cometnmt, data_dir


def tiny_run(run, *extra: str):
    """A one-epoch tiny.yaml training run in ``run`` (COMET unless ``extra`` says otherwise); its
    best.pt weights."""
    sets = ["model.arch=comet", "data.max_train_pairs=300", "data.max_valid_pairs=15", "train.max_epochs=1",
            "train.num_threads=1", "train.progress=false", f"train.save_dir={run}", *extra]
    cometnmt("train", "configs/tiny.yaml", *[a for s in sets for a in ("--set", s)])
    return torch.load(run / "best.pt", map_location="cpu", weights_only=False)["model"]


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COMETNMT_MULTI30K_DIR": str(data_dir()), "OMP_NUM_THREADS": "1"})


def test_batchnorm_by_length_reports_mismatch_and_per_length_decoding(tmp_path):
    run = tmp_path / "run"
    before = tiny_run(run)
    out = tmp_path / "bn.json"
    proc = script("scripts/batchnorm_by_length.py", str(run / "best.pt"), "--max-pairs", "300", "--eval-split", "valid",
                  "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert sum(result["batches_per_bucket"].values()) > 0
    norms = result["mismatch"]
    assert len(norms) == 2 * 3  # tiny.yaml: 2 encoder units x 3 gated convolutions
    assert all(math.isfinite(v) and v >= 0 for cols in norms.values() for v in cols.values())
    n = sum(v for k, v in result["running"].items() if k.endswith(" n"))
    assert n == 15 and set(result["running"]) == set(result["per_length"]) == set(result["all_batches"])
    after = torch.load(run / "best.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the script never writes the checkpoint


def test_batchnorm_by_length_covers_a_temporal_convolution_decoder(tmp_path):
    """The decoder's batch norms are measured over the same training batches (teacher-forced) and
    decoded with per-length statistics too, besides a decode that gives them to the encoder only."""
    run = tmp_path / "run"
    tiny_run(run, "model.comet.decoder=temporal_conv")
    out = tmp_path / "bn.json"
    proc = script("scripts/batchnorm_by_length.py", str(run / "best.pt"), "--max-pairs", "300", "--eval-split", "valid",
                  "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    norms = result["mismatch"]
    assert sum(name.startswith("encoder.") for name in norms) == 2 * 3
    assert sum(name.startswith("decoder.") for name in norms) == 2 * 3  # tiny.yaml: 2 decoder units
    assert all(math.isfinite(v) and v >= 0 for cols in norms.values() for v in cols.values())
    assert set(result["per_length_encoder_only"]) == set(result["per_length"]) == set(result["running"])
    assert "per length, encoder only" in proc.stdout


def test_decoder_bn_leak_script_on_a_tiny_run(tmp_path):
    """scripts/decoder_bn_leak.py: teacher-forced loss with the decoder's batch norms on running,
    own-batch, other-batch and pooled statistics; refused where the decoder has no batch norm."""
    run = tmp_path / "run"
    before = tiny_run(run, "model.comet.decoder=temporal_conv")
    out = tmp_path / "leak.json"
    proc = script("scripts/decoder_bn_leak.py", str(run / "best.pt"), "--batch-tokens", "64", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["batches"] >= 2 and result["decoder_batch_norms"] == 2 * 3  # tiny.yaml: 2 decoder units
    losses = result["loss"]
    assert set(losses) == {"running", "own batch", "other batch", "pooled"}
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    assert losses["own batch"] != losses["running"]  # the statistics reached the decoder
    after = torch.load(run / "best.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the script never writes the checkpoint
    plain = tmp_path / "plain"
    tiny_run(plain, "model.comet.decoder=temporal_conv", "model.comet.decoder_batch_norm=false")
    proc = script("scripts/decoder_bn_leak.py", str(plain / "best.pt"))
    assert proc.returncode != 0 and "decoder_batch_norm" in proc.stderr


def test_bn_length_ablation_script_on_a_tiny_run(tmp_path):
    run = tmp_path / "run"
    before = tiny_run(run, "model.comet.bn_length_bounds=[8,11]")
    out = tmp_path / "ablation.json"
    proc = script("scripts/bn_length_ablation.py", str(run / "best.pt"), "--limit", "15", "--bootstrap", "50", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {r["split"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"valid", "test"}
    for r in results.values():
        assert r["sentences"] == 15 and r["buckets"] == ["1-8", "9-11", "12+"]
        for mode in ("per_length", "pooled"):
            sc = r["scores"][mode]
            assert 0 <= sc["paper_bleu"] <= 100 and sum(sc["by_length"][f"{b} n"] for b in r["buckets"]) == 15
        assert 0 <= r["bootstrap"]["paper"]["p_value"] <= 1
    after = torch.load(run / "best.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the script never writes the checkpoint
    plain = tmp_path / "plain"
    tiny_run(plain)  # COMET without length buckets
    proc = script("scripts/bn_length_ablation.py", str(plain / "best.pt"))
    assert proc.returncode != 0 and "bn_length_bounds" in proc.stderr


def test_bn_length_ablation_script_on_a_decoder_length_run(tmp_path):
    """A temporal-convolution decoder with per-source-length statistics (the encoder with one set):
    its pooled decode differs from its per-length one only through the decoder's buckets."""
    run = tmp_path / "run"
    tiny_run(run, "model.comet.decoder=temporal_conv", "model.comet.decoder_bn_length_bounds=[8,11]")
    out = tmp_path / "ablation.json"
    proc = script("scripts/bn_length_ablation.py", str(run / "best.pt"), "--splits", "valid", "--limit", "15",
                  "--bootstrap", "50", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (r,) = json.loads(out.read_text())["results"]
    assert r["sentences"] == 15 and r["buckets"] == ["1-8", "9-11", "12+"]
    assert all(0 <= r["scores"][m]["paper_bleu"] <= 100 for m in ("per_length", "pooled"))
    proc = script("scripts/batchnorm_by_length.py", str(run / "best.pt"), "--max-pairs", "300")
    assert proc.returncode != 0 and "decoder_bn_length_bounds" in proc.stderr
    leak = tmp_path / "leak.json"  # the leak script runs on per-length decoder statistics too
    proc = script("scripts/decoder_bn_leak.py", str(run / "best.pt"), "--batch-tokens", "200", "--out", str(leak))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(math.isfinite(v) for v in json.loads(leak.read_text())["loss"].values())


def test_replace_unk_effect_script_on_a_tiny_run(tmp_path):
    """scripts/replace_unk_effect.py: three versions of one translation, scored; the tiny model
    writes <unk> often, so the copies differ from the placeholder."""
    run = tmp_path / "run"
    tiny_run(run)
    out = tmp_path / "effect.json"
    proc = script("scripts/replace_unk_effect.py", str(run / "best.pt"), "--splits", "valid", "--limit", "12",
                  "--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [result] = json.loads(out.read_text())
    assert result["split"] == "valid" and result["sentences"] == 12
    assert 0 < result["unk_tokens"] <= result["output_tokens"] and 0 <= result["copies_in_reference"] <= result["unk_tokens"]
    assert set(result["scores"]) == {"as written", "placeholder", "replace_unk"}
    assert all(0 <= s["bleu"] <= 100 and 0 <= s["chrf"] <= 100 for s in result["scores"].values())
    assert "copies found in their reference" in proc.stdout
