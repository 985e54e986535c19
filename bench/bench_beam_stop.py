"""Beam search's early stop (``decoding._settled``): a sentence leaves the batch once no live
hypothesis can outscore its best finished one, not only at ``beam_size`` finished (fairseq's rule).
For each length penalty, both rules translate Multi30k's test sources (German) through
``Translator.translate`` in turns (off, on, on, off, ... for ``--rounds``); the table gives each
rule's seconds (the median over rounds), the decoder rows it stepped (rows x steps, summed) and
whether the translations are the same.

    python bench/bench_beam_stop.py                                  # trains configs/tiny.yaml first (~1 min)
    python bench/bench_beam_stop.py --checkpoint best.pt --threads 2

Nothing is asserted; ``--out`` writes the results as JSON with the command that made them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def search_bench_parser(description: str, rounds: str) -> argparse.ArgumentParser:
    """The options this script and bench_precision.py share; ``rounds``: what a round times."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--checkpoint", help="a trained checkpoint (default: train configs/tiny.yaml for a minute)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    p.add_argument("--sentences", type=int, help="translate only the first N test sentences (default: all 1,000)")
    p.add_argument("--rounds", type=int, default=2, help=f"rounds, each timing {rounds} (default 2)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="also write the results to this JSON file")
    return p


def parse_search_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: must be at least 1")
    return args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = search_bench_parser(__doc__.split("\n\n")[0], "both rules")
    p.add_argument("--length-penalty", type=float, nargs="+", default=[0.0, 0.5, 1.0],
                   help="the length penalties (alpha) to run (default 0 0.5 1)")
    return parse_search_args(p, argv)


def load_translator(args: argparse.Namespace):
    """(the Translator of ``--checkpoint`` on ``--device``, its path); without ``--checkpoint``,
    configs/tiny.yaml trained for a minute first (the path then names a folder already removed)."""
    from bench_serve import multi30k_dir, tiny_checkpoint
    from cometnmt.inference import Translator

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or str(tiny_checkpoint(Path(tmp) / "run", multi30k_dir()))
        return Translator.from_checkpoint(checkpoint, device=args.device), checkpoint


def write_record(args: argparse.Namespace, script: str, argv: list[str] | None, record: dict) -> None:
    """``--out``'s JSON: ``record`` with the date, the command that reruns it and the machine."""
    import torch

    from bench import run_header

    if args.out:
        record = {**run_header(torch.device(args.device), script, argv), "threads": torch.get_num_threads(), **record}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import cometnmt.decoding as decoding

    if args.threads:
        torch.set_num_threads(args.threads)
    from bench_serve import test_sources

    sentences = test_sources("de", args.sentences)
    early = decoding._settled
    rules = {"off": lambda bucket, beam_size, nbest, reachable: len(bucket) >= beam_size, "on": early}
    translator, checkpoint = load_translator(args)
    rows, step = [0], translator.model.step

    def counting(tokens, state):
        rows[0] += tokens.numel()
        return step(tokens, state)

    translator.model.step = counting
    results = []
    try:
        translator.translate(sentences[:8], beam=args.beam)  # untimed warm-up
        for alpha in args.length_penalty:
            seconds = {name: [] for name in rules}
            stepped, texts = {}, {}
            for r in range(args.rounds):
                for name in (["off", "on"] if r % 2 == 0 else ["on", "off"]):
                    decoding._settled = rules[name]
                    rows[0] = 0
                    start = time.perf_counter()
                    out = translator.translate(sentences, beam=args.beam, length_penalty=alpha)
                    seconds[name].append(time.perf_counter() - start)
                    stepped[name], texts[name] = rows[0], [[t.text for t in hyps] for hyps in out]
            median = {name: statistics.median(s) for name, s in seconds.items()}
            results.append({"length_penalty": alpha, "seconds": median, "seconds_per_round": seconds,
                            "rows_stepped": stepped, "rows_saved": 1 - stepped["on"] / stepped["off"],
                            "time_on_over_off": median["on"] / median["off"],
                            "same_translations": sum(a == b for a, b in zip(texts["off"], texts["on"])) / len(sentences)})
    finally:
        decoding._settled = early
    print(f"{'alpha':>5} {'off s':>7} {'on s':>7} {'on/off':>6} {'rows off':>9} {'rows on':>9} {'saved':>6} {'same':>6}")
    for r in results:
        print(f"{r['length_penalty']:5.2f} {r['seconds']['off']:7.2f} {r['seconds']['on']:7.2f} "
              f"{r['time_on_over_off']:6.3f} {r['rows_stepped']['off']:9d} {r['rows_stepped']['on']:9d} "
              f"{r['rows_saved']:6.1%} {r['same_translations']:6.1%}")
    write_record(args, __file__, argv, {"checkpoint": checkpoint, "beam": args.beam, "sentences": len(sentences),
                                        "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
