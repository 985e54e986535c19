"""ATen operators (views apart) of one training forward+backward of some presets' models, and the
operators by name where the first two differ. A GPU step at Multi30k's batch sizes is bound by
kernel launches, so this count is a proxy for GPU step time that needs no GPU. It is counted on
the CPU: CPU and CUDA code paths differ (SDPA's math path, autocast's casts), and ``--conv1d``
makes COMET's gated convolutions take their CUDA path (``GatedConv.use_conv1d``). The CPU output
layer's fp32 forward is one custom operator, ``cometnmt::blocked_linear``, counted once although
it runs one product per 512 columns (16 for 8,000 words), as CUDA's ``F.linear`` is one kernel
(``bench.OpCounter``); both models of a comparison have that layer, so the ratio is not skewed.

The source side is unpadded by default, as most training batches are (they are cut from one
source length), and the models get the mask the trainer gives them (``training_source_mask``:
None there). ``--padded`` pads the last 3 positions of every other sentence instead.

    python bench/count_ops.py                                        # Transformer++ and its baseline, en->de
    python bench/count_ops.py --presets comet transformer comet_bn_length --batch 16 --src-len 12 \\
        --tgt-len 13 --vocab 6000 --conv1d --precision bf16          # COMET's GPU path, bf16 autocast
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import OpCounter  # noqa: E402

from cometnmt.config import load_config  # noqa: E402
from cometnmt.models import build_model  # noqa: E402
from cometnmt.models.comet import GatedConv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def count(preset: str, B: int, S: int, T: int, padded: bool, vocab: int = 8000, conv1d: bool = False,
          precision: str = "fp32") -> OpCounter:
    cfg = load_config(REPO / "configs" / "multi30k" / f"{preset}.yaml")
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, vocab, 0).train()
    if conv1d:
        for m in model.modules():
            if isinstance(m, GatedConv):
                m.use_conv1d = True
    src, tgt = torch.randint(4, vocab, (B, S)), torch.randint(4, vocab, (B, T))
    mask = torch.zeros(B, S, dtype=torch.bool)
    if padded:
        mask[::2, -3:] = True  # half the sentences padded
        src[mask] = 0
    batch = SimpleNamespace(src=src, src_pad_mask=mask, n_src_tokens=int((~mask).sum()))
    mask = model.training_source_mask(batch)  # None where unpadded and the model takes None, as the trainer
    extra = {}
    if cfg.model.arch == "transformer_pp" and cfg.model.transformer_pp.tasks:
        extra = {"tags": {"pos": torch.randint(0, 17, (B, S)), "ner": torch.randint(0, 37, (B, S))}}

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(src, mask, tgt, **extra)
            loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten())
            for value, weight in model.extra_losses().values():
                loss = loss + weight * value
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # the first call may dispatch set-up operators
    counter = OpCounter()
    with counter:
        step()
    return counter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["transformer_pp_en_de", "transformer_pp_baseline_en_de"],
                   help="names under configs/multi30k/; the first two are compared operator by operator")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=14)
    p.add_argument("--tgt-len", type=int, default=15)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--padded", action="store_true", help="pad half the source sentences (default: none padded)")
    p.add_argument("--conv1d", action="store_true", help="COMET's gated convolutions on their CUDA path (F.conv1d)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: CPU autocast")
    args = p.parse_args(argv)
    counts = [count(name, args.batch, args.src_len, args.tgt_len, args.padded, args.vocab, args.conv1d, args.precision)
              for name in args.presets]
    for name, c in zip(args.presets, counts):
        print(f"{name}: {c.ops} operators, {c.views} views (forward + backward, batch {args.batch} x {args.src_len} -> "
              f"{args.tgt_len}, source {'half padded' if args.padded else 'unpadded'}, {args.precision}"
              f"{', conv1d' if args.conv1d else ''})")
    if len(counts) < 2:
        return 0
    (a, b), (na, nb) = counts[:2], args.presets[:2]
    w = max(len(na), len(nb)) + 2
    print(f"ratio {na} / {nb}: {a.ops / b.ops:.2f}\n\n{'operator':<32}{na:>{w}}{nb:>{w}}{'diff':>7}")
    for k in sorted(set(a.by_name) | set(b.by_name), key=lambda k: (-(a.by_name[k] - b.by_name[k]), k)):
        if a.by_name[k] != b.by_name[k]:
            print(f"{k:<32}{a.by_name[k]:>{w}}{b.by_name[k]:>{w}}{a.by_name[k] - b.by_name[k]:>+7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
