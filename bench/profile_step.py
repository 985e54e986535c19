"""Where one training step of a paper-size preset spends its time, eager or compiled: mean seconds
a step and ``torch.profiler``'s operators by self time. A diagnostic, not a benchmark (one batch
shape, no trainer); bench.py is the benchmark.

    python bench/profile_step.py --preset transformer                    # eager
    python bench/profile_step.py --preset transformer --compile          # torch.compile, static shapes
    python bench/profile_step.py --preset transformer --compile --dynamic --no-dropout
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cometnmt.config import PRECISIONS, load_config  # noqa: E402
from cometnmt.decoding import precision_context  # noqa: E402
from cometnmt.models import build_model  # noqa: E402
from cometnmt.training.loss import linear_cross_entropy  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import check_step_counts  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="transformer", help="name under configs/multi30k/")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--src-len", type=int, default=15)
    p.add_argument("--tgt-len", type=int, default=16)
    p.add_argument("--vocab", type=int, nargs=2, default=[7800, 6191], metavar=("SRC", "TGT"),
                   help="vocabulary sizes (default: about Multi30k de->en's)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--dynamic", action="store_true", help="compile for dynamic shapes, as after a second batch shape")
    p.add_argument("--fallback-random", action="store_true", help="torch._inductor.config.fallback_random (ATen's RNG)")
    p.add_argument("--no-dropout", action="store_true", help="every dropout p = 0")
    p.add_argument("--loss", choices=("fused", "logits"), default="fused",
                   help="fused: the CPU trainer's output layer + loss in row blocks (loss.linear_cross_entropy, "
                        "on the decoder's features); logits: the B,T,V logits and F.cross_entropy (default: fused)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (after 3 untimed)")
    p.add_argument("--rows", type=int, default=22, help="operators listed")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="the forward and loss under autocast, as train.precision (fp16: the logits loss, as the trainer)")
    args = p.parse_args(argv)
    check_step_counts(p, args)
    if args.fallback_random:
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    torch.manual_seed(0)
    cfg = load_config(REPO / "configs" / "multi30k" / f"{args.preset}.yaml")
    V_src, V_tgt = args.vocab
    model = build_model(cfg.model, V_src, V_tgt, 0).train()
    if args.no_dropout:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    B, S, T = args.batch, args.src_len, args.tgt_len
    src, tgt, gold = torch.randint(4, V_src, (B, S)), torch.randint(4, V_tgt, (B, T)), torch.randint(4, V_tgt, (B, T))
    net = torch.compile(model, dynamic=args.dynamic or None) if args.compile else model

    if args.precision == "fp16":
        args.loss = "logits"  # the trainer fuses the loss in fp32 and bf16 only
    low = torch.bfloat16 if args.precision == "bf16" else None

    def step() -> None:
        with precision_context(torch.device("cpu"), args.precision):
            if args.loss == "fused":  # as the trainer on the CPU in fp32
                hidden = net(src, None, tgt, features_only=True)
                proj = model.out_proj
                loss = linear_cross_entropy(hidden.flatten(0, 1), proj.weight, proj.bias, gold.reshape(-1), -1, low=low)
            else:
                logits = net(src, None, tgt)
                loss = F.cross_entropy(logits.reshape(-1, V_tgt).float(), gold.reshape(-1), reduction="sum")
        loss.backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    mode = ("compiled, " + ("dynamic" if args.dynamic else "static") + " shapes") if args.compile else "eager"
    mode += "".join(f", {flag}" for flag, on in (("no dropout", args.no_dropout), ("fallback_random", args.fallback_random)) if on)
    mode += f", {args.loss} loss, {args.precision}"
    print(f"{args.preset}, {mode}: {(time.perf_counter() - start) / args.steps:.3f} s/step "
          f"(batch {B} x {S} -> {T}, {torch.get_num_threads()} threads)")
    with torch.profiler.profile() as prof:
        for _ in range(3):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
