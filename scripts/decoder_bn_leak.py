"""Does a temporal-convolution COMET decoder rely on its batch norm's training-time statistics?

In training, the decoder's batch norms normalise with statistics over the whole batch of
teacher-forced targets: every later token of a sentence and every other sentence's gold target
contribute to the mean and variance a position is normalised with. Translation never has those
tokens. This script scores a split teacher-forced (validation loss, nats per target token, dropout
off) with the decoder's batch norms fed four ways, the encoder's always on their running statistics:

* running:     the running statistics, as in evaluation and translation;
* own batch:   each batch's own statistics, as in training (the information translation lacks);
* other batch: the statistics of the next batch of the split (the one before, for the last; batches
               are cut in length order, so sentences of about the same length, but other
               sentences: what statistics that merely fit the batch's lengths would give);
* pooled:      the mean of all batches' statistics (the running statistics re-estimated on the split).

If "own batch" scores far better than "other batch" and "pooled", the model has learnt to use what
the batch statistics carry about the targets, not merely statistics that fit the split better.

    python scripts/decoder_bn_leak.py runs/multi30k/comet_temporal_conv/best.pt [--split valid] [--out leak.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from cometnmt.data.batching import collate, make_batches
from cometnmt.data.pipeline import encode_pairs, read_split
from cometnmt.data.vocab import PAD
from cometnmt.inference import Translator
from cometnmt.models.comet import MaskedBatchNorm

Moments = dict[str, tuple[torch.Tensor, torch.Tensor]]  # batch norm -> (mean, biased variance)


def decoder_norms(model) -> dict[str, MaskedBatchNorm]:
    norms = {name: m for name, m in model.named_modules() if isinstance(m, MaskedBatchNorm) and name.startswith("decoder.")}
    if not norms:
        sys.exit("this checkpoint's decoder has no batch norm (not a temporal-convolution COMET with "
                 "comet.decoder_batch_norm: true)")
    return norms


@contextmanager
def running_statistics_kept(norms: dict[str, MaskedBatchNorm]):
    """The norms' running statistics as they were on entry, again on exit (however it is left)."""
    saved = {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in norms.items()}
    try:
        yield
    finally:
        for n, m in norms.items():
            m.running_mean.copy_(saved[n][0])
            m.running_var.copy_(saved[n][1])


def batch_moments(model, norms: dict[str, MaskedBatchNorm], batches) -> list[Moments]:
    """Each batch's decoder batch-norm input moments, each norm seeing the batch statistics of the
    norms before it (as in training; dropout off)."""
    seen: Moments = {}

    def hook(name):
        def record(module, inputs):
            x, pad_mask = inputs[:2]  # (x, pad_mask[, lengths])
            seen[name] = MaskedBatchNorm.moments(x, pad_mask)[:2]
        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in norms.items()]
    out = []
    try:
        with running_statistics_kept(norms), torch.no_grad():
            for m in norms.values():
                m.train()  # batch statistics; the rest of the model stays in eval mode
            for b in tqdm(batches, desc="decoder statistics", unit="batch"):
                model(b.src, b.src_pad_mask, b.tgt_in)
                out.append(dict(seen))
    finally:
        for h in handles:
            h.remove()
        for m in norms.values():
            m.eval()
    return out


def loss_with(model, norms: dict[str, MaskedBatchNorm], batches, stats_of: Optional[Callable[[int], Moments]]) -> float:
    """Teacher-forced loss, nats per target token, with batch j's decoder norms on ``stats_of(j)``
    (None: the running statistics). The running statistics are restored afterwards."""
    total, count = 0.0, 0
    with running_statistics_kept(norms), torch.no_grad():
        for j, b in enumerate(batches):
            if stats_of is not None:
                for n, (mean, var) in stats_of(j).items():
                    norms[n].running_mean.copy_(mean)
                    norms[n].running_var.copy_(var)
            logits = model(b.src, b.src_pad_mask, b.tgt_in)
            total += F.cross_entropy(logits.float().flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD, reduction="sum").item()
            count += int(b.tgt_out.ne(PAD).sum())
    return total / count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--split", choices=["valid", "test"], default="valid")
    p.add_argument("--batch-tokens", type=int, default=None, help="batch token budget (default: the checkpoint's train.batch_tokens)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--out", type=Path, help="JSON results")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    translator = Translator.from_checkpoint(args.checkpoint, "cpu")
    cfg, model = translator.cfg, translator.model.eval()
    norms = decoder_norms(model)
    data = encode_pairs(translator.codec, read_split(cfg.data, args.split), cfg.data.max_len)
    budget = args.batch_tokens or cfg.train.batch_tokens
    order = make_batches([len(s) for s in data.src_ids], [len(t) for t in data.tgt_ids], max_tokens=budget,
                         max_sentences=cfg.train.batch_sentences, shuffle=False, bucket_width=cfg.train.bucket_width)  # by length
    if len(order) < 2:
        sys.exit(f"the {args.split} split makes {len(order)} batch of {budget} tokens: 'other batch' needs two (lower --batch-tokens)")
    batches = [collate([data.src_ids[i] for i in idx], [data.tgt_ids[i] for i in idx], idx) for idx in order]
    moments = batch_moments(model, norms, batches)
    pooled = {n: (torch.stack([m[n][0] for m in moments]).mean(0), torch.stack([m[n][1] for m in moments]).mean(0))
              for n in moments[0]}
    k = len(batches)
    losses = {
        "running": loss_with(model, norms, batches, None),
        "own batch": loss_with(model, norms, batches, lambda j: moments[j]),
        "other batch": loss_with(model, norms, batches, lambda j: moments[j + 1 if j + 1 < k else j - 1]),
        "pooled": loss_with(model, norms, batches, lambda j: pooled),
    }
    print(f"{args.split}: teacher-forced loss (nats per target token), {k} batches of <= {budget} tokens, "
          f"{len(norms)} decoder batch norms")
    for label, value in losses.items():
        print(f"  decoder statistics {label:12s} {value:.4f}")
    result = {"checkpoint": args.checkpoint, "split": args.split, "batches": k, "batch_tokens": budget,
              "decoder_batch_norms": len(norms), "loss": losses}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
