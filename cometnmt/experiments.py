"""What `cometnmt reproduce` and `cometnmt compare` share: running many (config, seed) trainings
side by side, each resumable, and recording what produced the results.

Each run trains in its own subprocess (``cometnmt train PRESET --set train.seed=S``) in its own
folder. A finished run has a ``done.json`` (training record plus the caller's evaluation) and is
skipped; an interrupted one continues from its ``last.pt``. With a deadline, runs still going are
stopped with SIGTERM (the trainer saves ``last.pt`` first), an evaluation under way stops at its
next batch (no ``done.json``: evaluated again), and no new run starts, so the next call picks up
where this one stopped. ``done.json`` and ``report.json`` are strict JSON (``run_files.strict_json``:
a number that is not finite is null, named under ``nonfinite``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from cometnmt.data.corpus import write_text_file
from cometnmt.errors import CometNMTError
from cometnmt.interrupts import Stopped, stop_on
from cometnmt.progress import progress_bar
from cometnmt.training.run_files import EVAL_SPLITS, read_strict_json, strict_json

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
PRESETS = Path("configs", "multi30k")  # a checkout's Multi30k presets, from its root: reproduce's --config-dir


@dataclass(frozen=True)
class RunSpec:
    """One training run: ``name`` (a Table 1 row or a config name) trained from ``preset`` with ``seed``."""

    name: str
    preset: Path
    seed: int
    run_dir: Path


Evaluate = Callable[[Path], dict]  # run folder -> results merged into done.json


_children: set = set()  # the `cometnmt train` processes now running, stopped together on an interrupt
_children_lock = threading.Lock()
_stopping = threading.Event()


def check_run_configs(configs, overrides: list[str] | None = None) -> None:
    """What the runs' trainings will need and a config alone can tell, checked before any run
    starts (not after the others trained): file pairs data.corpus multi30k would ignore, and
    Transformer++'s tag cache folder and taggers, and that a ``cometnmt train`` process knows each
    architecture. ``configs`` are (config file, config loaded with ``overrides``) pairs; an error
    names the file (of its base chain) that set a key it names, or is the override's as it is."""
    from cometnmt.config import check_unread_files, name_origin
    from cometnmt.data.tagging import check_training_tags
    from cometnmt.errors import ConfigError, DataError

    configs = list(configs)
    for path, cfg in configs:
        try:
            check_unread_files(cfg.data)
            check_training_tags(cfg)
        except CometNMTError as exc:
            # an error naming config keys names the override or the file that gave them (--set
            # data.train_src=... was named as the file's); any other names the file it checked
            if isinstance(exc, (ConfigError, DataError)) and exc.keys:
                raise name_origin(exc, path, overrides) from None
            raise CometNMTError(f"{path}: {exc}") from None
    check_run_architectures(configs)


def check_run_architectures(configs) -> None:
    """Each run trains in a new ``cometnmt train`` process, which knows the package's architectures
    and those the modules ``$COMETNMT_PLUGINS`` names register, not one this process's script
    registered: asked in such a process (a second or two, only for an architecture not the package's),
    so that the error comes now, naming the file, not from each run's stdout.log."""
    from cometnmt.models import BUILTIN_ARCHS, PLUGINS_ENV

    own = [(path, cfg.model.arch) for path, cfg in configs if cfg.model.arch not in BUILTIN_ARCHS]
    if not own:
        return
    code = "import cometnmt.models as m; m.load_plugins(); print(' '.join(m.REGISTRY))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        last = next((line for line in reversed(proc.stderr.splitlines()) if line.strip()), f"exit {proc.returncode}")
        raise CometNMTError(f"a new process cannot list the architectures the runs' `cometnmt train` would know: {last}")
    known = proc.stdout.split()
    for path, arch in own:
        if arch not in known:
            plugins = os.environ.get(PLUGINS_ENV)
            named = f"${PLUGINS_ENV}={plugins!r} does not register it" if plugins else f"${PLUGINS_ENV} is not set"
            raise CometNMTError(f"{path}: model.arch {arch!r} is registered in this process only: each run trains in a new "
                                f"`cometnmt train` process, which knows {', '.join(known)} ({named}); name the module that "
                                f"registers it there, e.g. {PLUGINS_ENV}=my_arch (importable) or {PLUGINS_ENV}=path/to/my_arch.py")


class _EvaluationStop:
    """What asks a run's evaluation to stop (:func:`~cometnmt.interrupts.stop_on`, read by
    ``check_stop`` between decoded batches): Ctrl-C or SIGTERM (``_stopping``), or the deadline
    ``stop_at`` (a ``time.time()``; None: none) having passed. The clock is read at each check, so
    no timer thread sets an event: an evaluation that starts before the deadline stops within a
    batch of it, as a training stops at it, where it ran to its end (the whole test split, minutes
    on a CPU, past the time the caller had)."""

    def __init__(self, stop_at: Optional[float]) -> None:
        self.stop_at = stop_at

    def is_set(self) -> bool:
        return _stopping.is_set() or (self.stop_at is not None and time.time() >= self.stop_at)


def train_run(spec: RunSpec, *, overrides: list[str], device: str, stop_at: Optional[float],
              evaluate: Evaluate) -> Optional[dict]:
    """Train (or resume) one run in a subprocess, then evaluate it; returns its done.json record,
    or None when the deadline stopped it (it stays resumable)."""
    from cometnmt.training.checkpoint import LAST_CHECKPOINT, METRICS_FILE

    run = spec.run_dir
    done = run / "done.json"
    if done.exists():
        return read_done(done)
    cmd = [sys.executable, "-m", "cometnmt", "train", str(spec.preset), "--set", f"train.seed={spec.seed}",
           "--set", f"train.save_dir={run}", "--set", f"train.device={device}", "--set", "train.progress=false"]
    for override in overrides:
        cmd += ["--set", override]
    start = time.time()
    if (stop_at is not None and start >= stop_at) or _stopping.is_set():  # before the run's files are touched
        return None
    if (run / LAST_CHECKPOINT).exists():
        cmd.append("--resume")
    elif (run / METRICS_FILE).exists():  # killed before its first checkpoint: nothing to resume, start again
        stale = run / f"metrics.before-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        (run / METRICS_FILE).rename(stale)
        log.warning("%s seed %d stopped before its first checkpoint; training it from the start (old log: %s)",
                    spec.name, spec.seed, stale)
    run.mkdir(parents=True, exist_ok=True)
    commits = _call_commits(run)
    earlier = run / "train_seconds_before.txt"  # time spent in the calls the deadline cut short
    before = float(earlier.read_text()) if earlier.exists() else 0.0
    # the bar counts finished runs only, and the training's own log goes to stdout.log: say which run
    # trains now, and where to watch it (a paper-size run is minutes to hours with no other sign)
    log.info("%s seed %d: %s; its log: %s", spec.name, spec.seed, "resuming" if "--resume" in cmd else "training",
             run / "stdout.log")
    with open(run / "stdout.log", "a", encoding="utf-8") as logf:
        logf.write(f"$ {_shown_command(cmd)}\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        with _children_lock:
            _children.add(proc)
            if _stopping.is_set():  # interrupted while it was starting
                proc.terminate()
        try:
            code = proc.wait(timeout=None if stop_at is None else max(1.0, stop_at - time.time()))
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: the trainer saves last.pt, so a later call resumes it
            proc.wait()
            # train_seconds adds up over resumes; whole or not at all (a torn one read back as less, or
            # an empty one stopped every later call with float's ValueError)
            write_text_file(earlier, f"{before + time.time() - start:.3f}\n")
            log.warning("%s seed %d stopped at the deadline; it resumes on the next call", spec.name, spec.seed)
            return None
        finally:
            with _children_lock:
                _children.discard(proc)
    if code in (130, 143, -signal.SIGINT, -signal.SIGTERM) or _stopping.is_set():  # interrupted, with this call
        _stopping.set()  # Ctrl-C reaches the trainings too: no queued run may start after one
        write_text_file(earlier, f"{before + time.time() - start:.3f}\n")
        return None
    if code != 0:
        raise CometNMTError(f"training {spec.name} seed {spec.seed} failed (exit {code}); see {run / 'stdout.log'}")
    if stop_at is not None and time.time() >= stop_at:  # decoding its splits could take as long again
        write_text_file(earlier, f"{before + time.time() - start:.3f}\n")
        log.warning("%s seed %d finished training at the deadline; it is evaluated on the next call", spec.name, spec.seed)
        return None
    record = {"row": spec.name, "seed": spec.seed, "train_seconds": before + time.time() - start, "command": _shown_command(cmd),
              "hardware": hardware(device), "torch": torch_version(),
              "commit": commits[0]}
    if len(commits) > 1:  # resumed at other code: every commit the run trained at, in order
        record["commits"] = commits
    try:
        # Ctrl-C (run_all sets _stopping) and the deadline stop the decoding within a batch: before,
        # the command waited for this run's splits to be decoded to their end (the pool's threads get
        # no signal), and a deadline passed during them was overrun by the rest of the decoding
        with stop_on(_EvaluationStop(stop_at)):
            record.update(evaluate(run))
    except Stopped:
        # no done.json: the next call evaluates the run again (its training, finished, resumes at
        # once); the hypothesis files an evaluation writes are its own, rewritten then
        write_text_file(earlier, f"{record['train_seconds']:.3f}\n")
        log.warning("%s seed %d: its evaluation was %s; it is evaluated on the next call", spec.name, spec.seed,
                    "interrupted" if _stopping.is_set() else "stopped at the deadline")
        return None
    # whole or not at all: a torn one stopped every later call. Strict JSON: a number that is not
    # finite (a diverged validation in the run's history) is null, named under "nonfinite"
    write_text_file(done, strict_json(record, indent=1))
    return record


def read_done(done: Path) -> dict:
    """A finished run's done.json record; one that is not JSON (a write cut short by a kill or a
    full disk, before done.json was written atomically) is an error naming the file and the fix,
    not json's traceback naming no file on every later call. A number written as null and named
    under "nonfinite" is the float again; the bare NaN of a done.json written before reads as it did."""
    try:
        return read_strict_json(done.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CometNMTError(f"{done}: not a finished run's record ({exc}); delete it to evaluate the run again "
                            "(its checkpoints are kept)") from None


def _call_commits(run: Path) -> list[str]:
    """The commits of the calls that trained ``run``, first first: each call appends its own to
    ``commits.txt`` in the run folder, so a run the deadline cut short and a later call finished
    still names the code it started from."""
    path = run / "commits.txt"
    commit = os.environ.get("COMETNMT_COMMIT") or _git("rev-parse", "HEAD") or "unknown"
    seen = path.read_text(encoding="utf-8").split() if path.exists() else []
    if commit not in seen:
        seen.append(commit)
        write_text_file(path, "".join(c + "\n" for c in seen))
    return seen


def run_all(specs: list[RunSpec], *, jobs: int, overrides: list[str], device: str, stop_at: Optional[float],
            evaluate: Evaluate) -> list[str]:
    """Train and evaluate ``specs``, ``jobs`` at a time, in the given order; returns the failed runs
    (each failure is logged; the others go on). The progress bar counts the runs finished or
    failed; those the deadline left for a later call are shown beside it, not counted."""
    failed: list[str] = []
    left = 0
    _stopping.clear()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, progress_bar(total=len(specs), desc="runs", unit="run") as bar:
        try:  # submitting is inside: the first runs start while later ones are still being queued
            futures = {pool.submit(train_run, s, overrides=overrides, device=device, stop_at=stop_at,
                                   evaluate=evaluate): s for s in specs}
            for fut, spec in futures.items():
                try:
                    if fut.result() is None:  # the deadline stopped it, or it never started
                        left += 1
                        bar.set_postfix_str(f"{left} left for a later call (--deadline)")
                        continue
                except CometNMTError as exc:
                    log.error("%s", exc)
                    failed.append(f"{spec.name} seed {spec.seed}")
                bar.update(1)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: no new run starts; running ones save last.pt and stop
            _stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            with _children_lock:
                running = list(_children)
            for proc in running:
                if proc.poll() is None:
                    proc.terminate()
            for proc in running:
                proc.wait()
            raise
    return failed


def run_and_report(args, specs: list[RunSpec], evaluate: Evaluate,
                   report: Callable[[list[dict], list[str], float], object]) -> int:
    """The body of `reproduce` and `compare`: train and evaluate ``specs`` (unless
    ``args.report_only``), then ``report(records, missing, seconds)`` on the finished ones, their
    hypotheses copied beside it first (:func:`keep_hypotheses`), and after it the copies of runs
    the report does not cover removed (:func:`drop_hypotheses`); a call that finished no run where
    OUT already holds a report of every finished run keeps that report.
    Returns 1 when a run failed (the others still ran and are reported), else 0; runs left
    unfinished by the deadline are not failures (they are listed as missing and resume later)."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    start = time.time()
    failed: list[str] = []
    options = evaluation_options(args)
    _check_evaluations(specs, options)
    before = sum((s.run_dir / "done.json").exists() for s in specs)  # finished before this call
    if not args.report_only:
        stop_at = None if args.deadline is None else start + args.deadline
        failed = run_all(specs, jobs=args.jobs, overrides=args.set, device=args.device, stop_at=stop_at,
                         evaluate=lambda run: {**options, **evaluate(run)})
    records, missing = finished(specs)
    if not args.report_only and len(records) == before and _reports_all(Path(args.out) / "report.json", records):
        # nothing new to report: a call the deadline cut short keeps the report already there
        log.warning("no run finished in this call; %s is left as it was (--report-only rewrites it)",
                    Path(args.out) / "report.md")
    else:
        keep_hypotheses(Path(args.out), records)  # before the report: one written has them beside it
        written = report(records, missing, time.time() - start)
        # the runs the report covers: its own list (reproduce's holds runs merged from an earlier
        # report), else the finished runs
        drop_hypotheses(Path(args.out), written["runs"] if isinstance(written, dict) and "runs" in written else records)
        print(f"report written to {Path(args.out) / 'report.md'}")
    if failed:
        log.error("failed: %s", ", ".join(failed))
    return 1 if failed else 0


def _reports_all(path: Path, records: list[dict]) -> bool:
    """Whether the report.json at ``path`` reports every finished run of ``records``. One that
    does not was written before some finished: by a call Ctrl-C stopped after its last run's
    evaluation wrote done.json but before its report, or before a
    run finished elsewhere was copied in. Kept, it named such a run 'not finished' after every
    later call of the same command."""
    try:
        held = {(r["row"], r["seed"]) for r in read_strict_json(path.read_text(encoding="utf-8"))["runs"]}
    except (OSError, ValueError, KeyError, TypeError):  # none, or not a report this code wrote
        return False
    return all((r["row"], r["seed"]) in held for r in records)


# The options that decide how a finished run is evaluated, with their defaults; a run's done.json
# records them, and a later call (or a merged report) must evaluate as it did.
EVAL_OPTIONS = {"eval_limit": ("--eval-limit", None), "average_last": ("--average-last", 0),
                "beam": ("--beam", None), "length_penalty": ("--length-penalty", None)}


def evaluation_options(args) -> dict:
    """This call's values of the :data:`EVAL_OPTIONS` its command has."""
    return {key: getattr(args, key) for key in EVAL_OPTIONS if hasattr(args, key)}


def evaluation_mismatch(runs: list[tuple[str, dict]], options: dict, where: str = "", remedy: Optional[str] = None) -> None:
    """A run decoded on the first ``--eval-limit`` sentences, on another checkpoint
    (``--average-last``) or with another search (``--beam``, ``--length-penalty``) cannot be
    reported as if this call had evaluated it: its table row would not be what the report's header
    says. Two ``--eval-limit`` values are one setting where they decode the same sentences of each
    of the run's splits (:func:`_decoded_alike`: a limit at or above a split's size cuts nothing).
    ``runs`` are (name, record) pairs; the error names every run whose record differs from this
    call's ``options`` (after ``where``, where they come from), with the value each recorded;
    ``remedy`` (default: delete their done.json) follows the fix. Options a record predates are
    not checked."""
    for key, value in options.items():
        flag, default = EVAL_OPTIONS[key]
        differ: dict[str, tuple[object, list[str]]] = {}  # recorded value -> (value, runs)
        records = []
        for name, rec in runs:
            if key in rec and rec[key] != value and not (key == "eval_limit" and _decoded_alike(rec, rec[key], value)):
                differ.setdefault(json.dumps(rec[key]), (rec[key], []))[1].append(name)
                records.append(rec)
        if not differ:
            continue
        # runs of several --eval-limit numbers may still be one setting (1014 and none: each split
        # whole): a value that fits them all, the default first ([]: none does)
        fits = [v for v in (default, *(v for v, _ in differ.values())) if key == "eval_limit"
                and all(_decoded_alike(rec, rec[key], v) for rec in records)][:1]

        def then(v: object) -> str:
            return f"without {flag}" if v == default else f"with {flag} {v}"

        said = "; ".join(f"{', '.join(names)} {'was' if len(names) == 1 else 'were'} evaluated {then(v)}"
                         for v, names in differ.values())
        now = "none" if value == default else f"{flag} {value}"
        if remedy is None:
            one = sum(len(names) for _, names in differ.values()) == 1
            remedy = f"or delete {'its done.json' if one else 'their done.json files'} to evaluate {'it' if one else 'them'} again"
        if len(differ) == 1 or fits:
            then_value = next(iter(differ.values()))[0] if len(differ) == 1 else fits[0]
            fix = f"{f'leave out {flag}' if then_value == default else f'pass {flag} {then_value}'} as before, {remedy}"
        else:
            fix = f"no one {flag} fits them all: {remedy.removeprefix('or ')}"
        raise CometNMTError(f"{where + ': ' if where else ''}{said}, but this call has {now}; {fix}")


def _decoded_alike(rec: dict, limit: Optional[int], other: Optional[int]) -> bool:
    """Whether ``--eval-limit`` ``limit`` and ``other`` (None: no limit) decode the same sentences
    of each split of the run ``rec``: the same first min(limit, size) of each, by the split sizes it
    recorded (``split_sentences``). A limit at or above a split's size decodes all of it, as no
    limit does: runs evaluated with --eval-limit 1000 on the 1,000 test sentences and 1,014 dev
    sentences of a call without it (each split whole) were refused as another setting, though the
    test split was whole; --eval-limit 1014 decodes both whole, the same as none. A run that
    predates ``split_sentences`` is alike only where the limits are equal."""
    sizes = [rec.get(split, {}).get("split_sentences") if isinstance(rec.get(split), dict) else None
             for split in EVAL_SPLITS]
    if not all(isinstance(n, int) for n in sizes):
        return limit == other

    def decoded(cap: Optional[int], size: int) -> int:
        return size if cap is None else min(cap, size)

    return all(decoded(limit, n) == decoded(other, n) for n in sizes)


def _check_evaluations(specs: list[RunSpec], options: dict) -> None:
    """Runs finished by an earlier call must have been evaluated as this call would (above)."""
    evaluation_mismatch([(str(s.run_dir), read_done(s.run_dir / "done.json")) for s in specs
                         if (s.run_dir / "done.json").exists()], options)


def check_run_args(args) -> None:
    """The options reproduce and compare share, checked before any run starts."""
    for option, values in (("--seeds", args.seeds), ("--rows", getattr(args, "rows", None))):
        twice = sorted({str(v) for v in values or [] if list(values).count(v) > 1})
        if twice:
            raise CometNMTError(f"{option}: {', '.join(twice)} given twice; each run is kept in its own folder once")
    for option, value, low in (("--jobs", args.jobs, 1), ("--bootstrap", args.bootstrap, 1), ("--eval-limit", args.eval_limit, 1),
                               ("--examples", getattr(args, "examples", None), 0)):
        if value is not None and value < low:
            raise CometNMTError(f"{option} {value}: must be at least {low}")
    if args.deadline is not None and not args.deadline >= 0:
        raise CometNMTError(f"--deadline {args.deadline}: must be a number of seconds, at least 0")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise CometNMTError(f"--out {args.out}: is a file, expected a report folder")


def finished(specs: list[RunSpec]) -> tuple[list[dict], list[str]]:
    """The done.json records of the finished runs, and the names of those not finished."""
    records, missing = [], []
    for s in specs:
        done = s.run_dir / "done.json"
        if done.exists():
            records.append(read_done(done))
        else:
            missing.append(f"{s.name} seed {s.seed}")
    return records, missing


def metrics(run: Path) -> list[dict]:
    """The run's metrics.jsonl records (train and valid events); a loss that is not a number (a
    diverged run's) is float NaN, in files written as null with the ``nonfinite`` key as in older
    ones written as a bare NaN (run_files.read_metrics_record)."""
    from cometnmt.training.run_files import METRICS_FILE, read_metrics

    return read_metrics(run / METRICS_FILE)


def how_it_ended(run: Path) -> dict:
    """How a finished run's training ended, from its last.pt: ``stopped_by`` "rule" (its stopping
    rule fired), "max_epochs" or "max_steps", and its ``stopping`` rule; {} without last.pt. With
    ``best_behind`` where best.pt is not the best validation under that rule (a resume changed the
    rule's measure and the best epoch's weights were not kept: see the trainer's
    ``_align_best_checkpoint``)."""
    from cometnmt.training.checkpoint import LAST_CHECKPOINT, load_checkpoint

    if not (run / LAST_CHECKPOINT).is_file():
        return {}
    last = load_checkpoint(run / LAST_CHECKPOINT, mmap=True)  # its trainer state and config: the weights are not read
    train = last["config"].get("train", {})
    if last["trainer"]["finished"]:
        by = "rule"
    else:
        by = "max_epochs" if last["epoch"] >= train.get("max_epochs", last["epoch"]) else "max_steps"
    ended = {"stopped_by": by, "stopping": train.get("stopping")}
    if last["trainer"].get("best_behind"):
        ended["best_behind"] = last["trainer"]["best_behind"]
    return ended


def capped_lines(runs: list[dict], name: Callable[[dict], str]) -> list[str]:
    """A report's line on the runs a budget (train.max_epochs or max_steps) ended before their
    stopping rule fired: their best.pt is the best of the epochs trained, not the rule's (a Table 1
    run reached --set train.max_epochs=30 with its validation loss still falling, unsaid)."""
    from cometnmt.training.checkpoint import BEST_CHECKPOINT

    capped = sorted((r for r in runs if r.get("stopped_by") in ("max_epochs", "max_steps")
                     and r.get("stopping") not in (None, "none")), key=lambda r: (r["row"], r["seed"]))
    if not capped:
        return []
    shown = ", ".join(f"{name(r)} seed {r['seed']} ({r['epochs']} epoch{'s' * (r['epochs'] != 1)}, train.{r['stopped_by']})"
                      for r in capped)
    # compare --average-last decodes the average of the last epochs, not best.pt
    what = ("the epochs averaged are the last trained, not those before the rule would have fired"
            if any(r.get("checkpoint", [BEST_CHECKPOINT]) != [BEST_CHECKPOINT] for r in capped)
            else f"{BEST_CHECKPOINT} is the best epoch trained, perhaps not the rule's")
    return ["", f"- **ended by their budget before their stopping rule fired** ({what}): {shown}"]


def best_behind_lines(runs: list[dict], name: Callable[[dict], str]) -> list[str]:
    """A report's line on the runs whose best.pt is not the best validation under their stopping
    rule (``best_behind``, from :func:`how_it_ended`): their row is not the rule's best checkpoint,
    whatever the header says. Runs decoded on another checkpoint (compare --average-last) are not named."""
    from cometnmt.training.checkpoint import BEST_CHECKPOINT

    behind = sorted((r for r in runs if r.get("best_behind") and r.get("checkpoint", [BEST_CHECKPOINT]) == [BEST_CHECKPOINT]),
                    key=lambda r: (r["row"], r["seed"]))
    if not behind:
        return []
    shown = ", ".join(f"{name(r)} seed {r['seed']} ({BEST_CHECKPOINT}: step {b['held_step']}; best under train.stopping="
                      f"{b['stopping']}: epoch {b['best_epoch']}, step {b['best_step']}, {b['measure']} {b['value']:.4g})"
                      for r in behind for b in [r["best_behind"]])
    return ["", f"- **{BEST_CHECKPOINT} is not the best validation under the run's stopping rule** (the rule's measure changed on "
            f"a resume, and that validation's weights were not kept): {shown}"]


def run_dir(out: Path, name: str, seed: int) -> Path:
    """The folder of one run of a report: OUT/runs/NAME/seedS."""
    return out / "runs" / name / f"seed{seed}"


def hypothesis_file(split: str) -> str:
    """The name of a run's hypotheses of ``split`` ("valid", "test"), one line per source: in its run
    folder (written by reproduce and compare) and in the copy under OUT/hypotheses/NAME/seedS."""
    return f"{split}.hyp"


def save_split(run: Path, split: str, done) -> dict:
    """Write a run's decoded ``split`` (``Translator.translate_split``'s result) to its hypothesis
    file, and return what the run's record of the split adds to its scores: the split's size
    (``split_sentences``, for :func:`eval_limit_cut`) where the result carries it."""
    (run / hypothesis_file(split)).write_text("".join(h + "\n" for h in done.hyps), encoding="utf-8")
    whole = getattr(done, "split_pairs", None)  # a stand-in for translate_split's result may lack it
    return {} if whole is None else {"split_sentences": whole}


def test_hyps(out: Path, rec: dict) -> Optional[list[str]]:
    """The test hypotheses of a finished run of the report in ``out``; None when its folder is gone.
    Split on "\\n" only, as the file was written: str.splitlines also splits inside a hypothesis
    holding U+2028, \\x85 or \\x1c, and read_text's universal newlines at "\\r" (a SentencePiece
    model keeps such characters of its training text)."""
    path = run_dir(out, rec["row"], rec["seed"]) / hypothesis_file("test")
    return path.read_bytes().decode("utf-8").split("\n")[:-1] if path.exists() else None


def keep_hypotheses(out: Path, records: list[dict]) -> None:
    """Copy each finished run's ``valid.hyp`` and ``test.hyp`` to OUT/hypotheses/NAME/seedS/, beside
    the report, so that the report's scores can be recomputed (a metric fixed later, another
    metric, a significance test) from the files a commit of the report folder keeps: run folders
    (``runs/``, checkpoints and all) are too big to commit, and the paper's-metric numbers of the
    reports written before this could not be recomputed after the metric's ``<unk>`` fix. A run
    whose folder is gone (merged from an earlier report written to the same folder) keeps the copy
    that report made; one merged from another folder's report has its copy there. Called by
    :func:`run_and_report` for every command that writes a report, --report-only included, which
    removes the copies of runs the report does not cover after it (:func:`drop_hypotheses`)."""
    for rec in records:
        run = run_dir(out, rec["row"], rec["seed"])
        for split in EVAL_SPLITS:
            hyp = run / hypothesis_file(split)
            if hyp.exists():
                write_text_file(out / "hypotheses" / rec["row"] / f"seed{rec['seed']}" / hyp.name,
                                hyp.read_bytes().decode("utf-8"))


HYPOTHESIS_FILES = tuple(map(hypothesis_file, EVAL_SPLITS))  # what keep_hypotheses writes in a run's OUT/hypotheses/NAME/seedS


def drop_hypotheses(out: Path, runs: list[dict]) -> list[Path]:
    """Remove from OUT/hypotheses the copies of runs the report just written does not cover (a row
    or seed no longer asked for, a config no longer compared, a run whose done.json was deleted or
    whose evaluation failed): they were kept there after every later report, so the folder, meant
    to recompute the report's scores, held files of runs the report does not name. ``runs`` are the
    report's runs, by ``row`` and ``seed``.

    Only what :func:`keep_hypotheses` writes is removed: the files of :data:`HYPOTHESIS_FILES` in a
    ``NAME/seedS`` folder, then that folder and ``NAME`` where nothing else is left in them; any other
    file there is kept (with its folders). A copy whose run folder (OUT/runs/NAME/seedS) is gone is
    kept, with a warning: it is the only copy of that run's hypotheses (a run an earlier report
    merged), which a later --merge-report of that report needs. Returns the files removed; each
    is logged."""
    hyps = out / "hypotheses"
    if not hyps.is_dir():
        return []
    covered = {(str(r["row"]), f"seed{r['seed']}") for r in runs}
    removed: list[Path] = []
    only_copies: list[str] = []
    for name in sorted(p for p in hyps.iterdir() if p.is_dir() and not p.is_symlink()):
        for seed in sorted(p for p in name.iterdir() if p.is_dir() and not p.is_symlink() and p.name.startswith("seed")
                           and p.name[4:].isdigit()):
            if (name.name, seed.name) in covered:
                continue
            files = [seed / f for f in HYPOTHESIS_FILES if (seed / f).is_file() and not (seed / f).is_symlink()]
            if not files:
                continue
            if not (out / "runs" / name.name / seed.name).is_dir():
                only_copies.append(str(seed))
                continue
            for f in files:
                f.unlink()
                removed.append(f)
            for folder in (seed, name):
                if not any(folder.iterdir()):
                    folder.rmdir()
    if removed:
        log.info("removed the hypotheses copied for runs this report does not cover (their folders in OUT/runs are "
                 "left as they are): %s", ", ".join(str(f) for f in removed))
    if only_copies:
        log.warning("kept the hypotheses of runs this report does not cover, as their run folders are gone (the only "
                    "copies; delete them by hand if they are not wanted): %s", ", ".join(only_copies))
    return removed


def run_test_split(run: Path, limit: Optional[int]):
    """(sources, references, config) of the test split a finished run was evaluated on, read
    through this machine's data location (the run may come from another machine). Relative
    ``data.test_src``/``test_tgt`` paths are taken from the folder the run was trained in (its
    checkpoint's workdir), as its evaluation took them: taken from the current folder, a report
    built from another folder scored the run's hypotheses against another file of that name, or
    failed. Where that folder is not on this machine (a run trained elsewhere, or copied without
    its checkpoints), they are taken from the current folder. An error names the run's config."""
    from cometnmt.config import config_from_dict, yaml_load
    from cometnmt.data.pipeline import anchor_paths, read_split
    from cometnmt.errors import DataError
    from cometnmt.training.checkpoint import CONFIG_FILE

    saved = yaml_load((run / CONFIG_FILE).read_text(encoding="utf-8"))
    cfg = config_from_dict({**saved, "data": {**saved["data"], "multi30k_dir": None}})
    workdir = _trained_in(run)
    try:
        corpus = read_split(anchor_paths(cfg.data, workdir if workdir and Path(workdir).is_dir() else None), "test")
    except DataError as exc:
        raise DataError(f"{run / CONFIG_FILE}: the test split its run was evaluated on: {exc}") from None
    return corpus.src[:limit], corpus.tgt[:limit], cfg


def _trained_in(run: Path) -> Optional[str]:
    """The folder a run was trained in (the workdir its best.pt, else last.pt, records); None
    without either, or for checkpoints from before it was recorded."""
    from cometnmt.training.checkpoint import BEST_CHECKPOINT, LAST_CHECKPOINT, load_checkpoint

    for name in (BEST_CHECKPOINT, LAST_CHECKPOINT):
        if (run / name).is_file():
            return load_checkpoint(run / name, mmap=True).get("workdir")  # the weights are not read
    return None


# -- summaries ----------------------------------------------------------------------------------


def mean_sd(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    """Mean and sample standard deviation; the deviation is None for fewer than two values (one
    seed has no spread to report, and 0.00 would claim one). Over a value that is not finite (a
    diverged run's NaN) both are NaN: statistics.stdev raised AttributeError on a NaN (Python 3.11's
    exact-fraction sum), which stopped the whole report."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, (statistics.stdev(values) if all(math.isfinite(v) for v in values) else math.nan)


def fmt(pair: tuple[Optional[float], Optional[float]]) -> str:
    mean, sd = pair
    if mean is None:
        return "–"
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


def validation_bleu_label(records: list[dict]) -> str:
    """The learning curves' BLEU axis: on how many validation sentences (train.valid_bleu_max_sentences)."""
    counts = sorted({h["val_bleu_sentences"] for r in records for h in r.get("history", []) if "val_bleu_sentences" in h})
    if not counts:  # runs logged before the count was
        return "validation BLEU (sacreBLEU, greedy)"
    shown = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"validation BLEU (sacreBLEU, greedy, {shown} sentences)"


def case_note(runs: list[dict], name: Callable[[dict], str]) -> str:
    """How a report's runs were scored: "cased", or "lowercased" where they were trained with
    data.lowercase (their BLEU signatures say case:lc, and the paper's metric was lowercased too),
    naming the runs where only some were (``name`` gives a run's name)."""
    lowered = sorted({name(r) for r in runs if "case:lc" in r.get("test", {}).get("bleu_signature", "")})
    if not lowered:
        return "cased"
    if len(lowered) == len({name(r) for r in runs}):
        return "lowercased"
    return f"cased; lowercased for {', '.join(lowered)} (data.lowercase)"


def fmt_p(test: dict) -> str:
    """A bootstrap p-value as a reader may quote it: none of ``n_samples`` samples is not p = 0,
    only p < 1/n_samples."""
    p, n = test["p_value"], test.get("n_samples")
    return f"< {1 / n:g}" if p == 0 and n else f"{p:.3f}"


def _checkout_root(config: str) -> Optional[Path]:
    """The checkout a run's config came from, where its recorded path alone says so: the folder
    above ``configs/multi30k/`` for an absolute path of a file in it (reproduce's presets, recorded
    absolute as its --config-dir defaults to ``REPO / PRESETS``, from wherever that checkout lay:
    /work/main, a copy in /tmp); None for any other path. A string rule, not a look at the disk or
    at the current folder: the checkout may be gone, and a report must read the same anywhere. Not
    any folder named configs: a user's /home/u/configs/mine.yaml shown as configs/mine.yaml would
    read as a file every checkout ships."""
    path = Path(config)
    return path.parents[2] if path.is_absolute() and path.parent.parts[-2:] == PRESETS.parts else None


def _shown_path(part: str, root: Optional[Path]) -> str:
    """A recorded path as a reader reruns it from a checkout's root: relative to ``root`` (the
    checkout of the run's config, :func:`_checkout_root`) when under it, otherwise as recorded.
    Never relative to the current folder, which made the same report.json render
    ``configs/multi30k/comet.yaml`` from /work/main and ``/work/main/configs/...`` anywhere else."""
    if root is not None and Path(part).is_absolute():
        try:
            return str(Path(part).relative_to(root))
        except ValueError:
            pass
    return part


def _shown_command(cmd: list[str]) -> str:
    """A training command as a shell runs it: with ``$COMETNMT_PLUGINS`` before it where set, since
    the run's architecture may be one that only those modules register."""
    from cometnmt.models import PLUGINS_ENV

    plugins = os.environ.get(PLUGINS_ENV)
    return (f"{PLUGINS_ENV}={shlex.quote(plugins)} " if plugins else "") + shlex.join(cmd)


def curve_marker(history: list) -> dict:
    """Plot keywords for a run's learning curve: a marker where the run has one validation (a
    one-epoch run's line of one point draws nothing), none for a real curve."""
    return {"marker": "o", "markersize": 5} if len(history) == 1 else {}


def short_command(command: str) -> str:
    """A recorded training command without the interpreter path, shell-quoted, with the config
    path and run folder as given (a reproduce preset recorded absolute, and a run folder inside its
    checkout, relative to that checkout's root: :func:`_shown_path`), and the environment
    assignments before it (``COMETNMT_PLUGINS=...``) kept. A resumed run's ``--resume`` is left out:
    the command is the run's recipe, and pasted with it a reader's new run failed with no
    checkpoint to resume."""
    parts = shlex.split(command)
    env = []
    while parts and "=" in parts[0] and parts[0].split("=", 1)[0].isidentifier():
        name, value = parts.pop(0).split("=", 1)
        env.append(f"{name}={shlex.quote(value)}")
    if len(parts) > 2 and parts[1:3] == ["-m", "cometnmt"]:
        parts = ["cometnmt"] + parts[3:]
    configs = [part for part in parts if part.endswith((".yaml", ".yml"))]
    root = _checkout_root(configs[0]) if configs else None
    out, skip = [], False
    for i, part in enumerate(parts):
        if skip:
            skip = False
            continue
        if part == "--set" and i + 1 < len(parts) and parts[i + 1].split("=")[0] == "train.progress":
            skip = True
            continue
        if part == "--resume":
            continue
        if part.startswith("train.save_dir="):  # kept, so that pasted commands of two runs do not collide
            part = "train.save_dir=" + _shown_path(part.split("=", 1)[1], root)
        out.append(_shown_path(part, root) if part in configs else part)
    return " ".join(env + [shlex.join(out)])


# The --set keys each run's command gives itself (its seed and folder), or that do not change what it
# learns (the device, which the report's hardware line names; the progress bar): runs that differ
# only in these, and in --resume, were trained by one recipe
_PER_RUN_KEYS = ("train.seed", "train.save_dir", "train.device", "train.progress")


def _own(override: str) -> bool:
    return override.split("=", 1)[0] in _PER_RUN_KEYS


def _recipe(command: str) -> tuple:
    """A run's training command as :func:`short_command` shows it, less the overrides of _PER_RUN_KEYS."""
    parts = shlex.split(short_command(command))
    own = {i for i, part in enumerate(parts) if part == "--set" and i + 1 < len(parts) and _own(parts[i + 1])}
    return tuple(part for i, part in enumerate(parts) if i not in own and i - 1 not in own)


def _by_recipe(runs: list[dict]) -> list[list[dict]]:
    """One row's runs by seed, grouped by :func:`_recipe`: the first seed's group first."""
    groups: dict[tuple, list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault(_recipe(r["command"]), []).append(r)
    return list(groups.values())


def command_lines(name: str, runs: list[dict]) -> list[str]:
    """report.md's lines on how a row's ``runs`` were trained: the first seed's command, and where
    some seeds were trained otherwise, the first command of each recipe with the seeds it trained."""
    groups = _by_recipe(runs)
    if len(groups) == 1:
        return [f"- {name}: `{short_command(groups[0][0]['command'])}`"]
    return [f"- {name}, seed{'s' * (len(g) > 1)} {', '.join(str(r['seed']) for r in g)}: `{short_command(g[0]['command'])}`"
            for g in groups]


def mixed_recipe_lines(runs: list[dict], name: Callable[[dict], str]) -> list[str]:
    """A report's line on the seeds of a row trained otherwise than its first seed, with the
    overrides that differ. A finished run is reused whatever a later call's --set says: seeds
    trained with model.d_ff=64 and one trained by a call without it made one row, its mean and sd
    over two models, under seed 1's command alone."""
    rows: dict[str, list[dict]] = {}
    for r in runs:
        rows.setdefault(r["row"], []).append(r)
    said = []
    for recs in rows.values():
        groups = _by_recipe(recs)
        first = [o for o in _overrides(groups[0][0]["command"]) if not _own(o)]
        for group in groups[1:]:
            given = [o for o in _overrides(group[0]["command"]) if not _own(o)]
            differ = [f"{how} {', '.join(found)}" for how, found in (("without", [o for o in first if o not in given]),
                                                                    ("with", [o for o in given if o not in first])) if found]
            seeds = ", ".join(str(r["seed"]) for r in group)
            said.append(f"{name(group[0])} seed{'s' * (len(group) > 1)} {seeds} "
                        f"({'; '.join(differ) or 'another config or environment'})")
    return ["", "- **seeds of a row trained otherwise than its first (the row's mean and sd pool them; their commands are "
            f"below): {', '.join(said)}**"] if said else []


# -- provenance ---------------------------------------------------------------------------------


def torch_version() -> str:
    import torch

    return torch.__version__


def _git(*cmd: str) -> str:
    try:
        return subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
    except Exception:
        return ""


def hardware(device: str) -> str:
    import torch

    if torch.cuda.is_available() and device != "cpu":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"


def _report_commit(out: Optional[str] = None) -> str:
    """``$COMETNMT_COMMIT`` where the caller named the code (a copy of the tree on another machine,
    whose .git may be stale or absent: scripts/gpu_session.sh sets it), else git's HEAD, flagged
    when the tree has uncommitted changes. The report folder ``out`` is not such a change: a
    report inside the checkout (the default reports/reproduce) flagged its own earlier report.md
    on every later call."""
    named = os.environ.get("COMETNMT_COMMIT")
    if named:
        return named
    head = _git("rev-parse", "HEAD")
    if not head:
        return "unknown (no git checkout)"
    paths: list[str] = []
    if out is not None:
        try:
            inside = Path(out).resolve().relative_to(REPO.resolve())
        except ValueError:  # a report folder outside the checkout
            inside = None
        if inside is not None and inside != Path("."):
            paths = ["--", ".", f":(exclude){inside}"]
    return head + (" (uncommitted changes)" if _git("status", "--porcelain", *paths) else "")


def _overrides(command: str) -> list[str]:
    """The ``--set`` overrides of a recorded training command, in order."""
    parts = shlex.split(command)
    return [parts[i + 1] for i, part in enumerate(parts[:-1]) if part == "--set"]


def _runs_without(records: list[dict], overrides: list[str]) -> dict[str, list[str]]:
    """For each run whose recorded training command lacks some of ``overrides`` (a run trained by
    another call, e.g. merged from an earlier report or reported with --report-only), the ones it
    lacks."""
    out = {}
    for r in records:
        if "command" not in r:
            continue
        given = set(_overrides(r["command"]))
        lacking = [o for o in overrides if o not in given]
        if lacking:
            out[f"{r['row']} seed {r['seed']}"] = lacking
    return out


def eval_limit_cut(records: list[dict], split: str, limit: Optional[int]) -> bool:
    """Whether ``--eval-limit`` ``limit`` left sentences of ``split`` undecoded for any of
    ``records``: a run scored fewer than the split holds (``split_sentences``). A limit at or above
    the split's size decoded all of it: Figure 4 was titled "the first 1000 test sentences only" and
    report.md said a smoke setting for --eval-limit 1000 on the 1,000 sentences of
    test_2016_flickr. A run scored before the split's size was recorded counts as cut where it
    scored as many sentences as the limit (it may have been), not where it scored fewer (the split
    is shorter than the limit)."""
    if limit is None:
        return False
    for r in records:
        scored = r.get(split, {})
        if "n_sentences" not in scored:
            continue
        whole = scored.get("split_sentences")
        if (scored["n_sentences"] < whole) if whole is not None else (scored["n_sentences"] >= limit):
            return True
    return False


def provenance(args, seconds: float, records: list[dict], missing: list[str]) -> dict:
    """Commit, command, hardware and software of a report; hardware and torch are those the runs
    recorded, else this machine's. ``overrides`` are this call's; ``runs_without_overrides`` names
    the runs whose recorded commands lack some of them."""
    return {
        "commit": _report_commit(getattr(args, "out", None)),
        "command": "cometnmt " + shlex.join(sys.argv[1:]),
        "hardware": ", ".join(sorted({r["hardware"] for r in records if "hardware" in r})) or hardware(args.device),
        "torch": ", ".join(sorted({r["torch"] for r in records if "torch" in r})) or torch_version(),
        "train_hours": sum(r.get("train_seconds", 0.0) for r in records) / 3600,
        "missing_runs": missing,
        "run_commits": sorted({c for r in records for c in (r.get("commits") or [r.get("commit")]) if c}),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "wall_seconds": seconds,
        "overrides": args.set,
        "runs_without_overrides": _runs_without(records, args.set),
        "eval_limit": args.eval_limit,
        # the splits --eval-limit cut (a limit at or above a split's size decoded all of it): what
        # report.md calls a smoke setting
        "eval_limit_cut": [split for split in EVAL_SPLITS if eval_limit_cut(records, split, args.eval_limit)],
        # as decoded: data.max_valid_pairs cuts the dev split too, below --eval-limit or without it
        "sentences": {split: sorted({r[split]["n_sentences"] for r in records if "n_sentences" in r.get(split, {})})
                      for split in EVAL_SPLITS},
    }


def provenance_lines(p: dict) -> list[str]:
    """The Markdown header lines of :func:`provenance`; first, for a report.md that `cometnmt render`
    rewrote from report.json (``rendered``: :func:`cometnmt.render.render_report`), when, from which
    file and by which code, the lines after it being the original call's."""
    r = p.get("rendered")
    lines = [f"- **re-rendered** on {r['date']} from `{r['from']}` by `{r['command']}` at commit `{r['commit']}`: "
             "no training, decoding or scoring, every number is that file's; wording and layout are this commit's, "
             "the commit, command, hardware and date below the original call's"] if r else []
    lines += [f"- commit (report): `{p['commit']}`; commits the runs were trained at: "
              f"{', '.join(f'`{c}`' for c in p['run_commits']) or 'not recorded'}",
              f"- command: `{p['command']}`", f"- hardware of the runs: {p['hardware']}, torch {p['torch']}",
              f"- date: {p['date']}; wall time of this call {p['wall_seconds'] / 60:.1f} min; "
              f"training time of all runs {p['train_hours']:.2f} h", f"- overrides for every run: {p['overrides'] or 'none'}"]
    if p.get("runs_without_overrides"):
        lines.append("- **trained without some of these overrides (their own commands are below): "
                     + "; ".join(f"{run}: {', '.join(o)}" for run, o in p["runs_without_overrides"].items()) + "**")
    if p["missing_runs"]:
        lines.append(f"- **not finished (not in the table): {', '.join(p['missing_runs'])}**")
    counts = p.get("sentences") or {}  # reports from before it lack the key
    cut = p.get("eval_limit_cut")
    if p["eval_limit"] and cut is None:  # a report from before the key: said as it was
        lines.append(f"- **smoke setting: at most the first {p['eval_limit']} sentences of each split were decoded**")
    elif cut:
        which = "each split" if len(cut) > 1 else {"valid": "the dev split", "test": "the test split"}[cut[0]]
        lines.append(f"- **smoke setting: only the first {p['eval_limit']} sentences of {which} were decoded "
                     f"(--eval-limit {p['eval_limit']})**")
    elif p["eval_limit"] and any(counts.values()):  # the command names the limit: said that it cut nothing
        lines.append(f"- --eval-limit {p['eval_limit']} cut no split: every sentence of the dev and test splits was decoded")
    if any(counts.values()):
        lines.append("- sentences scored per run: " + "; ".join(
            f"{label} {', '.join(f'{n:,}' for n in counts[split]) or '–'}" for split, label in (("valid", "dev"), ("test", "test"))))
    return lines
