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

``--parser COMMAND`` times the command line's parser instead (this tree, no checkpoint): run by
run in turn, in fresh interpreters, ``build_parser()`` (every command's options) against
``build_parser(COMMAND)`` (COMMAND's alone, as ``cometnmt.cli.main`` builds it), after
``cometnmt.cli``'s import, and the whole process of ``cometnmt COMMAND --help`` run through
``cometnmt.cli.main`` with each parser (the whole one: ``main`` with build_parser's argument
dropped). Both processes must print the same help. Milliseconds; CPU times beside wall times::

    python bench/startup.py --parser translate --runs 20 --out bench/results/startup_parser_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

# --parser: build_parser(*argv) once in a fresh interpreter, cometnmt.cli imported first (untimed)
BUILD = r"""
import json, sys, time
from cometnmt.cli import build_parser
t0, c0 = time.perf_counter(), time.process_time()
build_parser(*sys.argv[1:])
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3}))
"""
# `cometnmt COMMAND --help` through main, with the parser main builds (COMMAND's options) or the whole one
HELP = {"typed": "import sys, cometnmt.cli as cli; sys.exit(cli.main())",
        "whole": "import sys, cometnmt.cli as cli; whole = cli.build_parser; cli.build_parser = lambda command: whole(); "
                 "sys.exit(cli.main())"}
# what --parser compares: its name in whole_over_typed, its row of the table, its times' keys ({}: whole, typed)
PARSER_ROWS = {"build": ("build_parser", "build_{}_ms"), "build_cpu": ("build_parser, CPU", "build_{}_cpu_ms"),
               "help": ("process", "help_{}_ms"), "help_cpu": ("process, CPU", "help_{}_cpu_ms")}
PARSER_TIMES = tuple(key.format(parser) for _, key in PARSER_ROWS.values() for parser in ("whole", "typed"))


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


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run in a fresh interpreter on this tree."""
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)


def time_parser_once(command: str) -> dict:
    """One run of --parser: the two builds and the two processes, in turn."""
    run, helps = {}, {}
    for name, args in (("whole", ()), ("typed", (command,))):
        proc = python(BUILD, *args)
        if proc.returncode != 0:
            raise SystemExit(f"startup.py: build_parser({', '.join(map(repr, args))}) failed:\n{proc.stderr[-3000:]}")
        built = json.loads(proc.stdout)
        run[f"build_{name}_ms"], run[f"build_{name}_cpu_ms"] = built["ms"], built["cpu_ms"]
    for name, code in HELP.items():
        cpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        proc = python(code, command, "--help")
        t1, cpu1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"startup.py: cometnmt {command} --help ({name} parser) failed:\n{proc.stderr[-3000:]}")
        run[f"help_{name}_ms"] = (t1 - t0) * 1e3
        run[f"help_{name}_cpu_ms"] = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) * 1e3
        helps[name] = proc.stdout
    if helps["typed"] != helps["whole"]:
        raise SystemExit(f"startup.py: cometnmt {command} --help printed another help with the typed command's parser")
    return {key: run[key] for key in PARSER_TIMES}


def time_parser(command: str, runs: int) -> dict:
    timed = [time_parser_once(command) for _ in range(runs)]
    times = spread(timed, PARSER_TIMES)
    ratios = {name: times[key.format("whole")]["median"] / times[key.format("typed")]["median"]
              for name, (_, key) in PARSER_ROWS.items()}
    return {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "python": sys.version.split()[0],
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None, "commit": commit(REPO),
            "command": command, "summary": times, "whole_over_typed": ratios, "runs": timed}


def parser_table(result: dict) -> str:
    s = result["summary"]
    lines = [f"cometnmt {result['command']} --help, {len(result['runs'])} runs: median ms (min-max)",
             f"{'':18}{'whole parser':>22}{'typed command alone':>22}  whole/typed"]
    for name, (label, key) in PARSER_ROWS.items():
        cells = [f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f})" for t in (s[key.format(p)] for p in ("whole", "typed"))]
        lines.append(f"{label:18}{cells[0]:>22}{cells[1]:>22}  {result['whole_over_typed'][name]:.2f}x")
    return "\n".join(lines)


def commit(tree: Path) -> str | None:
    """The tree's git commit (short), "+" where its files differ from it; None outside git."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else "")


def spread(runs: list[dict], keys) -> dict:
    """Each of ``keys``' median, min and max over ``runs``."""
    return {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                  "max": max(r[key] for r in runs)} for key in keys}


def summary(runs: list[dict]) -> dict:
    out = spread(runs, TIMES)
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
    p.add_argument("--parser", metavar="COMMAND",
                   help="time the command line's parser, whole and COMMAND's alone, and `cometnmt COMMAND --help`")
    p.add_argument("--checkpoint", type=Path, help="a checkpoint (default: train a tiny spaCy-tokenized one)")
    p.add_argument("--trees", nargs="+", type=Path, help="cometnmt source trees to time (default: this one)")
    p.add_argument("--runs", type=int, default=5, help="fresh interpreters per tree (default 5)")
    p.add_argument("--sentence", default="Zwei junge Männer spielen im Park Fußball.", help="the sentence translated")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of each run (default 1: two OpenMP threads that share a loaded machine's "
                        "cores with other processes time the translation, not the start-up)")
    p.add_argument("--out", type=Path, help="JSON results (default: printed after the table)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.threads < 1:
        p.error("--runs and --threads: at least 1")
    if args.parser is not None:
        return parser_main(p, args)
    trees = [t.resolve() for t in args.trees or [REPO]]
    for tree in trees:
        if not (tree / "cometnmt" / "inference.py").is_file():
            p.error(f"--trees: {tree} holds no cometnmt/inference.py; give a cometnmt source tree")
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        checkpoint = args.checkpoint or train_tiny(Path(tmp) / "run")
        runs: list[list[dict]] = [[] for _ in trees]
        for _ in range(args.runs):
            for i, tree in enumerate(trees):  # in turn, so that the machine's load falls on each alike
                runs[i].append(time_once(tree, checkpoint, args.sentence, args.threads))
    return report({
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "python": sys.version.split()[0],
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "checkpoint": str(args.checkpoint) if args.checkpoint else "tiny (trained)", "sentence": args.sentence,
        "threads": args.threads,
        "trees": [{"label": f"{tree.name}@{commit(tree)}", "path": str(tree), "commit": commit(tree),
                   "summary": summary(r), "runs": r} for tree, r in zip(trees, runs)],
    }, table, args.out)


def parser_main(p: argparse.ArgumentParser, args) -> int:
    sys.path.insert(0, str(REPO))
    from cometnmt.cli import _COMMANDS

    if args.parser not in _COMMANDS:
        p.error(f"--parser {args.parser}: not a command of cometnmt; one of {', '.join(_COMMANDS)}")
    if args.trees or args.checkpoint:
        p.error("--parser times this tree's parser alone: not with --trees or --checkpoint")
    return report(time_parser(args.parser, args.runs), parser_table, args.out)


def report(result: dict, table_of, out: Path | None) -> int:
    """The table to stdout; the JSON to ``out``, or after the table."""
    print(table_of(result))
    text = json.dumps(result, indent=1)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
