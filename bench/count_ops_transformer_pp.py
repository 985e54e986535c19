"""ATen operators (views apart) of one training forward+backward of Transformer++ and its
same-size Transformer at the en->de presets' sizes, on the CPU, and the operators by name where
the two differ. A GPU step at Multi30k's batch sizes is bound by kernel launches, so this count is
a proxy for GPU step time that needs no GPU (CPU code paths, e.g. SDPA's math path, differ).

The source side is unpadded by default, as most training batches are (they are cut from one
source length), and the models get the mask the trainer gives them (``training_source_mask``:
None there). ``--padded`` pads the last 3 positions of every other sentence instead.

    python bench/count_ops_transformer_pp.py [--batch 64] [--src-len 14] [--tgt-len 15] [--padded]
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import OpCounter  # noqa: E402

from cometnmt.config import load_config  # noqa: E402
from cometnmt.models import build_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRESETS = ["transformer_pp_en_de", "transformer_pp_baseline_en_de"]


def count(preset: str, B: int, S: int, T: int, padded: bool, vocab: int = 8000) -> OpCounter:
    cfg = load_config(REPO / "configs" / "multi30k" / f"{preset}.yaml")
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, vocab, 0).train()
    src, tgt = torch.randint(4, vocab, (B, S)), torch.randint(4, vocab, (B, T))
    mask = torch.zeros(B, S, dtype=torch.bool)
    if padded:
        mask[::2, -3:] = True  # half the sentences padded
        src[mask] = 0
    batch = SimpleNamespace(src=src, src_pad_mask=mask, n_src_tokens=int((~mask).sum()))
    mask = model.training_source_mask(batch)  # None where unpadded and the model takes None, as the trainer
    extra = {}
    if cfg.model.arch == "transformer_pp":
        extra = {"tags": {"pos": torch.randint(0, 17, (B, S)), "ner": torch.randint(0, 37, (B, S))}}

    def step() -> None:
        logits = model(src, mask, tgt, **extra)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        for value, weight in model.extra_losses().values():
            loss = loss + weight * value
        loss.backward()

    step()  # the first call may dispatch set-up operators
    model.zero_grad(set_to_none=True)
    counter = OpCounter()
    with counter:
        step()
    return counter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=14)
    p.add_argument("--tgt-len", type=int, default=15)
    p.add_argument("--padded", action="store_true", help="pad half the source sentences (default: none padded)")
    args = p.parse_args(argv)
    a, b = (count(name, args.batch, args.src_len, args.tgt_len, args.padded) for name in PRESETS)
    for name, c in zip(PRESETS, (a, b)):
        print(f"{name}: {c.ops} operators, {c.views} views (forward + backward, batch "
              f"{args.batch} x {args.src_len} -> {args.tgt_len}, source {'half padded' if args.padded else 'unpadded'})")
    print(f"ratio {a.ops / b.ops:.2f}\n\n{'operator':<40}{PRESETS[0][:14]:>15}{'baseline':>10}{'diff':>7}")
    for k in sorted(set(a.by_name) | set(b.by_name), key=lambda k: (-(a.by_name[k] - b.by_name[k]), k)):
        if a.by_name[k] != b.by_name[k]:
            print(f"{k:<40}{a.by_name[k]:>15}{b.by_name[k]:>10}{a.by_name[k] - b.by_name[k]:>+7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
