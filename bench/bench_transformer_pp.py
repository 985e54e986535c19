"""Training throughput of Transformer++ against the same-size Transformer on real Multi30k batches.

Both models are built from their presets (by default ``configs/multi30k/transformer_pp_en_de.yaml``
and ``transformer_pp_baseline_en_de.yaml``: d 512, 16 heads, 5 + 5 units), see the same
micro-batches of the training split (token-budget batches as the trainer makes them, epoch 1's
order), and take the trainer's own step, ``Trainer.train_step``: the config's ``accum_steps``
micro-batches forward and backward (the loss with label smoothing; Transformer++ adds its POS/NER
losses when ``--tags``), gradient clipping, one step of the configured Adam (fused where the
trainer fuses it) and of the schedule. A step is an optimizer step, as in training (8 micro-batches
for the presets). Timed steps alternate between the two models (which goes first alternating too),
so a change in machine load hits both alike. Prints a table and writes JSON to ``--out``.

Until 2026-11-27 the bench stepped a plain Adam (lr 1e-4, unfused) after every micro-batch, with
no clipping, schedule or label smoothing: eight optimizer steps where training takes one, so
results files written before then time more optimizer work than training does.

    python bench/bench_transformer_pp.py --steps 4 --out transformer_pp_cpu.json
    python bench/bench_transformer_pp.py --device cuda --steps 20 --batch-tokens 4096 --out ...
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from cometnmt.config import COMPILE_MODES, load_config
from cometnmt.data.pipeline import Examples, read_split
from cometnmt.data.vocab import PAD
from cometnmt.models import build_model
from cometnmt.training.run import training_examples
from cometnmt.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import check_step_counts, command_line  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="en_de", choices=["en_de", "en_fr", "de_en"], help="which preset pair")
    p.add_argument("--set", action="append", default=[], help="override for both configs, e.g. model.d_model=256")
    p.add_argument("--max-pairs", type=int, default=3000, help="training pairs to read (batches come from these)")
    p.add_argument("--batch-tokens", type=int, default=None, help="micro-batch token budget (default: the preset's)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per model (optimizer steps of train.accum_steps "
                                                        "micro-batches each)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per model first")
    p.add_argument("--warm-shapes", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the timed batches once untimed first, so the first call of a batch shape is "
                        "not timed (default: on with CUDA, where it made the model stepping first look slower)")
    p.add_argument("--tags", action=argparse.BooleanOptionalAction, default=True,
                   help="train Transformer++ with its POS/NER losses (needs the taggers); --no-tags: translation loss only")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on the CPU")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="train.precision (bf16: autocast)")
    p.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                   help="torch.compile both models in this mode (reduce-overhead = CUDA graphs); the warm-up then "
                        "runs the timed batches twice where graphs are replayed (a shape's second call records)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    check_step_counts(p, args, "the timed steps per model")
    return args


def load_pair(args, save_dir: str = "."):
    """Both presets with the bench's options as the trainer's config keys (``save_dir``: a scratch
    folder; the bench saves nothing there; no validation BLEU, and so no stopping rule on it, so the
    trainer loads no spaCy tokenizer for it: the bench validates nothing, and with --no-tags needs no
    spaCy)."""
    common = [f"data.max_train_pairs={args.max_pairs}", f"train.precision={args.precision}", "train.progress=false",
              "train.valid_bleu=false", "train.stopping=none",
              *([f"train.batch_tokens={args.batch_tokens}"] if args.batch_tokens else []),
              *(["train.compile=true", f"train.compile_mode={args.compile}"] if args.compile else []), *args.set]
    pp_cfg = load_config(REPO / f"configs/multi30k/transformer_pp_{args.pair}.yaml",
                         common + [f"train.save_dir={save_dir}/transformer_pp"] + ([] if args.tags else ["model.transformer_pp.tasks=[]"]))
    base_cfg = load_config(REPO / f"configs/multi30k/transformer_pp_baseline_{args.pair}.yaml",
                           common + [f"train.save_dir={save_dir}/transformer"])
    return pp_cfg, base_cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """One model and its trainer: ``Trainer.train_step``, the step ``cometnmt train`` takes (the
    config's accum_steps micro-batches forward and backward with its loss, label smoothing and tag
    losses, gradient clipping at train.clip_norm, the configured Adam, fused where the trainer fuses
    it, and schedule), timed on the shared steps' micro-batches."""

    def __init__(self, name, cfg, codec, data, device) -> None:
        self.name, self.cfg, self.data, self.device = name, cfg, data, device
        torch.manual_seed(cfg.train.seed)
        self.model = build_model(cfg.model, len(codec.src_vocab), len(codec.tgt_vocab), PAD).to(device).train()
        self.trainer = Trainer(cfg, self.model, codec, data, Examples([], [], [], []), device)
        self.cuda_graphs = self.trainer.cuda_graphs
        self.seconds: list[float] = []
        self.src_tokens = self.tgt_tokens = 0

    def step(self, group: list[list[int]], timed: bool) -> None:
        sync(self.device)
        start = time.perf_counter()
        _, n_tgt = self.trainer.train_step(group)  # collates its micro-batches, as in training
        sync(self.device)
        if timed:
            self.seconds.append(time.perf_counter() - start)
            self.src_tokens += sum(len(self.data.src_ids[i]) for idx in group for i in idx)
            self.tgt_tokens += n_tgt

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
            # with --compile: false where the trainer fell back to eager (torch.compile unavailable or failed)
            "compiled": self.trainer._compiled,
        }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="cometnmt-bench-pp-") as tmp:
        pp_cfg, base_cfg = load_pair(args, tmp)
        if pp_cfg.train.accum_steps != base_cfg.train.accum_steps:
            raise SystemExit(f"train.accum_steps: {pp_cfg.train.accum_steps} in the Transformer++ preset, "
                             f"{base_cfg.train.accum_steps} in its baseline's; both must step alike")
        codec, data = training_examples(pp_cfg, read_split(pp_cfg.data, "train"))  # the same data for both models
        untagged = type(data)(data.src_ids, data.tgt_ids, data.src_text, data.tgt_text)
        runners = [Runner("transformer_pp", pp_cfg, codec, data, device),
                   Runner("transformer", base_cfg, codec, untagged, device)]
        # training epoch 1's micro-batches in the trainer's order, accum_steps to a step; both models
        # step through the same ones (from --max-pairs pairs; taken again from the start where the
        # steps need more)
        batches = runners[0].trainer.epoch_batches(0)
        G = pp_cfg.train.accum_steps
        groups = [[batches[(i * G + j) % len(batches)] for j in range(G)] for i in range(args.warmup + args.steps)]
        warm_shapes = device.type == "cuda" if args.warm_shapes is None else args.warm_shapes
        for r in runners:
            # the warm-up steps, then the timed batches untimed: once, or twice where CUDA graphs are
            # replayed (a new shape's first call runs eagerly, its second records the graph)
            passes = (2 if r.cuda_graphs else 1) if warm_shapes else 0
            for group in groups[: args.warmup] + groups[args.warmup :] * passes:
                r.step(group, timed=False)
        for i, group in enumerate(groups[args.warmup :]):  # interleaved step by step, the order alternating
            for r in (runners if i % 2 == 0 else runners[::-1]):
                r.step(group, timed=True)
    results = {r.name: r.result() for r in runners}
    ratio = results["transformer_pp"]["tgt_tokens_per_s"] / results["transformer"]["tgt_tokens_per_s"]
    report = {
        "benchmark": "training tokens/s, Transformer++ vs same-size Transformer",
        "pair": args.pair,
        # it was the script's bare name, which no folder but bench/ runs, and the arguments unquoted
        "command": command_line(__file__, argv),
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "precision": args.precision,
        "warm_shapes": warm_shapes,
        "compile": args.compile,
        "train_pairs_read": len(data),
        "batch_tokens": pp_cfg.train.batch_tokens,
        "accum_steps": G,
        "micro_batches_in_epoch": len(batches),
        "step": "Trainer.train_step: accum_steps micro-batches, clipping, the configured (fused) Adam and schedule",
        "sizes": {k: getattr(pp_cfg.model, k) for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff")},
        "results": results,
        "ratio_pp_over_transformer": ratio,
    }
    print(f"command: {report['command']}")
    print(f"{'model':<16}{'params':>12}{'tgt tok/s':>12}{'src+tgt tok/s':>15}{'median step s':>15}")
    for name, r in results.items():
        print(f"{name:<16}{r['parameters']:>12,}{r['tgt_tokens_per_s']:>12.0f}{r['src_tgt_tokens_per_s']:>15.0f}{r['median_step_s']:>15.4f}")
    print(f"ratio Transformer++ / Transformer (tgt tokens/s): {ratio:.3f}  [{report['device']}, {report['threads']} threads, "
          f"{args.steps} steps of {G} micro-batches of <= {pp_cfg.train.batch_tokens} tokens, "
          f"tags {'on' if results['transformer_pp']['tag_tasks'] else 'off'}]")
    eager = [name for name, r in results.items() if args.compile and not r["compiled"]]
    if eager:  # the JSON's "compile" is what was asked for
        print(f"{' and '.join(eager)}: --compile {args.compile} FELL BACK TO EAGER (torch.compile unavailable or failed; "
              "see the log)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
