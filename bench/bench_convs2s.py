"""Greedy-decoding speed: Transformer vs ConvS2S vs the RNN encoder-decoder on Multi30k.

Decodes the source side of Multi30k test_2016_flickr (1,000 sentences, spaCy-tokenised with the
vocabularies of the presets' data config) with ``cometnmt.decoding.greedy_search``, batched as
``translate`` batches (sorted by length, ``--batch`` sentences), and reports sentences per second.
The models of a group take turns batch by batch, so their ratios are measured side by side.

The models are RANDOMLY INITIALISED (no training), so their output would stop at random lengths.
To give every model the same work, </s> is suppressed (its output bias set to -1e4, as
tests/test_decoding.py does) and every sentence is decoded to exactly
``--max-len-a * source_length + --max-len-b`` tokens (default 1.0 * S + 2, about a real
translation's length).

Models, all from the presets' shapes:
* ``matched``: the Transformer preset (configs/multi30k/transformer.yaml); ConvS2S as its preset
  (embed 256, kernel 3, dropout 0.25) with the width (256..768 channels) and depth (3..10
  encoder = decoder layers) that bring its parameter count closest to the Transformer's; the RNN
  preset with the hidden size that does the same. "The same model size" = about the same number
  of parameters.
* ``preset``: the three presets as they are (ConvS2S is then much larger).

    python bench/bench_convs2s.py [--out bench/results/convs2s.json] [--threads 1] [--batch 128,1]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from cometnmt.config import Config, load_config, to_dict
from cometnmt.data.batching import collate
from cometnmt.data.pipeline import VOCAB_COUNT, build_codec, read_split
from cometnmt.data.vocab import BOS, EOS, PAD
from cometnmt.decoding import greedy_search
from cometnmt.models import build_model
from cometnmt.models.base import Seq2Seq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import command_line  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRESETS = {name: REPO / "configs" / "multi30k" / f"{name}.yaml" for name in ("transformer", "convs2s", "rnn")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "convs2s.json"), help="JSON results file")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--batch", default="128", help="sentences per batch (decode.batch_sentences); a comma list runs each")
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=2)
    p.add_argument("--sentences", type=int, default=None, help="first N test sentences only (smoke runs)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per model; the fastest is reported")
    p.add_argument("--which", default="matched,preset", help="comma-separated: matched, preset")
    p.add_argument("--ids", help="JSON cache of the tokenised test source: read if it exists and was written for "
                                 "the Transformer preset's data config, else (re)written (lets a machine without "
                                 "spaCy run the benchmark)")
    return p.parse_args(argv)


def load_test_ids(cfg: Config, cache: str | None) -> tuple[list[list[int]], int, int]:
    """Source ids of the test split and the two vocabulary sizes (vocabularies fit on train).

    ``cache`` holds them with the data config they came from (``data``); one written for another
    data config (or without it) is rebuilt: read as it was, it gave the models the old vocabularies'
    sizes and ids, and every number of the run was for them, without a word."""
    key = {**to_dict(cfg.data), "vocab_count": VOCAB_COUNT}  # and how the vocabularies were counted
    if cache and Path(cache).exists():
        data = json.loads(Path(cache).read_text(encoding="utf-8"))
        if data.get("data") == key:
            return data["ids"], data["src_vocab"], data["tgt_vocab"]
        stored = data.get("data") or {}
        changed = sorted(k if k == "vocab_count" else f"data.{k}" for k in key if stored.get(k, "<absent>") != key[k])
        print(f"--ids {cache}: written for another data config ({', '.join(changed)} differ); rebuilding it",
              file=sys.stderr)
    codec, _, _ = build_codec(cfg.data, read_split(cfg.data, "train"))
    test = read_split(cfg.data, "test").src
    ids = [codec.encode_src(t) or [EOS] for t in codec.src_tok.tokenize_many(test)]
    if cache:
        Path(cache).write_text(json.dumps({"data": key, "ids": ids, "src_vocab": len(codec.src_vocab),
                                           "tgt_vocab": len(codec.tgt_vocab)}), encoding="utf-8")
    return ids, len(codec.src_vocab), len(codec.tgt_vocab)


def build(cfg: Config, v_src: int, v_tgt: int) -> Seq2Seq:
    torch.manual_seed(0)
    model = build_model(cfg.model, v_src, v_tgt, PAD).eval()
    with torch.no_grad():
        model.out_proj.bias[EOS] = -1e4  # never stop early: equal work for every model
    return model


def matched_configs(v_src: int, v_tgt: int) -> dict[str, Config]:
    """Transformer preset; ConvS2S and RNN resized to the Transformer's parameter count."""
    base = load_config(PRESETS["transformer"])
    target = build(base, v_src, v_tgt).num_parameters()
    out = {"transformer": base}

    def closest(preset: str, overrides: list[list[str]]) -> Config:
        cands = [load_config(PRESETS[preset], o) for o in overrides]
        return min(cands, key=lambda c: abs(build(c, v_src, v_tgt).num_parameters() - target))

    out["convs2s"] = closest("convs2s", [[f"model.convs2s.enc_layers=[[{c},3,{n}]]", f"model.convs2s.dec_layers=[[{c},3,{n}]]"]
                                         for c in range(256, 769, 64) for n in range(3, 11)])
    out["rnn"] = closest("rnn", [[f"model.rnn.hidden_size={h}"] for h in range(256, 2049, 64)])
    return out


def time_greedy(models: dict[str, Seq2Seq], ids: list[list[int]], size: int, args,
                device: torch.device) -> dict[str, tuple[float, int]]:
    """Per model: seconds to greedy-decode every sentence in batches of ``size`` (best of --repeats)
    and the tokens generated. The models take turns batch by batch (which goes first rotating), so a
    drift of the machine's speed slows them alike and the speed ratios are measured side by side;
    one model's whole run after another's let the drift between them into the ratios."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [collate([ids[i] for i in order[s : s + size]], None, order[s : s + size]).to(device)
               for s in range(0, len(order), size)]
    names = list(models)
    best, tokens = dict.fromkeys(names, float("inf")), dict.fromkeys(names, 0)
    for r in range(args.repeats):
        seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        for j, b in enumerate(batches):
            k = (r * len(batches) + j) % len(names)  # the turn goes on rotating from one repeat to the next
            for name in names[k:] + names[:k]:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                hyps = greedy_search(models[name], b.src, b.src_pad_mask, BOS, EOS, args.max_len_a, args.max_len_b)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds[name] += time.perf_counter() - start
                tokens[name] += sum(len(h.tokens) for h in hyps)
        best = {name: min(best[name], seconds[name]) for name in names}
    return {name: (best[name], tokens[name]) for name in names}


def describe(cfg: Config) -> dict:
    m = to_dict(cfg.model)
    section = {"transformer": {k: m[k] for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff")}}
    return section.get(cfg.model.arch, m.get(cfg.model.arch, {}))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    base = load_config(PRESETS["transformer"])
    ids, v_src, v_tgt = load_test_ids(base, args.ids)
    ids = ids[: args.sentences]
    groups = {}
    which = args.which.split(",")
    if "matched" in which:
        groups["matched"] = matched_configs(v_src, v_tgt)
    if "preset" in which:
        groups["preset"] = {name: load_config(path) for name, path in PRESETS.items()}

    rows = []
    for size in [int(b) for b in args.batch.split(",")]:
        for group, cfgs in groups.items():
            models = {name: build(cfg, v_src, v_tgt).to(device) for name, cfg in cfgs.items()}
            for model in models.values():
                with torch.no_grad():  # warm-up (allocator, lazy init) on up to 8 sentences
                    warm = ids[:8]
                    b = collate(warm, None, list(range(len(warm)))).to(device)
                    greedy_search(model, b.src, b.src_pad_mask, BOS, EOS, args.max_len_a, args.max_len_b)
            timed = time_greedy(models, ids, size, args, device)
            for name, cfg in cfgs.items():
                seconds, tokens = timed[name]
                rows.append({"batch": size, "group": group, "arch": name, "params": models[name].num_parameters(),
                             "config": describe(cfg), "seconds": seconds, "sentences_per_s": len(ids) / seconds,
                             "ms_per_sentence": 1000 * seconds / len(ids), "tokens": tokens, "tokens_per_s": tokens / seconds})
                print(f"batch {size:4d} {group:8s} {name:12s} {rows[-1]['params'] / 1e6:6.2f}M "
                      f"{rows[-1]['sentences_per_s']:8.1f} sent/s", file=sys.stderr)
            del models
    for row in rows:
        ref = next(r for r in rows if (r["batch"], r["group"], r["arch"]) == (row["batch"], row["group"], "transformer"))
        row["speed_vs_transformer"] = row["sentences_per_s"] / ref["sentences_per_s"]

    command = command_line(__file__, argv)  # the results files had none
    print(f"command: {command}")
    print(f"greedy decoding, Multi30k test_2016_flickr source ({len(ids)} sentences), random-init models, "
          f"</s> suppressed, length {args.max_len_a} * S + {args.max_len_b}, device {args.device}, "
          f"threads {torch.get_num_threads()}, best of {args.repeats}")
    print(f"{'batch':>5s} {'group':8s} {'arch':12s} {'params':>8s} {'sent/s':>9s} {'ms/sent':>8s} {'tok/s':>9s} {'vs transformer':>15s}  config")
    for r in rows:
        print(f"{r['batch']:5d} {r['group']:8s} {r['arch']:12s} {r['params'] / 1e6:7.2f}M {r['sentences_per_s']:9.1f} "
              f"{r['ms_per_sentence']:8.2f} {r['tokens_per_s']:9.0f} {r['speed_vs_transformer']:14.2f}x  {json.dumps(r['config'])}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": command, "sentences": len(ids), "src_vocab": v_src, "tgt_vocab": v_tgt, "batches": args.batch, "max_len_a": args.max_len_a,
            "max_len_b": args.max_len_b, "device": args.device, "threads": torch.get_num_threads(), "repeats": args.repeats,
            "torch": torch.__version__, "machine": platform.machine(), "processor": platform.processor(),
            "schedule": "the models of a group interleaved batch by batch (a drifting machine slows all alike)",
            "note": "random-init models; </s> suppressed so every model decodes the same number of tokens"}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
