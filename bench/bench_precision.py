"""Search arithmetic (``decode.precision``): greedy and beam search through ``Translator.translate``
in fp32 and under bf16 (or fp16) autocast, side by side on Multi30k's test sources (German). Each
round runs every (precision, search) once, the order rotating between rounds; the table gives
each one's seconds (the median over rounds), beam / greedy time, the speed-up over fp32, cased
sacreBLEU against the test references and the share of translations equal to fp32's.

    python bench/bench_precision.py                                   # trains configs/tiny.yaml first (~1 min)
    python bench/bench_precision.py --checkpoint best.pt --threads 2

Nothing is asserted; ``--out`` writes the results as JSON with the command that made them. bf16
pays where the hardware has bfloat16 matrix units (AMX or AVX-512 BF16 CPUs, GPUs from Ampere);
elsewhere autocast's casts can make it slower than fp32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from bench_beam_stop import parse_search_args, search_bench_parser
    from cometnmt.config import PRECISIONS

    p = search_bench_parser(__doc__.split("\n\n")[0], "every precision and search")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=PRECISIONS,
                   help="the precisions to run (default fp32 bf16); fp32 is added where missing, as the reference")
    args = parse_search_args(p, argv)
    if args.beam < 2:
        p.error(f"--beam {args.beam}: must be at least 2 (beam 1 is the greedy run)")
    args.precisions = ["fp32"] + [x for x in dict.fromkeys(args.precisions) if x != "fp32"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sacrebleu
    import torch

    from bench_beam_stop import load_translator, write_record
    from bench_serve import test_sources

    if args.threads:
        torch.set_num_threads(args.threads)
    sources, references = test_sources("de", args.sentences), test_sources("en", args.sentences)
    translator, checkpoint = load_translator(args)
    runs = [(precision, beam) for precision in args.precisions for beam in (1, args.beam)]
    for precision in args.precisions:  # untimed warm-up: first calls, and autocast's first casts
        translator.translate(sources[:8], beam=args.beam, precision=precision)
    seconds = {run: [] for run in runs}
    texts = {}
    for r in range(args.rounds):
        shift = r % len(runs)
        for run in runs[shift:] + runs[:shift]:
            precision, beam = run
            start = time.perf_counter()
            out = translator.translate(sources, beam=beam, precision=precision)
            seconds[run].append(time.perf_counter() - start)
            texts[run] = [hyps[0].text for hyps in out]
    results = []
    for precision in args.precisions:
        greedy, beam = (statistics.median(seconds[(precision, b)]) for b in (1, args.beam))
        entry = {"precision": precision, "greedy_s": greedy, f"beam{args.beam}_s": beam,
                 f"beam{args.beam}_over_greedy": beam / greedy,
                 "seconds_per_round": {f"beam{b}": seconds[(precision, b)] for b in (1, args.beam)}}
        for b in (1, args.beam):
            name = "greedy" if b == 1 else f"beam{args.beam}"
            entry[f"{name}_bleu"] = sacrebleu.corpus_bleu(texts[(precision, b)], [references]).score
            entry[f"{name}_same_as_fp32"] = sum(
                x == y for x, y in zip(texts[(precision, b)], texts[("fp32", b)])) / len(sources)
        results.append(entry)
    base = results[0]
    for entry in results:
        entry["greedy_speedup_over_fp32"] = base["greedy_s"] / entry["greedy_s"]
        entry[f"beam{args.beam}_speedup_over_fp32"] = base[f"beam{args.beam}_s"] / entry[f"beam{args.beam}_s"]
    b = f"beam{args.beam}"
    print(f"{'precision':>9} {'greedy s':>8} {b + ' s':>8} {b + '/greedy':>12} {'speed-up':>13} "
          f"{'BLEU':>11} {'same as fp32':>13}")
    for e in results:
        print(f"{e['precision']:>9} {e['greedy_s']:8.2f} {e[b + '_s']:8.2f} {e[b + '_over_greedy']:12.2f} "
              f"{e['greedy_speedup_over_fp32']:6.2f} {e[b + '_speedup_over_fp32']:6.2f} "
              f"{e['greedy_bleu']:5.2f} {e[b + '_bleu']:5.2f} {e['greedy_same_as_fp32']:6.1%} {e[b + '_same_as_fp32']:6.1%}")
    write_record(args, __file__, argv, {"checkpoint": checkpoint, "beam": args.beam, "sentences": len(sources),
                                        "rounds": args.rounds, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
