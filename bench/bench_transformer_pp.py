"""Training throughput of Transformer++ against the same-size Transformer on real Multi30k batches.

Both models are built from their presets (by default ``configs/multi30k/transformer_pp_en_de.yaml``
and ``transformer_pp_baseline_en_de.yaml``: d 512, 16 heads, 5 + 5 units), see the same
micro-batches of the training split (token-budget batches as the trainer makes them), and take
full training steps: forward, loss (Transformer++ adds its POS/NER losses when ``--tags``),
backward, Adam. Timed steps alternate between the two models (which goes first alternating too), so a change in machine
load hits both alike. Prints a table and writes JSON to ``--out``.

    python bench/bench_transformer_pp.py --steps 20 --out bench/results/transformer_pp_cpu.json
    python bench/bench_transformer_pp.py --device cuda --steps 100 --batch-tokens 4096 --out ...
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cometnmt.config import COMPILE_MODES, CUDA_GRAPH_MODES, load_config
from cometnmt.data.batching import collate, make_batches
from cometnmt.data.pipeline import read_split
from cometnmt.data.tagging import select_tags
from cometnmt.data.vocab import PAD
from cometnmt.models import build_model
from cometnmt.training.run import training_examples
from cometnmt.training.trainer import compile_module

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="en_de", choices=["en_de", "en_fr", "de_en"], help="which preset pair")
    p.add_argument("--set", action="append", default=[], help="override for both configs, e.g. model.d_model=256")
    p.add_argument("--max-pairs", type=int, default=3000, help="training pairs to read (batches come from these)")
    p.add_argument("--batch-tokens", type=int, default=None, help="micro-batch token budget (default: the preset's)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    p.add_argument("--warm-shapes", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the timed batches once untimed first, so the first call of a batch shape is "
                        "not timed (default: on with CUDA, where it made the model stepping first look slower)")
    p.add_argument("--tags", action=argparse.BooleanOptionalAction, default=True,
                   help="train Transformer++ with its POS/NER losses (needs the taggers); --no-tags: translation loss only")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on the CPU")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast (CUDA)")
    p.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                   help="torch.compile both models in this mode (reduce-overhead = CUDA graphs); the warm-up then "
                        "runs the timed batches twice where graphs are replayed (a shape's second call records)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def load_pair(args):
    pp_cfg = load_config(REPO / f"configs/multi30k/transformer_pp_{args.pair}.yaml",
                         [f"data.max_train_pairs={args.max_pairs}", *args.set] + ([] if args.tags else ["model.transformer_pp.tasks=[]"]))
    base_cfg = load_config(REPO / f"configs/multi30k/transformer_pp_baseline_{args.pair}.yaml", [f"data.max_train_pairs={args.max_pairs}", *args.set])
    return pp_cfg, base_cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """One model, its optimizer and a cycle over the shared micro-batches."""

    def __init__(self, name, cfg, codec, data, batches, device, precision, compile_mode=None) -> None:
        self.name, self.cfg, self.data, self.batches, self.device = name, cfg, data, batches, device
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD).to(device).train()
        self.net = self.model if compile_mode is None else compile_module(self.model, compile_mode)
        self.cuda_graphs = compile_mode in CUDA_GRAPH_MODES and device.type == "cuda"
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        self.cursor = 0
        self.seconds: list[float] = []
        self.src_tokens = self.tgt_tokens = 0

    def step(self, timed: bool) -> None:
        idx = self.batches[self.cursor % len(self.batches)]
        self.cursor += 1
        d = self.data
        batch = collate([d.src_ids[i] for i in idx], [d.tgt_ids[i] for i in idx], idx, tags=select_tags(d, idx)).to(self.device)
        extra = {"tags": batch.tags} if batch.tags else {}
        sync(self.device)
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            if self.cuda_graphs:  # as the trainer: the last step's graph outputs are dead
                torch.compiler.cudagraph_mark_step_begin()
            logits = self.net(batch.src, self.model.training_source_mask(batch), batch.tgt_in, **extra)  # B,T,V (as the trainer)
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(), ignore_index=PAD)
            for value, weight in self.model.extra_losses().values():
                loss = loss + weight * value
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(self.device)
        if timed:
            self.seconds.append(time.perf_counter() - start)
            self.src_tokens += batch.n_src_tokens
            self.tgt_tokens += batch.n_tgt_tokens

    def result(self) -> dict:
        total = sum(self.seconds)
        return {
            "arch": self.cfg.model.arch,
            "parameters": self.model.num_parameters(),
            "tag_tasks": list(self.cfg.model.transformer_pp.tasks) if self.cfg.model.arch == "transformer_pp" else [],
            "timed_steps": len(self.seconds),
            "seconds": total,
            "median_step_s": statistics.median(self.seconds),
            "step_seconds": [round(x, 4) for x in self.seconds],
            "tgt_tokens_per_s": self.tgt_tokens / total,
            "src_tgt_tokens_per_s": (self.src_tokens + self.tgt_tokens) / total,
        }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    pp_cfg, base_cfg = load_pair(args)
    codec, data = training_examples(pp_cfg, read_split(pp_cfg.data, "train"))  # the same data for both models
    budget = args.batch_tokens or pp_cfg.train.batch_tokens
    batches = make_batches([len(s) for s in data.src_ids], [len(t) for t in data.tgt_ids], max_tokens=budget, shuffle=True, seed=1)
    untagged = type(data)(data.src_ids, data.tgt_ids, data.src_text, data.tgt_text)
    runners = [Runner("transformer_pp", pp_cfg, codec, data, batches, device, args.precision, args.compile),
               Runner("transformer", base_cfg, codec, untagged, batches, device, args.precision, args.compile)]
    warm_shapes = device.type == "cuda" if args.warm_shapes is None else args.warm_shapes
    for r in runners:
        for _ in range(args.warmup):
            r.step(timed=False)
        # the timed batches untimed first: once, or twice where CUDA graphs are replayed (a new shape's
        # first call runs eagerly, its second records the graph)
        for _ in range((2 if r.cuda_graphs else 1) if warm_shapes else 0):
            r.cursor = 0
            for _ in range(args.steps):
                r.step(timed=False)
        r.cursor = 0  # both time the same batches
    for i in range(args.steps):  # interleaved step by step, the order alternating so neither always goes first
        for r in (runners if i % 2 == 0 else runners[::-1]):
            r.step(timed=True)
    results = {r.name: r.result() for r in runners}
    ratio = results["transformer_pp"]["tgt_tokens_per_s"] / results["transformer"]["tgt_tokens_per_s"]
    report = {
        "benchmark": "training tokens/s, Transformer++ vs same-size Transformer",
        "pair": args.pair,
        "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "precision": args.precision,
        "warm_shapes": warm_shapes,
        "compile": args.compile,
        "train_pairs_read": len(data),
        "batch_tokens": budget,
        "sizes": {k: getattr(pp_cfg.model, k) for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff")},
        "results": results,
        "ratio_pp_over_transformer": ratio,
    }
    print(f"{'model':<16}{'params':>12}{'tgt tok/s':>12}{'src+tgt tok/s':>15}{'median step s':>15}")
    for name, r in results.items():
        print(f"{name:<16}{r['parameters']:>12,}{r['tgt_tokens_per_s']:>12.0f}{r['src_tgt_tokens_per_s']:>15.0f}{r['median_step_s']:>15.4f}")
    print(f"ratio Transformer++ / Transformer (tgt tokens/s): {ratio:.3f}  [{report['device']}, {report['threads']} threads, "
          f"{args.steps} steps of <= {budget} tokens, tags {'on' if results['transformer_pp']['tag_tasks'] else 'off'}]")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
