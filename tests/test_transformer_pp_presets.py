"""Issue 4's presets through the real CLI: Transformer++ and its same-size Transformer in all three
directions train with `cometnmt train` (shrunk by overrides; the tagging tasks of each preset run)
and translate with `cometnmt translate` by beam search with the preset's beam size and length penalty."""

from __future__ import annotations

import gzip

import pytest
import yaml

from test_arch_cli import REPO, cometnmt, data_dir

PRESETS = [f"transformer_pp{kind}_{pair}" for pair in ("en_de", "en_fr", "de_en") for kind in ("", "_baseline")]
SHRINK = ["data.max_train_pairs=200", "data.max_valid_pairs=10", "data.sp_vocab_size=300", "model.d_model=32",
          "model.n_heads=4", "model.d_ff=64", "model.enc_layers=3", "model.dec_layers=1", "model.transformer_pp.conv_heads=2",
          "train.batch_tokens=1024", "train.accum_steps=1", "train.max_epochs=1", "train.num_threads=1",
          "train.progress=false", "train.valid_bleu_max_sentences=10"]


@pytest.fixture(scope="module")
def tag_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tags")  # shared: each direction's source is tagged once


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains_and_translates(preset, tmp_path, tag_cache):
    config = REPO / "configs" / "multi30k" / f"{preset}.yaml"
    spec = yaml.safe_load(config.read_text(encoding="utf-8"))
    save_dir = tmp_path / "run"
    sets = [*SHRINK, f"train.save_dir={save_dir}", f"model.transformer_pp.tag_cache_dir={tag_cache}"]
    cometnmt("train", str(config), *[a for s in sets for a in ("--set", s)])
    saved = yaml.safe_load((save_dir / "config.yaml").read_text(encoding="utf-8"))
    assert saved["model"]["arch"] == spec["model"]["arch"]
    if spec["model"]["arch"] == "transformer_pp":  # each tagging task of the preset shows in the log
        train = [line for line in (save_dir / "metrics.jsonl").read_text().splitlines() if '"event": "train"' in line]
        for task in spec["model"]["transformer_pp"]["tasks"]:
            assert f'"loss_{task}"' in train[-1]

    src = spec["data"]["src_lang"]
    with gzip.open(data_dir() / f"val.{src}.gz", "rt", encoding="utf-8") as f:
        sources = [next(f).rstrip("\n") for _ in range(3)]
    out = cometnmt("translate", str(save_dir / "best.pt"), "--device", "cpu", "--nbest", "2", input="".join(s + "\n" for s in sources))
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 1, 1, 2, 2]  # beam search from the preset: 2-best per sentence
