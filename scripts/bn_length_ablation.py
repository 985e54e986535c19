"""What per-length batch-norm statistics buy at test time, on one trained checkpoint.

A COMET checkpoint trained with ``model.comet.bn_length_bounds`` (configs/multi30k/comet_bn_length.yaml)
keeps, in every encoder batch norm, running statistics per source-length bucket plus a pooled row
over all training batches (the statistics plain COMET keeps); one trained with
``model.comet.decoder_bn_length_bounds`` (configs/multi30k/comet_temporal_conv_decoder_bn_length.yaml)
keeps them in the temporal-convolution decoder's batch norms, keyed by source length too. Every batch
norm with buckets takes part (encoder, decoder or both). This script decodes valid and test
greedily twice with the same weights: each sentence normalised with its own length bucket's
statistics (as the model does), and every sentence with the pooled row. It prints the paper's
metric, sacreBLEU BLEU and chrF of both, the paper's metric per length bucket, and a paired
bootstrap test of per-length against pooled.

Why this is a clean control: in training, batch norm normalises with each batch's own statistics;
the running statistics are only bookkept (no random numbers drawn), so a comet_bn_length run and a
comet run of the same seed take the same optimisation steps (tests/test_comet.py checks it). What
differs is evaluation, and through the validation loss, which epoch is kept and when training
stops. The checkpoint here was picked with per-length statistics, which favours that side a little.

    python scripts/bn_length_ablation.py RUN/best.pt [--splits valid test] [--out ablation.json] [--limit N]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

from cometnmt.data.pipeline import read_split
from cometnmt.data.tokenizers import metric_tokenizer
from cometnmt.evaluation import evaluate, paired_bootstrap
from cometnmt.inference import Translator
from cometnmt.models.comet import MaskedBatchNorm


@contextlib.contextmanager
def pooled_statistics(model: torch.nn.Module):
    """Every sentence normalised with the pooled row: the length buckets are marked as never
    reached, so MaskedBatchNorm falls back to the pooled row for all of them (restored on exit)."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm) and m.length_bounds]
    saved = [m.bucket_batches.clone() for m in norms]
    try:
        for m in norms:
            m.bucket_batches[:-1] = 0
        yield
    finally:
        for m, counts in zip(norms, saved):
            m.bucket_batches.copy_(counts)


def length_bounds(cfg) -> list[int] | None:
    """The checkpoint's source-length bounds: the encoder's, else the decoder's (both keyed by source length)."""
    comet = cfg.model.comet
    return comet.bn_length_bounds or comet.decoder_bn_length_bounds


def bucket_labels(bounds: list[int]) -> list[tuple[str, int, int]]:
    """The model's length buckets as (label, lo, hi): <= b1, b1+1..b2, ..., > bK."""
    edges = [0, *bounds, 10**6]
    return [(f"{lo + 1}-{hi}" if hi < 10**6 else f"{lo + 1}+", lo + 1, hi) for lo, hi in zip(edges, edges[1:])]


def by_bucket(lengths: list[int], sentence_scores: list[float], buckets) -> dict[str, float]:
    out = {}
    for label, lo, hi in buckets:
        scores = [s for n, s in zip(lengths, sentence_scores) if lo <= n <= hi]
        out[label] = statistics.fmean(scores) if scores else float("nan")
        out[f"{label} n"] = len(scores)
    return out


def ablate(translator: Translator, split: str, limit: int | None, bootstrap: int) -> dict:
    cfg = translator.cfg
    corpus = read_split(cfg.data, split)
    src, refs = corpus.src[:limit], corpus.tgt[:limit]
    decode = dataclasses.replace(cfg.decode, method="greedy")
    tok = metric_tokenizer(cfg.data.tgt_lang).tokenize
    lengths = [len(t) for t in translator.codec.src_tok.tokenize_many(src)]
    buckets = bucket_labels(length_bounds(cfg))
    hyps, scores = {}, {}
    for mode in ("per_length", "pooled"):
        with pooled_statistics(translator.model) if mode == "pooled" else contextlib.nullcontext():
            hyps[mode] = [t[0].text for t in translator.translate(src, decode, progress=True)]
        res = evaluate(hyps[mode], refs, tokenize=tok, per_sentence=True)
        scores[mode] = {"paper_bleu": res["paper_bleu"], "bleu": res["bleu"], "chrf": res["chrf"],
                        "by_length": by_bucket(lengths, res["sentence_bleu"], buckets)}
    tests = {m: paired_bootstrap(hyps["per_length"], hyps["pooled"], refs, n_samples=bootstrap, metric=m, tokenize=tok)
             for m in ("paper", "bleu")}
    return {"split": split, "sentences": len(refs), "scores": scores,
            "bootstrap": {m: {k: t[k] for k in ("a", "b", "delta", "p_value", "n_samples")} for m, t in tests.items()},
            "buckets": [b[0] for b in buckets]}


def print_result(r: dict) -> None:
    labels = r["buckets"]
    print(f"\n{r['split']} ({r['sentences']} sentences), greedy")
    print(f"{'statistics':12s} {'paper':>7s} {'BLEU':>7s} {'chrF':>7s}  " + " ".join(f"{b:>7s}" for b in labels))
    for mode, sc in r["scores"].items():
        print(f"{mode:12s} {sc['paper_bleu']:7.2f} {sc['bleu']:7.2f} {sc['chrf']:7.2f}  "
              + " ".join(f"{sc['by_length'][b]:7.2f}" for b in labels))
    print(f"{'sentences':12s} {'':23s}  " + " ".join(f"{r['scores']['pooled']['by_length'][f'{b} n']:7d}" for b in labels))
    for m, t in r["bootstrap"].items():
        print(f"bootstrap {m}: per-length - pooled = {t['delta']:+.2f}, p(pooled >= per-length) = {t['p_value']:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--splits", nargs="+", choices=["valid", "test"], default=["valid", "test"])
    p.add_argument("--limit", type=int, default=None, help="first N sentences of each split (smoke runs)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap samples")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, help="JSON results")
    args = p.parse_args(argv)

    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    if translator.cfg.model.arch != "comet" or not length_bounds(translator.cfg):
        sys.exit(f"{args.checkpoint}: not a COMET checkpoint with model.comet.bn_length_bounds "
                 "or model.comet.decoder_bn_length_bounds")
    results = []
    for split in args.splits:
        r = ablate(translator, split, args.limit, args.bootstrap)
        print_result(r)
        results.append(r)
    if args.out:
        args.out.write_text(json.dumps({"checkpoint": str(args.checkpoint), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
