"""Start-up of a translator: how long loading a checkpoint and translating its first sentence take,
each in a fresh interpreter, as ``cometnmt translate`` and ``Translator.from_checkpoint`` pay them.

A spaCy-tokenized checkpoint pays for spaCy's import and ``spacy.blank`` of its source language,
and for sacremoses' import (Moses detokenizes the output); the target's spaCy pipeline is built
only where a target is tokenized (``logprob``). ``--trees`` times several cometnmt source trees
(say a checkout of an earlier commit against this one) on the same checkpoint, run by run in turn
(ABAB...), so that the machine's load falls on each alike::

    git worktree add /tmp/before HEAD~1
    python bench/startup.py --trees /tmp/before . --runs 5

Without ``--checkpoint`` a tiny spaCy-tokenized model is trained first (configs/tiny.yaml on 300
Multi30k pairs, one epoch; ``COMETNMT_MULTI30K_DIR`` as for training). The table (medians, and the
range over the runs) goes to stdout; the JSON, every run included, to ``--out`` or after the table.
Times are wall-clock seconds, and ``total_cpu_s`` the process's CPU time over the same span (all
threads; steadier than wall time on a loaded machine). torch's import (the same in every tree) is
left out of both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# one run, in a fresh interpreter whose PYTHONPATH is the tree timed
RUN = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
t0, c0 = time.perf_counter(), time.process_time()
from cometnmt.inference import Translator
t1 = time.perf_counter()
translator = Translator.from_checkpoint(sys.argv[1], device="cpu")
t2 = time.perf_counter()
loaded = sorted(m for m in ("spacy", "sacremoses") if m in sys.modules)
translator([sys.argv[2]])
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "from_checkpoint_s": t2 - t1, "first_translation_s": t3 - t2,
                  "total_s": t3 - t0, "total_cpu_s": c3 - c0, "modules_after_load": loaded,
                  "modules_after_translation": sorted(m for m in ("spacy", "sacremoses") if m in sys.modules)}))
"""
TIMES = ("import_s", "from_checkpoint_s", "first_translation_s", "total_s", "total_cpu_s")


def train_tiny(folder: Path) -> Path:
    """A tiny spaCy-tokenized checkpoint (its numbers do not matter, only what loading it costs)."""
    sys.path.insert(0, str(REPO))
    import cometnmt
    from cometnmt.config import load_config

    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        "data.max_train_pairs=300", "data.max_valid_pairs=20", "train.max_epochs=1", "train.valid_bleu=false",
        "train.progress=false", "train.num_threads=1", "train.keep_checkpoints=1", f"train.save_dir={folder}",
        "data.tokenizer=spacy",
    ])
    cometnmt.train(cfg)
    return folder / "best.pt"


def time_once(tree: Path, checkpoint: Path, sentence: str, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", RUN, str(checkpoint), sentence, str(threads)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"startup.py: a run in {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def commit(tree: Path) -> str | None:
    """The tree's git commit (short), "+" where its files differ from it; None outside git."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else "")


def summary(runs: list[dict]) -> dict:
    out = {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                 "max": max(r[key] for r in runs)} for key in TIMES}
    out["modules_after_load"] = runs[-1]["modules_after_load"]
    out["modules_after_translation"] = runs[-1]["modules_after_translation"]
    return out


def table(result: dict) -> str:
    head = ["tree", *TIMES, "loaded by from_checkpoint"]
    rows = [head]
    for tree in result["trees"]:
        s = tree["summary"]
        cells = [f"{s[k]['median']:.2f} ({s[k]['min']:.2f}-{s[k]['max']:.2f})" for k in TIMES]
        rows.append([tree["label"], *cells, ", ".join(s["modules_after_load"]) or "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="a checkpoint (default: train a tiny spaCy-tokenized one)")
    p.add_argument("--trees", nargs="+", type=Path, default=[REPO], help="cometnmt source trees to time (default: this one)")
    p.add_argument("--runs", type=int, default=5, help="fresh interpreters per tree (default 5)")
    p.add_argument("--sentence", default="Zwei junge Männer spielen im Park Fußball.", help="the sentence translated")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of each run (default 1: two OpenMP threads that share a loaded machine's "
                        "cores with other processes time the translation, not the start-up)")
    p.add_argument("--out", type=Path, help="JSON results (default: printed after the table)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.threads < 1:
        p.error("--runs and --threads: at least 1")
    trees = [t.resolve() for t in args.trees]
    for tree in trees:
        if not (tree / "cometnmt" / "inference.py").is_file():
            p.error(f"--trees: {tree} holds no cometnmt/inference.py; give a cometnmt source tree")
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        checkpoint = args.checkpoint or train_tiny(Path(tmp) / "run")
        runs: list[list[dict]] = [[] for _ in trees]
        for _ in range(args.runs):
            for i, tree in enumerate(trees):  # in turn, so that the machine's load falls on each alike
                runs[i].append(time_once(tree, checkpoint, args.sentence, args.threads))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "python": sys.version.split()[0],
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "checkpoint": str(args.checkpoint) if args.checkpoint else "tiny (trained)", "sentence": args.sentence,
        "threads": args.threads,
        "trees": [{"label": f"{tree.name}@{commit(tree)}", "path": str(tree), "commit": commit(tree),
                   "summary": summary(r), "runs": r} for tree, r in zip(trees, runs)],
    }
    print(table(result))
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
