"""Does COMET's batch norm see different statistics in training than at test time, by sentence length?

Training batches are cut from length-sorted buckets (token budget), so a batch holds sentences of
about one length, and batch norm normalises it with that batch's own statistics. At test time every
sentence is normalised with the running statistics, an average over all training batches. If the
statistics depend on sentence length, short (and long) sentences are normalised differently at test
time than in training: a candidate cause of COMET's deficit on short sentences (Figure 4).

For a COMET checkpoint this script runs the encoder over the training batches exactly as the trainer
cuts them, its batch norms normalising with batch statistics as in training (dropout off, running
statistics restored afterwards), and for every MaskedBatchNorm reports by the batch's mean source
length (a temporal-convolution decoder's batch norms too: its teacher-forced pass over the same
batches, still grouped by the source length, which is known when translating):

* shift: mean over channels of |batch mean - running mean| / running std;
* scale: mean over channels of |log(batch var / running var)| / 2 (log of the std ratio).

With ``--eval-split``, it also decodes that split greedily three times: with the running statistics,
with the mean statistics of all training batches (the control: no moving-average noise, no length),
and with each length bucket's own training statistics; and prints the paper's metric by source
length for each. With decoder batch norms, a fourth decode gives per-length statistics to the
encoder's batch norms only (the decoder keeps its running statistics), which separates the two.

    python scripts/batchnorm_by_length.py runs/multi30k/comet/best.pt [--eval-split valid] [--out bn.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from cometnmt.data.batching import collate, make_batches
from cometnmt.data.pipeline import encode_pairs, read_split
from cometnmt.inference import Translator
from cometnmt.models.comet import MaskedBatchNorm

BUCKETS = [(1, 8), (9, 11), (12, 14), (15, 18), (19, 1000)]  # mean source tokens of a batch


def bucket_of(length: float) -> str:
    for lo, hi in BUCKETS:
        if lo <= round(length) <= hi:
            return f"{lo}-{hi}" if hi < 1000 else f"{lo}+"
    return "?"


def batch_moments(translator: Translator, batches: list[list[int]], data) -> list[dict]:
    """Per batch: mean source length and each batch norm's batch mean/var over real positions."""
    model = translator.model
    norms = [(name, m) for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm)]
    if not norms:
        sys.exit("this checkpoint has no batch norm (not COMET, or comet.batch_norm: false)")
    if any(m.length_bounds for _, m in norms):
        sys.exit("this checkpoint already keeps batch-norm statistics per length (comet.bn_length_bounds or "
                 "comet.decoder_bn_length_bounds): scripts/bn_length_ablation.py compares them with pooled ones")
    decoder_norms = any(name.startswith("decoder.") for name, _ in norms)
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(name):
        def record(module, inputs):
            x, pad_mask = inputs[:2]  # (x, pad_mask[, lengths])
            mean, var, _ = MaskedBatchNorm.moments(x, pad_mask)
            seen[name] = (mean, var)
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in norms]
    saved = {name: (m.running_mean.clone(), m.running_var.clone()) for name, m in norms}
    for _, m in norms:
        m.train()  # batch statistics, as in training; the rest of the model stays in eval mode
    rows = []
    with torch.no_grad():
        for idx in tqdm(batches, desc="model over training batches", unit="batch"):
            b = collate([data.src_ids[i] for i in idx], [data.tgt_ids[i] for i in idx], idx)
            memory = model.encode(b.src, b.src_pad_mask)
            if decoder_norms:  # teacher-forced, as in training
                model.decode(b.tgt_in, memory)
            rows.append({"length": b.n_src_tokens / len(idx), "moments": dict(seen)})
    for name, m in norms:
        m.eval()
        m.running_mean.copy_(saved[name][0])
        m.running_var.copy_(saved[name][1])
    for h in handles:
        h.remove()
    return rows


def mismatch(rows: list[dict], translator: Translator) -> dict:
    norms = {name: m for name, m in translator.model.named_modules() if isinstance(m, MaskedBatchNorm)}
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        b = bucket_of(row["length"])
        for name, (mean, var) in row["moments"].items():
            m = norms[name]
            std = (m.running_var + m.eps).sqrt()
            shift = ((mean - m.running_mean).abs() / std).mean().item()
            scale = (0.5 * torch.log((var + m.eps) / (m.running_var + m.eps))).abs().mean().item()
            out[name][f"{b} shift"].append(shift)
            out[name][f"{b} scale"].append(scale)
    return {name: {k: statistics.fmean(v) for k, v in cols.items()} for name, cols in out.items()}


def mean_moments(rows: list[dict]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Batch norm -> (mean, var) averaged over the batches in ``rows``."""
    return {n: (torch.stack([r["moments"][n][0] for r in rows]).mean(0), torch.stack([r["moments"][n][1] for r in rows]).mean(0))
            for n in rows[0]["moments"]}


def per_length_stats(rows: list[dict]) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Bucket -> batch norm -> (mean, var) averaged over the training batches of that bucket."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[bucket_of(row["length"])].append(row)
    return {b: mean_moments(group) for b, group in groups.items()}


def encoder_only(stats: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """``stats`` without the decoder's batch norms (they keep their running statistics)."""
    return {b: {n: v for n, v in per.items() if not n.startswith("decoder.")} for b, per in stats.items()}


def pooled_stats(rows: list[dict]) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """The control for :func:`per_length_stats`: every bucket gets the mean over all training batches
    (a re-estimate of the running statistics without their moving-average noise or length)."""
    pooled = mean_moments(rows)
    return {bucket_of(lo): pooled for lo, _ in BUCKETS}


def decode_by_length(translator: Translator, split: str, stats=None) -> dict[str, float]:
    """The paper's metric per source-length bucket, decoding each bucket's sentences greedily with
    the running statistics (``stats`` None) or with that bucket's training statistics."""
    import dataclasses

    from cometnmt.data.tokenizers import metric_tokenizer
    from cometnmt.evaluation import paper_sentence_bleu

    cfg = translator.cfg
    corpus = read_split(cfg.data, split)
    tgt_tok = metric_tokenizer(cfg.data.tgt_lang)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(corpus.src):
        groups[bucket_of(len(translator.codec.src_tok.tokenize(s)))].append(i)
    norms = {name: m for name, m in translator.model.named_modules() if isinstance(m, MaskedBatchNorm)}
    saved = {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in norms.items()}
    decode = dataclasses.replace(cfg.decode, method="greedy")
    scores = {}
    for b, idx in sorted(groups.items()):
        if stats is not None and b in stats:
            for n, (mean, var) in stats[b].items():
                norms[n].running_mean.copy_(mean)
                norms[n].running_var.copy_(var)
        hyps = [h[0].text for h in translator.translate([corpus.src[i] for i in idx], decode)]
        scores[b] = statistics.fmean(paper_sentence_bleu(tgt_tok.tokenize(h), tgt_tok.tokenize(corpus.tgt[i]))
                                     for h, i in zip(hyps, idx))
        scores[f"{b} n"] = len(idx)
        for n, m in norms.items():
            m.running_mean.copy_(saved[n][0])
            m.running_var.copy_(saved[n][1])
    return scores


def overall(scores: dict[str, float], labels: list[str]) -> float:
    """The whole split's mean from the buckets' means, weighted by their sentence counts."""
    n = sum(scores.get(f"{b} n", 0) for b in labels)
    return sum(scores[b] * scores[f"{b} n"] for b in labels if f"{b} n" in scores) / n if n else math.nan


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--max-pairs", type=int, default=None, help="training pairs to read (default all)")
    p.add_argument("--eval-split", choices=["valid", "test"], help="also decode this split with running vs per-length statistics")
    p.add_argument("--out", type=Path, help="JSON results")
    args = p.parse_args(argv)

    translator = Translator.from_checkpoint(args.checkpoint, "cpu")
    cfg = translator.cfg
    corpus = read_split(cfg.data, "train")
    if args.max_pairs:
        corpus.src, corpus.tgt = corpus.src[: args.max_pairs], corpus.tgt[: args.max_pairs]
    data = encode_pairs(translator.codec, corpus, cfg.data.max_len)
    batches = make_batches([len(s) for s in data.src_ids], [len(t) for t in data.tgt_ids], max_tokens=cfg.train.batch_tokens,
                           max_sentences=cfg.train.batch_sentences, shuffle=True, seed=cfg.train.seed * 100003,
                           bucket_width=cfg.train.bucket_width)
    rows = batch_moments(translator, batches, data)
    table = mismatch(rows, translator)
    counts = defaultdict(int)
    for row in rows:
        counts[bucket_of(row["length"])] += 1
    labels = [f"{lo}-{hi}" if hi < 1000 else f"{lo}+" for lo, hi in BUCKETS]
    print("training batches per bucket of mean source length:", dict(counts))
    print(f"{'batch norm':40s} " + " ".join(f"{b:>13s}" for b in labels))
    for name, cols in table.items():
        print(f"{name + ' shift':40s} " + " ".join(f"{cols.get(f'{b} shift', math.nan):13.3f}" for b in labels))
        print(f"{name + ' scale':40s} " + " ".join(f"{cols.get(f'{b} scale', math.nan):13.3f}" for b in labels))
    result = {"checkpoint": args.checkpoint, "batches_per_bucket": counts, "mismatch": table}
    if args.eval_split:
        running = decode_by_length(translator, args.eval_split)
        by_length = per_length_stats(rows)
        per_length = decode_by_length(translator, args.eval_split, by_length)
        pooled = decode_by_length(translator, args.eval_split, pooled_stats(rows))
        decodes = [("running", running), ("all batches", pooled), ("per length", per_length)]
        if any(n.startswith("decoder.") for n in rows[0]["moments"]):
            encoder_per_length = decode_by_length(translator, args.eval_split, encoder_only(by_length))
            decodes.insert(2, ("per length, encoder only", encoder_per_length))
            result["per_length_encoder_only"] = encoder_per_length
        print(f"\n{args.eval_split}: paper's metric by source length (greedy)")
        print(f"{'statistics':26s} " + " ".join(f"{b:>8s}" for b in labels) + f" {'all':>8s}")
        for label, sc in decodes:
            print(f"{label:26s} " + " ".join(f"{sc.get(b, math.nan):8.2f}" for b in labels) + f" {overall(sc, labels):8.2f}")
        print(f"{'sentences':26s} " + " ".join(f"{running.get(f'{b} n', 0):8d}" for b in labels))
        result.update(running=running, all_batches=pooled, per_length=per_length)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
