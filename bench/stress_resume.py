"""Black-box stress test of `cometnmt train` interrupts: real SIGINT/SIGTERM at random times (start-up,
mid-epoch, validation, checkpoint writes; sometimes two signals 0-300 ms apart), resumed with --resume
until the run is done; the final last.pt / best.pt / epoch checkpoints and the history must equal an
uninterrupted reference run's, bit for bit.

    COMETNMT_MULTI30K_DIR=... PYTHONPATH=. python bench/stress_resume.py --minutes 50 --jobs 2 --out /tmp/stress

Each finished trial is one JSON line in OUT/results.jsonl; a failing trial keeps its folder. The exit
status is 1 when any trial failed (so a script or CI job running it sees the failure), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from cometnmt.training.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
BASE = ["data.max_train_pairs=600", "data.max_valid_pairs=40", "train.batch_tokens=600", "train.num_threads=1",
        "train.progress=false", "train.valid_bleu=false", "train.max_epochs=3", "train.log_every=1"]

CONFIGS = {
    "tf": ["model.arch=transformer"],
    "comet": ["model.arch=comet"],
    "tf_accum2_keep2": ["model.arch=transformer", "train.accum_steps=2", "train.keep_checkpoints=2"],
    "comet_accum2_save3": ["model.arch=comet", "train.accum_steps=2", "train.save_every=3"],
    "comet_bleu": ["model.arch=comet", "train.stopping=bleu_patience", "train.valid_bleu=true", "train.patience=1",
                   "train.max_epochs=4", "train.keep_checkpoints=2"],
    "tf_bleu_save2": ["model.arch=transformer", "train.stopping=bleu_patience", "train.valid_bleu=true",
                      "train.patience=2", "train.save_every=2"],
    "tf_maxsteps": ["model.arch=transformer", "train.max_steps=45", "train.save_every=5"],
    "comet_maxsteps_accum2": ["model.arch=comet", "train.max_steps=22", "train.accum_steps=2", "train.keep_checkpoints=2"],
    "comet_lossrise_big": ["model.arch=comet", "train.stopping=loss_rise", "model.d_model=128", "model.d_ff=512",
                           "train.keep_checkpoints=2"],
    # log windows of several steps: an interrupt or save_every inside one saves it in last.pt
    "tf_log4_accum2": ["model.arch=transformer", "train.log_every=4", "train.accum_steps=2"],
    "comet_log3_save5_maxsteps": ["model.arch=comet", "train.log_every=3", "train.save_every=5", "train.max_steps=40"],
}

SIGNAME = {signal.SIGINT: "INT", signal.SIGTERM: "TERM"}
EXPECTED_RC = {signal.SIGINT: 130, signal.SIGTERM: 143}


def command(save_dir: Path, overrides: list[str], resume: bool) -> list[str]:
    sets = [a for o in [*BASE, *overrides, f"train.save_dir={save_dir}"] for a in ("--set", o)]
    return [sys.executable, "-m", "cometnmt", "train", str(REPO / "configs" / "tiny.yaml"), *sets,
            *(["--resume"] if resume else [])]


def env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


def tmp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp")) if folder.exists() else []


def train_records(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")[:-1]  # complete lines only: the watcher may read a line being written
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"event": "torn", "line": line})
    return out


class Watcher(threading.Thread):
    """Sends the signal(s) of one attempt when its trigger fires."""

    def __init__(self, proc, folder: Path, plan: dict, ref: dict):
        super().__init__(daemon=True)
        self.proc, self.folder, self.plan, self.ref = proc, folder, plan, ref
        self.sent: list[tuple[str, float]] = []
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        # a resumed attempt's folder holds the earlier attempts' records: the triggers look at this
        # attempt's only (a "step" or "valid" trigger fired at once on an old record, at start-up)
        self.base = len(train_records(folder))

    def records(self) -> list[dict]:
        """The records this attempt logged."""
        return train_records(self.folder)[self.base:]

    def wait_until(self, cond, limit=120.0) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if self.proc.poll() is not None or self.stop.is_set():
                return False
            if cond():
                return True
            time.sleep(0.0005)
        return False

    def send(self, signum) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            self.sent.append((SIGNAME[signum], round(time.monotonic() - self.t0, 4)))

    def run(self) -> None:
        p = self.plan
        trig = p["trigger"]
        if trig == "time":
            ok = self.wait_until(lambda: time.monotonic() - self.t0 >= p["delay"])
        elif trig == "ckpt":  # a checkpoint's temporary file exists: it is being written
            ok = self.wait_until(lambda: bool(tmp_files(self.folder)))
            if ok and p["delay"]:
                time.sleep(p["delay"])
        elif trig == "valid":  # the epoch's last step was logged: validation (then checkpoints) runs now
            ends = set(self.ref["epoch_end_steps"])

            def at_end():
                recs = self.records()
                return bool(recs) and recs[-1].get("event") == "train" and recs[-1]["step"] in ends
            ok = self.wait_until(at_end)
            if ok:
                time.sleep(p["delay"])
        elif trig == "step":  # a given train step was logged: mid-epoch
            ok = self.wait_until(lambda: any(r.get("step", -1) >= p["step"] for r in self.records()))
            if ok:
                time.sleep(p["delay"])
        else:
            raise ValueError(trig)
        if not ok:
            return
        self.send(p["sig1"])
        if p.get("sig2") is not None:
            time.sleep(p["gap"])
            self.send(p["sig2"])


def run_reference(name: str, out: Path) -> dict:
    folder = out / "ref" / name
    if not (folder / "last.pt").exists():
        shutil.rmtree(folder, ignore_errors=True)
        t = time.monotonic()
        r = subprocess.run(command(folder, CONFIGS[name], False), env=env(), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"reference {name} failed:\n{r.stderr[-3000:]}")
        (folder / "wall_s").write_text(str(time.monotonic() - t))
    last = load_checkpoint(folder / "last.pt")
    return {
        "folder": folder, "wall": float((folder / "wall_s").read_text()),
        "epoch_end_steps": [h["step"] for h in last["trainer"]["history"]],
        "steps": last["step"],
    }


MODE = {"only": None}  # --only valid_double: every attempt gets SIGINT+SIGTERM together while validating


def make_plan(rng: random.Random, ref: dict) -> dict:
    if MODE["only"] == "valid_double":
        return {"trigger": "valid", "delay": rng.uniform(0, 0.1), "sig1": signal.SIGINT, "sig2": signal.SIGTERM,
                "gap": rng.choice([0.0, rng.uniform(0, 0.002)])}
    trig = rng.choices(["time", "time_startup", "step", "valid", "ckpt"], weights=[3, 1, 2, 2, 2])[0]
    plan: dict = {}
    if trig == "time":
        plan = {"trigger": "time", "delay": rng.uniform(0, ref["wall"] * 1.05)}
    elif trig == "time_startup":
        plan = {"trigger": "time", "delay": rng.uniform(0, 7.0)}
    elif trig == "step":
        plan = {"trigger": "step", "step": rng.randint(1, max(1, ref["steps"] - 1)), "delay": rng.uniform(0, 0.06)}
    elif trig == "valid":
        plan = {"trigger": "valid", "delay": rng.choice([0, rng.uniform(0, 0.05), rng.uniform(0, 0.6)])}
    else:
        plan = {"trigger": "ckpt", "delay": rng.choice([0, 0, rng.uniform(0, 0.004), rng.uniform(0, 0.03)])}
    plan["sig1"] = rng.choice([signal.SIGINT, signal.SIGTERM])
    if rng.random() < 0.4:
        plan["sig2"] = rng.choice([signal.SIGTERM, signal.SIGTERM, signal.SIGINT])
        plan["gap"] = rng.choice([0.0, rng.uniform(0, 0.003), rng.uniform(0, 0.03), rng.uniform(0, 0.3)])
    return plan


def compare(ref_folder: Path, folder: Path) -> list[str]:
    problems = []
    names = sorted(p.name for p in ref_folder.glob("*.pt"))
    got = sorted(p.name for p in folder.glob("*.pt"))
    if names != got:
        problems.append(f"checkpoint files {got} != reference {names}")
    for name in names:
        if not (folder / name).exists():
            continue
        a, b = load_checkpoint(ref_folder / name), load_checkpoint(folder / name)
        for key in ("step", "epoch"):
            if a[key] != b[key]:
                problems.append(f"{name}: {key} {b[key]} != {a[key]}")
        if a["model"].keys() != b["model"].keys():
            problems.append(f"{name}: model keys differ")
        for k, v in a["model"].items():
            if k in b["model"] and not torch.equal(v, b["model"][k]):
                problems.append(f"{name}: model tensor {k} differs")
                break
        ta, tb = a["trainer"], b["trainer"]
        for key in ("history", "best", "stale", "finished", "consumed"):
            if ta[key] != tb[key]:
                problems.append(f"{name}: trainer.{key} differs: {tb[key]!r} vs {ta[key]!r}"[:400])
        oa, ob = a["optimizer"]["state"], b["optimizer"]["state"]
        if any(not torch.equal(oa[i][s], ob[i][s]) for i in oa for s in oa[i]):
            problems.append(f"{name}: optimizer state differs")
    torn = [r for r in train_records(folder) if r["event"] == "torn"]
    if torn:
        problems.append(f"metrics.jsonl has torn lines: {torn[:2]}")
    # every record, in order, timing aside (a log window's tokens/s counts its wall time)
    ra = [{k: v for k, v in r.items() if k != "tgt_tokens_per_s"} for r in train_records(ref_folder)]
    rb = [{k: v for k, v in r.items() if k != "tgt_tokens_per_s"} for r in train_records(folder)]
    if ra != rb:
        first = next((i for i, (a, b) in enumerate(zip(ra, rb)) if a != b), min(len(ra), len(rb)))
        problems.append(f"metrics.jsonl records differ: {len(rb)} vs {len(ra)}; first at {first}: "
                        f"{rb[first] if first < len(rb) else None!r} vs {ra[first] if first < len(ra) else None!r}"[:600])
    return problems


def trial(i: int, seed: int, out: Path, refs: dict, config_names: list[str]) -> dict:
    rng = random.Random(seed)
    name = rng.choice(config_names)
    ref = refs[name]
    folder = out / "trials" / f"t{i:04d}_{name}"
    shutil.rmtree(folder, ignore_errors=True)
    attempts, problems = [], []
    resume, n_interrupts, best_step = False, 0, 0
    for attempt in range(12):
        interrupt = n_interrupts < 4 and (attempt == 0 or rng.random() < 0.6) and not (MODE["only"] and attempt)
        plan = make_plan(rng, ref) if interrupt else None
        folder.parent.mkdir(parents=True, exist_ok=True)
        log = open(folder.parent / f"{folder.name}.a{attempt}.err", "w")
        t0 = time.monotonic()
        proc = subprocess.Popen(command(folder, CONFIGS[name], resume), env=env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        w = None
        if plan:
            w = Watcher(proc, folder, plan, ref)
            w.t0 = t0
            w.start()
        try:
            rc = proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            problems.append(f"attempt {attempt}: hung (killed after 180 s)")
        t_end = time.monotonic() - t0
        if w:
            w.stop.set()
            w.join()
        log.close()
        text = (folder.parent / f"{folder.name}.a{attempt}.err").read_text()
        sent = w.sent if w else []
        rec = {"attempt": attempt, "resume": resume, "plan": {k: (SIGNAME.get(v, v) if k.startswith("sig") else v)
                                                             for k, v in (plan or {}).items()},
               "sent": sent, "rc": rc, "wall": round(t_end, 3)}
        last = folder / "last.pt"
        # checks after every attempt
        leftovers = tmp_files(folder)
        if leftovers:
            problems.append(f"attempt {attempt}: temporary files left: {leftovers}")
        if "Traceback" in text and "cometnmt.training" not in text and "KeyboardInterrupt" in text:
            rec["note"] = "Ctrl-C while Python imported the CLI: a traceback (before cometnmt's handlers)"
        elif "Traceback" in text:
            problems.append(f"attempt {attempt}: traceback in output: {text[text.index('Traceback'):][-600:]}")
        if last.exists():
            try:
                ck = load_checkpoint(last)
                rec["last_step"] = ck["step"]
                if ck["step"] < best_step:
                    problems.append(f"attempt {attempt}: last.pt went back from step {best_step} to {ck['step']}")
                best_step = max(best_step, ck["step"])
                logged = max([r.get("step", 0) for r in train_records(folder) if r.get("event") == "train"], default=0)
                if rc != 0 and logged > ck["step"]:
                    problems.append(f"attempt {attempt}: steps up to {logged} logged but last.pt holds step {ck['step']} "
                                    f"(the interrupt's save lost)")
            except Exception as exc:  # noqa: BLE001
                problems.append(f"attempt {attempt}: last.pt unreadable: {exc}")
        attempts.append(rec)
        if rc == 0:
            if sent and t_end - float(sent[0][1]) > 2.0:
                problems.append(f"attempt {attempt}: signal {sent} ignored: exit 0 {t_end:.2f}s after launch")
            break
        if not sent:
            problems.append(f"attempt {attempt}: exit {rc} without a signal: {text[-800:]}")
            break
        first = signal.SIGINT if sent[0][0] == "INT" else signal.SIGTERM
        ok_rcs = {EXPECTED_RC[first]}
        if len(sent) > 1:
            ok_rcs |= {130, 143}
        startup_rc = {-2 if s == "INT" else -15 for s, _ in sent}  # before the CLI's handler: the default action
        if rc not in ok_rcs:
            if rc in startup_rc and "cometnmt.training" not in text:
                rec["note"] = "killed by the default action before the CLI started"
            elif rc in startup_rc and re.search(r"^(trained \d+ step|interrupted; continue with|interrupted before the "
                                                r"first checkpoint|interrupted while starting|cometnmt train: interrupted)", text, re.M):
                rec["note"] = "a later signal killed it (default action) after the CLI had finished and printed its line"
            else:
                problems.append(f"attempt {attempt}: exit {rc}, expected {sorted(ok_rcs)} (sent {sent})")
        if rc in (130, 143):
            if "interrupted while starting; nothing was written" in text:
                rec["note"] = "interrupted before the config was loaded"
            elif last.exists() and "continue with:" not in text:
                problems.append(f"attempt {attempt}: last.pt exists but no 'continue with' line")
            elif not last.exists() and "nothing to resume" not in text:
                if "cometnmt train: interrupted" in text and "cometnmt.training" not in text:
                    rec["note"] = "interrupted before cmd_train's try (imports, config): generic message"
                else:
                    problems.append(f"attempt {attempt}: no last.pt and no 'nothing to resume' line")
        n_interrupts += 1
        if last.exists():
            resume = True
        else:
            resume = False
            left = [p.name for p in folder.glob("*") if p.name not in ("train.log", "config.yaml")
                    and not p.name.endswith(".tmp")] if folder.exists() else []
            if left:
                problems.append(f"attempt {attempt}: no last.pt, but the folder holds {left} (cannot restart)")
                break
    else:
        problems.append("not done after 12 attempts")
    if attempts and attempts[-1]["rc"] == 0:
        problems += compare(ref["folder"], folder)
    result = {"trial": i, "seed": seed, "config": name, "attempts": attempts, "problems": problems}
    if not problems:
        shutil.rmtree(folder, ignore_errors=True)
        for p in folder.parent.glob(f"{folder.name}.a*.err"):
            p.unlink()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=50, help="start no trial after this long")
    ap.add_argument("--jobs", type=int, default=2, help="trials side by side (each trains with 1 thread)")
    ap.add_argument("--out", default="/tmp/stress", help="references, results.jsonl and failing trials' folders")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--trials", type=int, default=100000)
    ap.add_argument("--only", choices=["valid_double"], help="one kind of interruption only")
    args = ap.parse_args()
    MODE["only"] = args.only
    # a harness started in the background (`cmd &` in a script) inherits SIGINT ignored, and so would
    # every training it starts (Python then leaves SIGINT ignored): give them SIGINT's default
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    refs = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, ref in zip(args.configs, pool.map(lambda n: run_reference(n, out), args.configs)):
            refs[name] = ref
            print(f"reference {name}: {ref['steps']} steps, epoch ends {ref['epoch_end_steps']}, {ref['wall']:.1f}s", flush=True)
    deadline = time.monotonic() + args.minutes * 60
    lock = threading.Lock()
    counter = {"i": 0, "fail": 0}
    results = open(out / "results.jsonl", "a")

    def worker(j: int) -> None:
        while time.monotonic() < deadline:
            with lock:
                i = counter["i"]
                if i >= args.trials:
                    return
                counter["i"] += 1
            r = trial(i, args.seed * 1000003 + i, out, refs, args.configs)
            with lock:
                results.write(json.dumps(r) + "\n")
                results.flush()
                if r["problems"]:
                    counter["fail"] += 1
                sig = "; ".join(f"{a['plan'].get('trigger')}:{','.join(s for s, _ in a['sent'])}->{a['rc']}"
                                for a in r["attempts"])
                print(f"[{i}] {r['config']}: {'FAIL ' + ' | '.join(r['problems']) if r['problems'] else 'ok'}  ({sig})",
                      flush=True)

    threads = [threading.Thread(target=worker, args=(j,)) for j in range(args.jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{counter['i']} trials, {counter['fail']} failing", flush=True)
    return 1 if counter["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
