"""The bookkeeping `reproduce` and `compare` share (cometnmt/experiments.py), without training:
spread over one seed, the commits a resumed run trained at, and the report a call that finished
nothing keeps."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from cometnmt import experiments
from cometnmt.errors import CometNMTError
from cometnmt.experiments import RunSpec, fmt, mean_sd, provenance, provenance_lines, run_and_report


def test_one_seed_has_no_spread():
    assert mean_sd([]) == (None, None) and fmt(mean_sd([])) == "–"
    assert mean_sd([40.0]) == (40.0, None) and fmt(mean_sd([40.0])) == "40.00"  # not "40.00 ± 0.00"
    mean, sd = mean_sd([39.0, 41.0])
    assert mean == 40.0 and abs(sd - 2 ** 0.5) < 1e-12 and fmt((mean, sd)) == "40.00 ± 1.41"
    mean, sd = mean_sd([39.0, float("nan")])  # a diverged seed: statistics.stdev raised AttributeError, no report
    assert mean != mean and sd != sd and fmt((mean, sd)) == "nan ± nan"


def test_report_commands_name_the_config_as_it_can_be_rerun(tmp_path, monkeypatch):
    """A reproduce preset recorded absolute (its --config-dir defaults to the checkout's
    configs/multi30k) is shown from that checkout's root, and a run folder inside the checkout too,
    whichever folder the report is written in; any other path as recorded (relative ones were given
    so), never relative to the current folder, which made a report read otherwise elsewhere."""
    checkout = tmp_path / "my checkout"
    cmd = ["/venv/bin/python", "-m", "cometnmt", "train", str(checkout / "configs" / "multi30k" / "comet.yaml"),
           "--set", "train.seed=2", "--set", f"train.save_dir={checkout}/runs/a b/seed2", "--set", "train.progress=false",
           "--set", "model.d_ff=64"]
    outside = [*cmd[:8], "train.save_dir=/srv/runs/seed2"]
    mine = [*cmd[:4], str(tmp_path / "my configs" / "a.yaml"), "--set", f"train.save_dir={tmp_path}/runs/seed2"]
    checkout.mkdir()
    for where in (tmp_path, checkout, Path(tmp_path.anchor)):  # the checkout, a folder above it, the root
        monkeypatch.chdir(where)
        assert experiments.short_command(shlex.join(cmd)) == ("cometnmt train configs/multi30k/comet.yaml --set train.seed=2 "
                                                              "--set 'train.save_dir=runs/a b/seed2' --set model.d_ff=64")
        assert experiments.short_command(shlex.join(outside)) == ("cometnmt train configs/multi30k/comet.yaml --set train.seed=2 "
                                                                  "--set train.save_dir=/srv/runs/seed2")
        assert experiments.short_command(shlex.join(mine)) == "cometnmt train " + shlex.join(mine[4:])
    elsewhere = cmd[:4] + ["/srv/presets/b.yaml"]
    assert experiments.short_command(shlex.join(elsewhere)) == "cometnmt train /srv/presets/b.yaml"
    relative = cmd[:4] + ["configs/multi30k/comet.yaml", "--set", "train.save_dir=runs/x"]
    assert experiments.short_command(shlex.join(relative)) == "cometnmt train configs/multi30k/comet.yaml --set train.save_dir=runs/x"


def test_a_resumed_run_s_command_is_shown_as_a_new_run_trains(tmp_path):
    """A run an earlier call left unfinished recorded the command that finished it, with --resume;
    shown so in report.md's training commands, it failed where a reader reruns it ('--resume: no
    checkpoint at ...'). The recipe is the command without it."""
    cmd = ["/venv/bin/python", "-m", "cometnmt", "train", "mine.yaml", "--set", "train.seed=3", "--set",
           "train.save_dir=runs/x/seed3", "--set", "train.progress=false", "--set", "model.d_ff=64", "--resume"]
    assert experiments.short_command(shlex.join(cmd)) == ("cometnmt train mine.yaml --set train.seed=3 --set "
                                                          "train.save_dir=runs/x/seed3 --set model.d_ff=64")


def test_a_resumed_run_keeps_the_commit_it_started_from(tmp_path, monkeypatch):
    run = tmp_path / "seed1"
    run.mkdir()
    monkeypatch.setenv("COMETNMT_COMMIT", "aaaa111")
    assert experiments._call_commits(run) == ["aaaa111"]
    assert experiments._call_commits(run) == ["aaaa111"]  # the same code again: recorded once
    monkeypatch.setenv("COMETNMT_COMMIT", "bbbb222")  # a later call, after a commit, finishes it
    assert experiments._call_commits(run) == ["aaaa111", "bbbb222"]
    assert (run / "commits.txt").read_text().split() == ["aaaa111", "bbbb222"]
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None)
    records = [{"commit": "aaaa111", "commits": ["aaaa111", "bbbb222"]}, {"commit": "cccc333"}, {"row": "old record"}]
    prov = provenance(args, 1.0, records, [])
    assert prov["run_commits"] == ["aaaa111", "bbbb222", "cccc333"]
    assert "`aaaa111`, `bbbb222`, `cccc333`" in provenance_lines(prov)[0]


def test_the_report_names_the_commit_the_caller_named(monkeypatch):
    """On a device machine the tree is a copy whose .git may be stale: the report must name
    $COMETNMT_COMMIT, as the runs do, not that stale HEAD."""
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None)
    monkeypatch.setenv("COMETNMT_COMMIT", "965c07b")
    monkeypatch.setattr(experiments, "_git", lambda *a: "7c82feb6ebfc6b2ab0e779856b30a721a831bbf0")
    assert provenance(args, 1.0, [], [])["commit"] == "965c07b"
    monkeypatch.delenv("COMETNMT_COMMIT")
    assert provenance(args, 1.0, [], [])["commit"].startswith("7c82feb6ebfc6b2ab0e779856b30a721a831bbf0 (uncommitted")
    monkeypatch.setattr(experiments, "_git", lambda *a: "")
    assert provenance(args, 1.0, [], [])["commit"] == "unknown (no git checkout)"


class _FinishedTraining:
    """Stands in for a training subprocess that finishes at once."""

    def __init__(self, cmd, **kwargs):
        pass

    def wait(self, timeout=None):
        return 0


def _args(out: Path, report_only: bool, eval_limit=None, deadline=0.0) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), report_only=report_only, deadline=deadline, jobs=1, set=[], device="cpu",
                              eval_limit=eval_limit)


def test_a_call_that_finishes_nothing_keeps_the_report(tmp_path, capsys):
    """deadline 0: no run starts. Before, such a call rewrote report.md with every run missing.
    The runs bar does not count a run the deadline left (before, it showed 'runs: 100% 1/1')."""
    out = tmp_path / "report"
    specs = [RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, out / "runs" / "comet" / "seed1")]
    calls = []

    def report(records, missing, seconds):
        calls.append((records, missing))
        (out / "report.json").write_text(json.dumps({"runs": records, "missing": missing}))

    assert run_and_report(_args(out, False), specs, lambda run: {}, report) == 0
    assert calls == [([], ["comet seed 1"])]  # no report yet: the first one is written, run missing
    bar = capsys.readouterr().err.rstrip().rsplit("\r", 1)[-1]  # the runs bar's last frame
    assert "runs:   0%" in bar and "0/1" in bar and "1 left for a later call (--deadline)" in bar, bar
    assert run_and_report(_args(out, False), specs, lambda run: {}, report) == 0
    assert len(calls) == 1  # nothing finished and a report is there: kept
    assert not specs[0].run_dir.exists()  # and nothing trained

    # a run finished by a call Ctrl-C stopped before its report (its last evaluation ran to its end
    # and wrote done.json), or copied from another machine: the report there names it 'not
    # finished', so a call that finishes nothing writes it anew (it was kept, after every call)
    done = specs[0].run_dir / "done.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"row": "comet", "seed": 1}))
    run_and_report(_args(out, False), specs, lambda run: {}, report)
    assert calls[-1] == ([{"row": "comet", "seed": 1}], [])
    run_and_report(_args(out, False), specs, lambda run: {}, report)
    assert len(calls) == 2  # that report holds every finished run: kept
    run_and_report(_args(out, True), specs, lambda run: {}, report)
    assert len(calls) == 3 and calls[-1] == ([{"row": "comet", "seed": 1}], [])  # --report-only always rewrites


def test_every_report_has_its_runs_hypotheses_beside_it(tmp_path):
    """run_and_report copies each finished run's valid.hyp and test.hyp to OUT/hypotheses/NAME/seedS
    before it calls the command's report, --report-only included: reproduce and compare each called
    keep_hypotheses in their own report, which a third command could forget. Byte for byte (a
    hypothesis may hold a "\\r"); a run not finished has none copied."""
    out = tmp_path / "report"
    specs = [RunSpec(name, Path("configs/multi30k/comet.yaml"), 1, out / "runs" / name / "seed1") for name in ("a", "b")]
    specs[0].run_dir.mkdir(parents=True)
    (specs[0].run_dir / "done.json").write_text(json.dumps({"row": "a", "seed": 1}))
    for split in ("valid", "test"):
        (specs[0].run_dir / f"{split}.hyp").write_bytes(f"{split} one\r two\n".encode())
    seen = []

    def report(records, missing, seconds):
        seen.append(sorted(str(p.relative_to(out)) for p in (out / "hypotheses").rglob("*.hyp")))
        assert missing == ["b seed 1"]

    for report_only in (True, False):  # deadline 0: b does not start
        run_and_report(_args(out, report_only), specs, lambda run: {}, report)
    assert seen == [["hypotheses/a/seed1/test.hyp", "hypotheses/a/seed1/valid.hyp"]] * 2
    assert (out / "hypotheses" / "a" / "seed1" / "test.hyp").read_bytes() == b"test one\r two\n"


def test_a_run_finished_at_the_deadline_is_evaluated_on_the_next_call(tmp_path, monkeypatch):
    """Decoding a run's splits can take as long as training it on a CPU: a run whose training ends
    past --deadline is left for the next call to evaluate (before, the call overran by that much)."""
    import time

    out = tmp_path / "report"
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, out / "runs" / "comet" / "seed1")

    class SlowProcess:
        def __init__(self, cmd, **kwargs):
            pass

        def wait(self, timeout=None):
            time.sleep(0.3)  # trains past the deadline, then exits 0
            return 0

    import platform

    import cometnmt.training.checkpoint  # noqa: F401  train_run imports it (torch: seconds cold) before the deadline's
    # check that starts no run after it: run alone, this test's 0.2 s had passed there, and nothing trained
    platform.processor()  # asks `uname -p` through subprocess.Popen once a process, cached: not the mock's to answer
    monkeypatch.setattr(experiments.subprocess, "Popen", SlowProcess)
    evaluated = []
    args = _args(out, False, deadline=0.2)
    run_and_report(args, [spec], lambda run: evaluated.append(run) or {"test": 1}, lambda *a: None)
    assert evaluated == [] and not (spec.run_dir / "done.json").exists()
    assert float((spec.run_dir / "train_seconds_before.txt").read_text()) >= 0.3
    run_and_report(_args(out, False, deadline=None), [spec], lambda run: evaluated.append(run) or {"test": 1}, lambda *a: None)
    assert evaluated == [spec.run_dir] and (spec.run_dir / "done.json").exists()


def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path, monkeypatch):
    """No last.pt but a metrics log (a run killed before its first checkpoint): nothing to resume,
    and `cometnmt train` refuses a folder that holds a run's metrics, so the old log is moved
    aside (kept) and the run starts from scratch, without --resume."""
    run = tmp_path / "comet" / "seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n', encoding="utf-8")
    commands = []

    class FakeProcess:
        def __init__(self, cmd, **kwargs):
            commands.append(cmd)
            assert not (run / "metrics.jsonl").exists()  # moved aside before training starts

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(experiments.subprocess, "Popen", FakeProcess)
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, run)
    record = experiments.train_run(spec, overrides=[], device="cpu", stop_at=None, evaluate=lambda r: {"test_bleu": 1.0})
    assert record["test_bleu"] == 1.0 and "--resume" not in commands[0]
    [old] = run.glob("metrics.before-*.jsonl")
    assert old.read_text(encoding="utf-8") == '{"event": "train", "step": 1}\n'


def test_a_run_the_deadline_leaves_is_not_said_to_start_again(tmp_path, caplog):
    """Past the deadline (or after Ctrl-C) no run starts, but a run killed before its first
    checkpoint had its metrics log moved aside first, with the warning that it was 'training it
    from the start', which it was not."""
    run = tmp_path / "comet" / "seed1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n', encoding="utf-8")
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, run)
    assert experiments.train_run(spec, overrides=[], device="cpu", stop_at=0.0, evaluate=lambda r: {}) is None
    assert (run / "metrics.jsonl").exists() and not list(run.glob("metrics.before-*.jsonl"))
    assert "from the start" not in caplog.text


def test_a_report_keeps_the_eval_limit_its_runs_were_decoded_with(tmp_path, monkeypatch):
    """Runs decoded on the first 60 sentences (a smoke --eval-limit) cannot be reported against
    the whole test set: before, --report-only without the limit died in the bootstrap test."""
    out = tmp_path / "report"
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, out / "runs" / "comet" / "seed1")

    monkeypatch.setattr(experiments.subprocess, "Popen", _FinishedTraining)
    reports = []
    run_and_report(_args(out, False, eval_limit=60, deadline=None), [spec], lambda run: {"test": 1},
                   lambda records, missing, seconds: reports.append(records))
    assert reports[-1][0]["eval_limit"] == 60  # recorded in done.json
    for limit, said in ((None, "this call has none; pass --eval-limit 60 as before"),
                        (100, "this call has --eval-limit 100; pass --eval-limit 60")):
        with pytest.raises(CometNMTError, match=said):
            run_and_report(_args(out, True, eval_limit=limit), [spec], lambda run: {}, lambda *a: reports.append(a))
    assert len(reports) == 1  # refused before any report
    run_and_report(_args(out, True, eval_limit=60), [spec], lambda run: {}, lambda records, *a: reports.append(records))
    assert len(reports) == 2


def test_a_report_keeps_the_search_and_checkpoint_its_runs_were_evaluated_with(tmp_path, monkeypatch):
    """compare --beam 5 --average-last 10 over runs evaluated greedily on best.pt: before, the
    finished runs' records were reused silently, so the header named a search their rows never had."""
    out = tmp_path / "report"
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, out / "runs" / "comet" / "seed1")

    def args(report_only, **options):
        a = _args(out, report_only, deadline=None)
        a.beam, a.length_penalty, a.average_last = options.get("beam"), options.get("length_penalty"), options.get("average_last", 0)
        return a

    monkeypatch.setattr(experiments.subprocess, "Popen", _FinishedTraining)
    reports = []
    run_and_report(args(False), [spec], lambda run: {"test": 1}, lambda records, *a: reports.append(records))
    assert {k: reports[-1][0][k] for k in ("beam", "length_penalty", "average_last")} == {"beam": None, "length_penalty": None, "average_last": 0}
    for options, said in (({"beam": 5}, "evaluated without --beam, but this call has --beam 5; leave out --beam as before"),
                          ({"average_last": 10}, "without --average-last, but this call has --average-last 10"),
                          ({"length_penalty": 0.0}, "without --length-penalty, but this call has --length-penalty 0.0")):
        with pytest.raises(CometNMTError, match=said):
            run_and_report(args(True, **options), [spec], lambda run: {}, lambda *a: reports.append(a))
    assert len(reports) == 1
    run_and_report(args(True), [spec], lambda run: {}, lambda records, *a: reports.append(records))
    assert len(reports) == 2


def test_an_interrupt_stops_the_running_trainings_and_starts_no_more(tmp_path, monkeypatch):
    """Before, Ctrl-C let the thread pool start every queued run and train it to the end."""
    import _thread
    import threading

    started, terminated, second_started = [], threading.Event(), threading.Event()

    class FakeProcess:
        def __init__(self, cmd, **kwargs):
            self.n = 0 if "train.seed=1" in cmd else 1  # seed 1's future is the one run_all waits on first
            started.append(self)
            if self.n == 1:
                second_started.set()

        def wait(self, timeout=None):
            if self.n == 0:  # Ctrl-C once the second training runs: it reaches this one and the command
                assert second_started.wait(10)
                _thread.interrupt_main()
                return 130
            assert terminated.wait(10), "the running training was never stopped"
            return -15

        def poll(self):
            return None if not terminated.is_set() else -15

        def terminate(self):
            terminated.set()

    monkeypatch.setattr(experiments.subprocess, "Popen", FakeProcess)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")  # no git process
    specs = [RunSpec("comet", Path("configs/multi30k/comet.yaml"), s, tmp_path / f"seed{s}") for s in (1, 2, 3)]
    with pytest.raises(KeyboardInterrupt):
        experiments.run_all(specs, jobs=2, overrides=[], device="cpu", stop_at=None, evaluate=lambda run: {})
    assert len(started) == 2 and terminated.is_set()  # the third never started; the second was stopped
    assert not any((s.run_dir / "done.json").exists() for s in specs)


def test_an_interrupt_while_runs_are_still_being_queued_stops_the_started_ones(tmp_path, monkeypatch):
    """Ctrl-C that reached the command while it was still queueing runs (a loaded machine can let two
    runs start before the third is queued) left the running training going to its end and then
    started the third: the submissions were outside the interrupt handler."""
    import _thread
    import threading

    started, terminated, interrupted = [], threading.Event(), threading.Event()

    class FakeProcess:
        def __init__(self, cmd, **kwargs):
            started.append(self)
            if len(started) == 2:  # Ctrl-C while the third run is being queued (below)
                _thread.interrupt_main()
                interrupted.set()

        def wait(self, timeout=None):
            if not terminated.wait(10):
                return 0  # trained to the end: the failure this test catches
            return -15

        def poll(self):
            return None if not terminated.is_set() else -15

        def terminate(self):
            terminated.set()

    queued = []

    class SlowQueue(experiments.ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            if len(queued) == 2:  # the third: the interrupt arrives while it is queued
                assert interrupted.wait(10)
            queued.append(args)
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(experiments.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(experiments, "ThreadPoolExecutor", SlowQueue)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    specs = [RunSpec("comet", Path("configs/multi30k/comet.yaml"), s, tmp_path / f"seed{s}") for s in (1, 2, 3)]
    with pytest.raises(KeyboardInterrupt):
        experiments.run_all(specs, jobs=2, overrides=[], device="cpu", stop_at=None, evaluate=lambda run: {})
    assert len(started) == 2 and terminated.is_set()
    assert not any((s.run_dir / "done.json").exists() for s in specs)


@pytest.mark.parametrize("argv, needle", [
    (["compare", "configs/tiny.yaml", "configs/multi30k/comet.yaml", "--seeds", "1", "1"], "--seeds: 1 given twice"),
    (["compare", "configs/tiny.yaml", "configs/multi30k/comet.yaml", "--beam", "0"], "--beam 0: must be at least 1"),
    (["compare", "configs/tiny.yaml", "configs/multi30k/comet.yaml", "--length-penalty", "-1"], "--length-penalty -1.0"),
    (["compare", "configs/tiny.yaml", "configs/multi30k/comet.yaml", "--bootstrap", "0"], "--bootstrap 0: must be at least 1"),
    (["compare", "configs/tiny.yaml", "configs/multi30k/comet.yaml", "--eval-limit", "-3"], "--eval-limit -3: must be at least 1"),
    (["reproduce", "--rows", "comet", "comet", "transformer"], "--rows: comet given twice"),
    (["reproduce", "--rows", "mine.yaml", "transformer"], "not config files: to test mine.yaml against the Transformer with "
     "reproduce's greedy search and metrics, run `cometnmt compare mine.yaml "),
    (["reproduce", "--examples", "-1"], "--examples -1: must be at least 0"),
    (["reproduce", "--jobs", "0"], "--jobs 0: must be at least 1"),
    (["reproduce", "--merge-report", "configs"], "--merge-report configs: is a folder"),
    (["reproduce", "--out", "README.md"], "--out README.md: is a file"),
])
def test_run_options_are_checked_before_any_run(argv, needle, capsys, tmp_path, monkeypatch):
    """Each of these trained every run first, then failed, wrote a false report or crashed."""
    from cometnmt.cli import main
    from conftest import REPO

    monkeypatch.chdir(REPO)
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out" / "runs").exists()


def test_merged_runs_must_have_been_decoded_alike(tmp_path, capsys, monkeypatch):
    from cometnmt.cli import main
    from conftest import REPO

    monkeypatch.chdir(REPO)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"runs": [{"row": "comet", "seed": 1, "eval_limit": 30, "test": {"paper_bleu": 1.0}}]}))
    assert main(["reproduce", "--report-only", "--seeds", "1", "--out", str(tmp_path / "new"), "--merge-report", str(old)]) == 2
    assert f"--merge-report {old}: comet seed 1 was evaluated with --eval-limit 30" in capsys.readouterr().err


def _record(row: str, seed: int, eval_limit) -> dict:
    score = {"paper_bleu": 30.0, "bleu": 30.0, "chrf": 50.0}
    return {"row": row, "seed": seed, "eval_limit": eval_limit, "valid": score, "test": score, "epochs": 1, "history": [],
            "command": f"python -m cometnmt train {row}.yaml --set train.seed={seed}"}


def test_a_merge_names_the_runs_whose_evaluation_differs(tmp_path, capsys, monkeypatch):
    """--merge-report checked every run of the earlier report, so a call with --eval-limit 30 was
    refused for a run it does not report (another row, or one finished in OUT), named as if it
    were the problem, and its fix ('leave out --eval-limit') broke the runs it would merge."""
    from cometnmt.cli import main
    from conftest import REPO

    monkeypatch.chdir(REPO)
    out, old = tmp_path / "new", tmp_path / "old.json"
    (out / "runs" / "comet" / "seed3").mkdir(parents=True)
    (out / "runs" / "comet" / "seed3" / "done.json").write_text(json.dumps(_record("comet", 3, 30)))  # finished here
    runs = [_record("comet", 1, 30), _record("comet", 2, 30), _record("convs2s", 1, None), _record("comet", 3, None)]
    old.write_text(json.dumps({"runs": runs}))
    argv = ["reproduce", "--report-only", "--rows", "comet", "--seeds", "1", "2", "3", "--eval-limit", "30", "--out", str(out),
            "--merge-report", str(old)]
    assert main(argv) == 0, capsys.readouterr().err  # convs2s and comet seed 3 of old.json are not merged
    assert sorted(r["seed"] for r in json.loads((out / "report.json").read_text())["runs"]) == [1, 2, 3]

    old.write_text(json.dumps({"runs": [_record("comet", 1, 30), _record("comet", 2, 20), _record("comet", 4, 20)]}))
    assert main(argv[:7] + ["4", *argv[7:]]) == 2
    assert (f"--merge-report {old}: comet seed 2, comet seed 4 were evaluated with --eval-limit 20, but this call has "
            "--eval-limit 30; pass --eval-limit 20 as before, or leave out --merge-report") in capsys.readouterr().err
    old.write_text(json.dumps({"runs": [_record("comet", 1, None), _record("comet", 2, 20)]}))
    assert main(argv) == 2
    assert (f"--merge-report {old}: comet seed 1 was evaluated without --eval-limit; comet seed 2 was evaluated with "
            "--eval-limit 20, but this call has --eval-limit 30; no one --eval-limit fits them all: leave out "
            "--merge-report") in capsys.readouterr().err


def test_finished_runs_evaluated_otherwise_are_all_named(tmp_path):
    out = tmp_path / "report"
    specs = [RunSpec("comet", Path("comet.yaml"), s, out / "runs" / "comet" / f"seed{s}") for s in (1, 2, 3)]
    for spec, limit in zip(specs, (20, 60, 20)):
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "done.json").write_text(json.dumps({"row": "comet", "seed": spec.seed, "eval_limit": limit}))
    with pytest.raises(CometNMTError) as err:
        run_and_report(_args(out, True, eval_limit=60), specs, lambda run: {}, lambda *a: None)
    assert str(err.value) == (f"{specs[0].run_dir}, {specs[2].run_dir} were evaluated with --eval-limit 20, but this call has "
                              "--eval-limit 60; pass --eval-limit 20 as before, or delete their done.json files to evaluate "
                              "them again")


def test_the_report_names_runs_trained_without_its_overrides(monkeypatch):
    """A --report-only or --merge-report call lists its own --set overrides "for every run"; runs
    trained by another call with other settings (Table 1's ConvS2S and RNN: their presets' batches,
    lr and epoch cap) were reported as if trained with them."""
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    sets = ["train.lr=5e-4", "train.max_epochs=30"]
    args = argparse.Namespace(device="cpu", set=sets, eval_limit=None)
    base = "python -m cometnmt train c.yaml --set train.seed=1"
    records = [{"row": "comet", "seed": 1, "command": f"{base} --set train.lr=5e-4 --set train.max_epochs=30"},
               {"row": "convs2s", "seed": 1, "command": f"{base} --set train.precision=bf16"},
               {"row": "rnn", "seed": 2, "command": f"{base} --set train.max_epochs=30"}]
    prov = provenance(args, 1.0, records, [])
    assert prov["runs_without_overrides"] == {"convs2s seed 1": sets, "rnn seed 2": ["train.lr=5e-4"]}
    text = "\n".join(provenance_lines(prov))
    assert "convs2s seed 1: train.lr=5e-4, train.max_epochs=30; rnn seed 2: train.lr=5e-4" in text
    assert provenance(args, 1.0, records[:1], [])["runs_without_overrides"] == {}
    assert "without some of these overrides" not in "\n".join(provenance_lines(provenance(args, 1.0, records[:1], [])))


def test_a_bootstrap_no_sample_of_which_went_the_other_way_is_not_p_0(monkeypatch):
    """0 of 1,000 samples bounds p below 1/1000; the reports printed "p = 0.000"."""
    from cometnmt import compare, reproduce
    from cometnmt.experiments import fmt_p

    assert fmt_p({"p_value": 0.0, "n_samples": 1000}) == "< 0.001" and fmt_p({"p_value": 0.0, "n_samples": 50}) == "< 0.02"
    assert fmt_p({"p_value": 0.0012, "n_samples": 10000}) == "0.001" and fmt_p({"p_value": 0.5}) == "0.500"
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None, out=".")
    test = {"metric": "bleu", "a": 35.3, "b": 23.7, "delta": 11.6, "a_ci95": [34.0, 36.0], "b_ci95": [22.0, 25.0],
            "p_value": 0.0, "n_samples": 1000}
    report = {"provenance": provenance(args, 1.0, [], []), "systems": ["a", "b"], "metrics": ["bleu"], "table": [],
              "runs": [], "aux_losses": [], "significance": [{"a_system": "a", "b_system": "b", "seeds": [1], **test}]}
    assert "| 34.00–36.00 | 22.00–25.00 | < 0.001 |" in compare._markdown(report)
    report = {"provenance": report["provenance"], "table": [], "runs": [], "significance": [{"seed": 1, **test}]}
    assert "| 1 | bleu | 35.30 | 23.70 | +11.60 | < 0.001 |" in reproduce._markdown(args, report)


def test_the_reports_say_which_standard_deviation(monkeypatch):
    """mean_sd is the sample deviation (n - 1); the reports only said "sd", and the committed
    one-seed rows of Table 1 showed "± 0.00"."""
    from cometnmt import compare, reproduce

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None, out=".")
    prov = provenance(args, 1.0, [], [])
    said = "Mean ± sample sd (n − 1) over seeds; one seed has no ±."
    assert said in compare._markdown({"provenance": prov, "systems": ["a", "b"], "table": [], "runs": [],
                                      "significance": [], "aux_losses": []})
    assert said in reproduce._markdown(args, {"provenance": prov, "table": [], "runs": []})
    assert mean_sd([1.0, 2.0, 3.0])[1] == 1.0  # sample, not population (0.816...)


def test_test_hypotheses_are_read_back_line_for_line(tmp_path):
    """test.hyp is written one hypothesis per "\\n"; reading it back with str.splitlines also split
    inside a hypothesis holding U+2028, \\x85 or \\x1c, and read_text at "\\r" (a SentencePiece model
    keeps such characters of its training text): these 3 hypotheses came back as 7, and a report
    stopped after training ("paired_bootstrap: run 1 of system A has 41 hypotheses for 40
    references") where the examples would have shown every later sentence beside another's reference."""
    from cometnmt.experiments import run_dir, test_hyps

    hyps = ["a man\u2028rides", "q\x85r \x1cthe\rdog", ""]
    run = run_dir(tmp_path, "comet", 1)
    run.mkdir(parents=True)
    (run / "test.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")  # as _evaluate_run writes it
    assert test_hyps(tmp_path, {"row": "comet", "seed": 1}) == hyps
    (run / "test.hyp").write_text("", encoding="utf-8")
    assert test_hyps(tmp_path, {"row": "comet", "seed": 1}) == []


def test_the_report_folder_is_not_an_uncommitted_change(tmp_path, monkeypatch):
    """A report inside the checkout (the default reports/reproduce) is untracked: a second call
    (a seed added, --report-only) found its first call's report.md and said "(uncommitted
    changes)" of a clean tree. Changes elsewhere are still flagged."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "code.py").write_text("x = 1\n")
    for cmd in (["init", "-q"], ["add", "code.py"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    monkeypatch.delenv("COMETNMT_COMMIT", raising=False)
    monkeypatch.setattr(experiments, "REPO", repo)
    head = experiments._git("rev-parse", "HEAD")
    out = repo / "reports" / "reproduce"
    (out / "runs").mkdir(parents=True)
    (out / "report.md").write_text("# an earlier call's report\n")

    def commit(out_dir) -> str:
        return provenance(argparse.Namespace(device="cpu", set=[], eval_limit=None, out=str(out_dir)), 1.0, [], [])["commit"]

    assert commit(out) == head
    monkeypatch.chdir(repo)
    assert commit("reports/reproduce") == head  # --out as given, relative to the current folder
    assert commit(tmp_path / "elsewhere") == f"{head} (uncommitted changes)"  # the report is a change of this tree
    (repo / "code.py").write_text("x = 2\n")
    assert commit(out) == f"{head} (uncommitted changes)"


def test_the_reports_say_when_the_runs_were_scored_lowercased(monkeypatch):
    """Runs trained with data.lowercase are scored on lowercased text (BLEU signature case:lc),
    but compare's report said "sacreBLEU, cased" whatever the runs were, and reproduce's said
    nothing of it."""
    from cometnmt import compare, reproduce

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    args = argparse.Namespace(device="cpu", set=[], eval_limit=None, out=".")
    prov = provenance(args, 1.0, [], [])

    def run(row: str, case: str) -> dict:
        return {"row": row, "seed": 1, "epochs": 1, "valid": {"bleu": 1.0}, "command": "cometnmt train x.yaml",
                "test": {"bleu": 1.0, "chrf": 1.0, "bleu_signature": f"nrefs:1|case:{case}|eff:no|tok:13a|smooth:exp"}}

    def said(runs: list[dict]) -> tuple[str, str]:
        cmp = compare._markdown({"provenance": prov, "systems": ["comet", "transformer"], "table": [], "runs": runs,
                                 "significance": [], "aux_losses": []})
        rep = reproduce._markdown(args, {"provenance": prov, "table": [], "runs": runs})
        return cmp, rep

    cmp, rep = said([run("comet", "lc"), run("transformer", "lc")])
    assert "sacreBLEU, lowercased, on detokenised text" in cmp and "sacreBLEU, cased" not in cmp
    assert "scores lowercased." in rep
    cmp, rep = said([run("comet", "mixed"), run("transformer", "mixed")])
    assert "sacreBLEU, cased, on detokenised text" in cmp and "scores cased." in rep
    cmp, rep = said([run("comet", "lc"), run("transformer", "mixed")])
    assert "sacreBLEU, cased; lowercased for comet (data.lowercase), on" in cmp
    assert "scores cased; lowercased for COMET (data.lowercase)." in rep


def test_a_torn_done_json_is_named_not_a_traceback(tmp_path):
    """done.json was written with Path.write_text: one cut short (a kill, a full disk) made every
    later call on the report stop with json's traceback ("Expecting ',' delimiter: line 96 column
    29"), naming no file. It is written atomically now, and one that is not JSON is named."""
    run = tmp_path / "runs" / "comet" / "seed1"
    run.mkdir(parents=True)
    (run / "done.json").write_text('{"row": "comet", "seed": 1, "test": {"bleu": 3')
    spec = RunSpec("comet", tmp_path / "comet.yaml", 1, run)
    for call in (lambda: experiments.finished([spec]),
                 lambda: run_and_report(_args(tmp_path, report_only=True), [spec], lambda run: {}, lambda *a: None)):
        with pytest.raises(CometNMTError, match=f"{run / 'done.json'}: not a finished run's record .*delete it"):
            call()


def test_the_report_says_how_many_sentences_were_scored(monkeypatch):
    """data.max_valid_pairs cuts the dev split as the runs decode it: test_reproduce's tiny setting
    (max_valid_pairs 20, --eval-limit 30) scored 20 dev sentences under "only the first 30
    sentences of each split were decoded", and without --eval-limit a dev column beside the
    paper's full-set number said nothing of its subset."""
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")

    def run(seed: int, dev: int, test: int) -> dict:
        return {"row": "comet", "seed": seed, "valid": {"n_sentences": dev}, "test": {"n_sentences": test}}

    args = argparse.Namespace(device="cpu", set=[], eval_limit=30, out=".")
    text = "\n".join(provenance_lines(provenance(args, 1.0, [run(1, 20, 30), run(2, 20, 30)], [])))
    # runs scored before the split's size was recorded: 20 dev sentences, under the limit, are the whole
    # (max_valid_pairs-cut) dev split; 30 test sentences may be the first 30 of more
    assert "only the first 30 sentences of the test split were decoded" in text and "- sentences scored per run: dev 20; test 30" in text
    args.eval_limit = None
    text = "\n".join(provenance_lines(provenance(args, 1.0, [run(1, 500, 1000), run(2, 1014, 1000)], [])))
    assert "- sentences scored per run: dev 500, 1,014; test 1,000" in text and "smoke" not in text
    assert "sentences scored" not in "\n".join(provenance_lines(provenance(args, 1.0, [], [])))


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_report_cut_short_leaves_the_one_before(tmp_path, monkeypatch):
    """report.json and report.md were written with Path.write_text: a write cut short (a kill, a
    full disk; here a file size limit) left a torn report.json, which the next call that finished
    nothing kept as it was and --merge-report could not read. They are written whole or not at all
    now: the earlier report stays, and the error names the file."""
    import resource
    import signal

    from cometnmt import compare, reproduce
    from cometnmt.data.corpus import DataError

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    for module in (reproduce, compare):
        for plot in ("_learning_curves", "_curves"):
            if hasattr(module, plot):
                monkeypatch.setattr(module, plot, lambda *a: None)
    monkeypatch.setattr(reproduce, "_figure4", lambda *a: [])
    args = argparse.Namespace(out=str(tmp_path), set=[], device="cpu", eval_limit=None, candidate=None, merge_report=None,
                              bootstrap=10, examples=1, metrics=["bleu"], seeds=[1])
    calls = {"reproduce": lambda: reproduce.build_report(args, ["comet", "transformer"], [], ["comet seed 1"], 1.0),
             "compare": lambda: compare.build_report(args, ["a", "b"], [], ["a seed 1"], 1.0)}
    for name, build in calls.items():
        build()
        before = {f: (tmp_path / f).read_text() for f in ("report.json", "report.md")}
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), not the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, limit[1]))
        try:
            with pytest.raises((DataError, OSError)) as err:
                build()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)
        assert str(tmp_path / "report.json") in str(err.value), name
        assert {f: (tmp_path / f).read_text() for f in before} == before, name
        assert not list(tmp_path.glob(".report.*")), name  # no temporary file left


def test_a_merge_does_not_fill_a_run_unfinished_here(tmp_path, capsys, monkeypatch, caplog):
    """--merge-report takes the runs "without a folder in OUT/runs", but it took every run without
    done.json: one still training here (last.pt only), or whose evaluation was cut short after its
    test.hyp, got the earlier report's numbers in its row while the bootstrap test and examples read
    this folder's test.hyp, another model's. Such a run is not merged now: it is listed as not
    finished, and a warning names its folder."""
    from cometnmt.cli import main
    from conftest import REPO

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    out, old = tmp_path / "new", tmp_path / "old.json"
    unfinished = out / "runs" / "comet" / "seed1"
    unfinished.mkdir(parents=True)
    (unfinished / "last.pt").write_bytes(b"PK\x03\x04")  # training here, not finished
    (unfinished / "test.hyp").write_text("ein hund\n", encoding="utf-8")
    old.write_text(json.dumps({"runs": [_record("comet", 1, None), _record("comet", 2, None)]}))
    argv = ["reproduce", "--report-only", "--rows", "comet", "--seeds", "1", "2", "--out", str(out), "--merge-report", str(old)]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert [(r["seed"], r.get("merged_from_report")) for r in report["runs"]] == [(2, True)]
    assert report["provenance"]["missing_runs"] == ["comet seed 1"] and report["provenance"]["merged_runs"] == 1
    assert "not finished (not in the table): comet seed 1" in (out / "report.md").read_text()
    assert "not taken from the earlier report, as their folders here hold runs not finished" in caplog.text
    assert f"comet seed 1 ({unfinished})" in caplog.text


def test_the_test_split_of_a_run_is_read_where_it_was_trained(tmp_path, monkeypatch):
    """compare and reproduce score the bootstrap test and the examples against run_test_split's
    references. It read the run's config.yaml with relative data.test_src/test_tgt paths taken from
    the current folder, while the run was trained and decoded with them taken from the folder it
    was trained in (its checkpoint's workdir): a --report-only call from another folder holding a
    file of that name scored the hypotheses against those lines, silently. They are taken from
    the run's folder now; where that folder is not on this machine, from the current folder, and
    an error names the run's config and the path tried."""
    import torch

    from cometnmt.config import config_from_dict, to_dict, yaml_dump
    from cometnmt.errors import DataError
    from cometnmt.experiments import run_test_split

    trained, elsewhere, empty, run = (tmp_path / d for d in ("trained", "elsewhere", "empty", "runs/a/seed1"))
    for folder, words in ((trained, ["ein Hund", "zwei Katzen"]), (elsewhere, ["nicht", "diese"])):
        (folder / "data").mkdir(parents=True)
        for lang in ("de", "en"):
            (folder / "data" / f"test.{lang}").write_text("".join(f"{w} {lang}\n" for w in words), encoding="utf-8")
    empty.mkdir()
    run.mkdir(parents=True)
    files = {f"{split}_{side}": f"data/test.{lang}" for split in ("train", "valid", "test")
             for side, lang in (("src", "de"), ("tgt", "en"))}
    cfg = to_dict(config_from_dict({"name": "a", "data": {"corpus": "files", **files}}))
    (run / "config.yaml").write_text(yaml_dump(cfg), encoding="utf-8")

    def checkpoint(workdir: str) -> None:
        torch.save({"format_version": 1, "config": cfg, "codec": {}, "model": {}, "workdir": workdir}, run / "best.pt")

    checkpoint(str(trained))
    for cwd in (elsewhere, empty, trained):
        monkeypatch.chdir(cwd)
        src, refs, _ = run_test_split(run, None)
        assert (src, refs) == (["ein Hund de", "zwei Katzen de"], ["ein Hund en", "zwei Katzen en"]), cwd
    checkpoint(str(tmp_path / "another machine"))  # not here: the current folder's files
    monkeypatch.chdir(elsewhere)
    assert run_test_split(run, 1)[:2] == (["nicht de"], ["nicht en"])
    monkeypatch.chdir(empty)
    with pytest.raises(DataError) as err:
        run_test_split(run, None)
    assert str(err.value).startswith(f"{run / 'config.yaml'}: the test split its run was evaluated on: config key "
                                     f"'data.test_src': data/test.de: file not found (relative paths are taken from the "
                                     f"current folder, {empty})")


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_time_record_cut_short_leaves_the_one_before(tmp_path, monkeypatch):
    """train_seconds_before.txt (the training time of the calls a deadline cut short) was written
    with Path.write_text: a write cut short (here by a file size limit of 4 bytes) left '100.' of
    '100.000', read back as less time, and an empty one stopped every later call with float's
    ValueError naming no file. It is written whole or not at all now, as done.json."""
    import resource
    import signal
    import time

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    run = tmp_path / "comet" / "seed1"
    run.mkdir(parents=True)
    (run / "commits.txt").write_text("abc1234\n", encoding="utf-8")
    (run / "train_seconds_before.txt").write_text("100.000\n")
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)

    class LimitedAfterTraining:  # trains past the deadline; then the disk has room for 4 bytes a file
        def __init__(self, cmd, **kwargs):
            pass

        def wait(self, timeout=None):
            time.sleep(0.3)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4, limit[1]))
            return 0

    monkeypatch.setattr(experiments.subprocess, "Popen", LimitedAfterTraining)
    experiments._stopping.clear()  # an interrupt test before this one leaves it set (run_all clears it)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, run)
    try:
        with pytest.raises((CometNMTError, OSError)) as err:
            experiments.train_run(spec, overrides=[], device="cpu", stop_at=time.time() + 0.1, evaluate=lambda r: {})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert (run / "train_seconds_before.txt").read_text() == "100.000\n"
    assert str(run / "train_seconds_before.txt") in str(err.value)


def test_a_runs_fields_are_read_without_its_weights(tmp_path, monkeypatch):
    """how_it_ended (last.pt's trainer state) and run_test_split (best.pt's workdir) read whole
    checkpoints for a few fields, each run of a report: 137 MB, about 0.3 s more than the fields'
    own read, for a paper-size COMET's last.pt. The tensors are now mapped from the file
    (torch.load's mmap), not read; a file in torch's legacy format, which cannot be mapped, is read
    whole, as before."""
    import torch

    from cometnmt.config import Config, to_dict
    from cometnmt.experiments import _trained_in, how_it_ended
    from cometnmt.training.checkpoint import load_checkpoint, save_checkpoint

    payload = {"config": to_dict(Config()), "codec": {}, "model": {"w": torch.arange(1000.0)}, "step": 7, "epoch": 2,
               "workdir": "/where/it/trained", "trainer": {"finished": True, "best_behind": None}}
    run = tmp_path / "run"
    save_checkpoint(payload, run / "last.pt")
    real_load, mapped = torch.load, []

    def noting_load(*args, **kwargs):
        mapped.append(kwargs.get("mmap", False))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", noting_load)
    ended = how_it_ended(run)
    assert ended == {"stopped_by": "rule", "stopping": Config().train.stopping}
    assert _trained_in(run) == "/where/it/trained"
    assert mapped == [True, True]
    assert torch.equal(load_checkpoint(run / "last.pt", mmap=True)["model"]["w"], payload["model"]["w"])

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save({"format_version": 1, **payload}, legacy / "last.pt", _use_new_zipfile_serialization=False)
    mapped.clear()
    assert how_it_ended(legacy) == ended and _trained_in(legacy) == "/where/it/trained"
    assert mapped == [False, False]


def _forget_plugins() -> None:
    """Drop the plugin files' modules this process imported (load_plugins runs each once)."""
    import sys

    for name in [name for name in sys.modules if name.startswith("cometnmt_plugin_")]:
        del sys.modules[name]


def test_an_architecture_of_ones_own_reaches_the_runs_processes_through_cometnmt_plugins(tmp_path, monkeypatch, cli):
    """docs/architectures.md's way to try an architecture without editing the package (REGISTRY["mine"] = ...
    in a script) trained nothing in compare or reproduce: each run is a new `cometnmt train`
    process, which refused it ("config key 'model.arch': 'mine' is not allowed", in the run's
    stdout.log) while the others trained, and the report listed it as not finished. The CLI now
    imports the modules $COMETNMT_PLUGINS names (inherited by the runs' processes), and compare
    and reproduce check before any run trains that such a process knows each config's
    architecture; the runs' recorded commands carry the variable."""
    import sys

    from cometnmt.config import load_config
    from cometnmt.errors import ConfigError
    from cometnmt.models import REGISTRY, load_plugins

    plugin = tmp_path / "my_arch.py"
    plugin.write_text("from cometnmt.models import REGISTRY\nREGISTRY['my_arch'] = REGISTRY['transformer']\n", encoding="utf-8")
    monkeypatch.delenv("COMETNMT_PLUGINS", raising=False)
    monkeypatch.setitem(REGISTRY, "my_arch", REGISTRY["transformer"])  # registered by this process's script only
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny.yaml", ["model.arch=my_arch"])
    with pytest.raises(CometNMTError, match=r"^mine.yaml: model.arch 'my_arch' is registered in this process only: each run "
                                            r"trains in a new `cometnmt train` process, which knows transformer, .*"
                                            r"\(\$COMETNMT_PLUGINS is not set\); name the module"):
        experiments.check_run_configs([("mine.yaml", cfg)])
    monkeypatch.setenv("COMETNMT_PLUGINS", str(plugin))
    experiments.check_run_configs([("mine.yaml", cfg)])  # a new process imports the file and knows it
    shown = experiments._shown_command([sys.executable, "-m", "cometnmt", "train", "mine.yaml"])
    assert experiments.short_command(shown) == f"COMETNMT_PLUGINS={plugin} cometnmt train mine.yaml"

    del REGISTRY["my_arch"]
    try:
        load_plugins()  # as the CLI does first: the file registers it
        assert REGISTRY["my_arch"] is REGISTRY["transformer"]
    finally:
        REGISTRY.pop("my_arch", None)
        _forget_plugins()
    other = tmp_path / "other" / "my_arch.py"  # a file of the same name in another folder is another plugin
    other.parent.mkdir()
    other.write_text("from cometnmt.models import REGISTRY\nREGISTRY['my_other'] = REGISTRY['transformer']\n", encoding="utf-8")
    monkeypatch.setenv("COMETNMT_PLUGINS", f"{plugin},{other}")
    try:
        load_plugins()
        assert "my_arch" in REGISTRY and "my_other" in REGISTRY
    finally:
        REGISTRY.pop("my_arch", None)
        REGISTRY.pop("my_other", None)
        _forget_plugins()
    (tmp_path / "broken.py").write_text("\n\nraise NameError('boom')\n", encoding="utf-8")
    monkeypatch.setenv("COMETNMT_PLUGINS", f"{plugin}, {tmp_path / 'broken.py'}")
    with pytest.raises(ConfigError, match=r"^\$COMETNMT_PLUGINS: cannot import '.*broken.py' \(.*broken.py:3\): NameError: boom"):
        load_plugins()
    _forget_plugins()
    REGISTRY.pop("my_arch", None)
    monkeypatch.setenv("COMETNMT_PLUGINS", "no_such_plugin_module")
    proc = cli("evaluate", "--hyp", str(plugin), "--ref", str(plugin), check=False)
    assert proc.returncode == 2
    assert ("cometnmt: error: $COMETNMT_PLUGINS: cannot import 'no_such_plugin_module': ModuleNotFoundError: "
            "No module named 'no_such_plugin_module'") in proc.stderr
    monkeypatch.delenv("COMETNMT_PLUGINS")
    assert "COMETNMT_PLUGINS=MODULE[,FILE.py...] imports modules" in cli("--help").stdout.replace("\n", " ")


def test_an_architectures_own_section_trains_and_translates_through_the_cli(tmp_path, monkeypatch, cli):
    """An architecture of one's own registered with its section (register_architecture(..., config=...))
    trains through the CLI with --set model.dwconv.kernel_size=5, which the run's config.yaml and its
    checkpoint keep; a new `cometnmt translate` process given the same $COMETNMT_PLUGINS rebuilds the
    model with it (its FFN is 16 * kernel_size wide: the defaults' weights would not load), and one
    without it gives the documented error, naming the architecture and $COMETNMT_PLUGINS."""
    import torch
    import yaml
    from conftest import write_dwconv_plugin

    run = tmp_path / "run"
    monkeypatch.setenv("COMETNMT_PLUGINS", str(write_dwconv_plugin(tmp_path)))
    cli("train", "configs/tiny.yaml", "--set", "model.arch=dwconv", "--set", "model.dwconv.kernel_size=5",
        "--set", "data.max_train_pairs=200", "--set", "data.max_valid_pairs=10", "--set", "train.max_steps=2",
        "--set", "train.valid_bleu=false", "--set", "train.progress=false", "--set", f"train.save_dir={run}")
    assert yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))["model"]["dwconv"] == {"kernel_size": 5,
                                                                                                    "padding": "same"}
    payload = torch.load(run / "last.pt", weights_only=True)
    assert payload["config"]["model"]["dwconv"]["kernel_size"] == 5
    assert payload["model"]["encoder.0.ffn.w1.weight"].shape == (80, 64)  # built with the section's kernel_size
    src = tmp_path / "src.de"
    src.write_text("Ein Mann läuft.\nZwei Hunde spielen im Schnee.\n", encoding="utf-8")
    assert len(cli("translate", str(run / "last.pt"), "-i", str(src)).stdout.splitlines()) == 2
    monkeypatch.delenv("COMETNMT_PLUGINS")
    proc = cli("translate", str(run / "last.pt"), "-i", str(src), check=False)
    assert proc.returncode != 0
    assert "config key 'model.arch': 'dwconv' is not allowed" in proc.stderr and "$COMETNMT_PLUGINS" in proc.stderr


def test_a_run_of_one_epoch_is_drawn_in_the_learning_curves(tmp_path):
    """A run with one validation (a one-epoch smoke run, or a seed stopped after its first epoch)
    was a line of one point, which matplotlib draws as nothing: compare's and reproduce's
    learning_curves.png of two tiny one-epoch runs showed empty axes beside the legend. Such a
    run is drawn as a marker now; the validation-BLEU panel (no legend there) must hold each run's colour."""
    import matplotlib.image as mpimg
    import numpy as np

    from cometnmt import compare, reproduce

    def records(rows):
        return [{"row": row, "seed": 1, "history": [{"epoch": 1, "val_loss": 4.3 + i, "val_bleu": 0.5 + i,
                                                     "val_bleu_sentences": 30}]} for i, row in enumerate(rows)]

    for name, draw in (("compare", lambda out: compare._curves(out, ["a", "b"], records(["a", "b"]))),
                       ("reproduce", lambda out: reproduce._learning_curves(out, ["comet", "transformer"],
                                                                             records(["comet", "transformer"])))):
        out = tmp_path / name
        out.mkdir()
        draw(out)
        image = mpimg.imread(out / "learning_curves.png")[..., :3]  # H,W,RGB in [0, 1]
        right = image[:, image.shape[1] // 2:]  # the validation BLEU panel
        for colour in ("#1f77b4", "#ff7f0e"):  # C0, C1
            rgb = np.array([int(colour[k:k + 2], 16) / 255 for k in (1, 3, 5)])
            near = [np.abs(right - (alpha * rgb + 1 - alpha)).max(-1) < 0.05 for alpha in (1.0, 0.8)]  # reproduce's alpha 0.8
            assert (near[0] | near[1]).sum() > 20, (name, colour)


@pytest.mark.parametrize("epochs", [1, 2, 7])
def test_learning_curves_tick_whole_epochs(tmp_path, monkeypatch, epochs):
    """The epoch axes of compare's and reproduce's learning_curves.png read 0.96, 0.98, 1.00, 1.02,
    1.04 for one-epoch smoke runs (1.0, 1.2, ... 2.0 for two epochs), as if validation ran between
    epochs. Every tick inside either panel's view is a whole epoch now."""
    import matplotlib.figure

    from cometnmt import compare, reproduce

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))

    def records(rows):
        return [{"row": row, "seed": 1, "history": [{"epoch": e, "val_loss": 4.3 - e / 10 + i, "val_bleu": 0.5 + e + i,
                                                     "val_bleu_sentences": 30} for e in range(1, epochs + 1)]}
                for i, row in enumerate(rows)]

    compare._curves(tmp_path, ["a", "b"], records(["a", "b"]))
    reproduce._learning_curves(tmp_path, ["comet", "transformer"], records(["comet", "transformer"]))
    assert len(drawn) == 2
    for fig in drawn:
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


def test_each_run_says_when_it_starts_training_and_where_its_log_is(tmp_path, monkeypatch, caplog):
    """reproduce and compare train each run in a process whose output goes to its stdout.log, and
    their bar counts finished runs: the README's smoke run showed 'runs: 0/4' for minutes, nothing
    saying which run was training nor where its log was. One line says both as each run starts."""
    run = tmp_path / "comet" / "seed2"

    class FakeProcess:
        def __init__(self, cmd, **kwargs):
            pass

        def wait(self, timeout=None):
            return 0

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")  # not asked of git through the fake Popen
    import platform

    platform.processor()  # asks `uname -p` through subprocess.Popen once a process, cached: not the fake's to answer
    monkeypatch.setattr(experiments.subprocess, "Popen", FakeProcess)
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 2, run)
    with caplog.at_level("INFO", logger="cometnmt.experiments"):
        experiments.train_run(spec, overrides=[], device="cpu", stop_at=None, evaluate=lambda r: {})
        (run / "done.json").unlink()
        (run / "last.pt").write_bytes(b"")  # an interrupted run: resumed
        experiments.train_run(spec, overrides=[], device="cpu", stop_at=None, evaluate=lambda r: {})
    assert [r.getMessage() for r in caplog.records] == [f"comet seed 2: training; its log: {run / 'stdout.log'}",
                                                        f"comet seed 2: resuming; its log: {run / 'stdout.log'}"]


def test_run_config_checks_name_the_origin_of_a_keyed_error_and_the_file_of_any_other(tmp_path, monkeypatch):
    """check_run_configs had two except branches, a ConfigError's and any CometNMTError's, doing near
    the same; a DataError naming config keys (as a data file a key named does) took the second and
    was named "PATH: ..." even when a --set override had given the key. Now one branch: an error
    with keys names the override or the file of the base chain that set them (name_origin), keeping
    its class; a ConfigError without keys or any other error is the file's, "PATH: ..."."""
    from cometnmt.config import load_config
    from cometnmt.data import tagging
    from cometnmt.errors import ConfigError, DataError

    tiny = Path(__file__).parents[1] / "configs" / "tiny.yaml"
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {tiny}\ndata:\n  max_len: 50\n", encoding="utf-8")
    cfg = load_config(path)
    raised: list[CometNMTError] = []

    def failing(cfg):
        raise raised[-1]

    monkeypatch.setattr(tagging, "check_training_tags", failing)
    for error, overrides, expected, kind in (
            (DataError("a.de: file not found", keys=("data.max_len",)), ["data.max_len=40"], "a.de: file not found", DataError),
            (DataError("a.de: file not found", keys=("data.max_len",)), [], f"{path}: a.de: file not found", DataError),
            (ConfigError("config key 'data.max_len': bad", keys=("data.max_len",)), ["data.max_len=40"],
             "config key 'data.max_len': bad", ConfigError),
            (ConfigError("config key 'data.max_len': bad", keys=("data.max_len",)), [], f"{path}: config key 'data.max_len': bad",
             ConfigError),
            (ConfigError("no keys"), ["data.max_len=40"], f"{path}: no keys", CometNMTError),
            (DataError("no keys"), ["data.max_len=40"], f"{path}: no keys", CometNMTError),
            (CometNMTError("other"), [], f"{path}: other", CometNMTError)):
        raised.append(error)
        with pytest.raises(CometNMTError) as caught:
            experiments.check_run_configs([(path, cfg)], overrides)
        assert str(caught.value) == expected and type(caught.value) is kind, (error, overrides)  # keyed DataError: was "PATH: ..."


@pytest.mark.parametrize("kind,name,label", [("reproduce", "multi30k_label_smoothing_cpu", "COMET"),
                                              ("compare", "tie_embeddings_cpu", "comet_bn_length_tied")])
def test_seeds_of_a_row_trained_otherwise_are_said_and_their_commands_shown(kind, name, label):
    """Finished runs are reused whatever this call's --set says: seeds 1-2 trained by a call with
    model.d_ff=64 and seed 3 by a later one without it were one table row, their mean and sd over
    two models, under 'other seeds differ only in train.seed' and seed 1's command alone. The report
    now names the seeds trained otherwise than the row's first, with the overrides that differ, and
    shows each recipe's command; a seed differing only in seed, run folder, device and --resume does
    not count."""
    from cometnmt import compare, reproduce
    from conftest import REPO

    report = json.loads((REPO / "reports" / name / "report.json").read_text(encoding="utf-8"))
    first = report["runs"][0]
    parts = shlex.split(first["command"])
    assert "train.lr=5e-4" in parts

    def seed(s: int, command: list[str]) -> dict:
        command = [p.replace("train.seed=1", f"train.seed={s}").replace("seed1", f"seed{s}") for p in command]
        return {**first, "seed": s, "command": shlex.join(command)}

    same = seed(2, [p.replace("train.device=cpu", "train.device=cuda") for p in parts if p != "--resume"] + ["--resume"])
    lr = parts.index("train.lr=5e-4")
    other = seed(3, parts[: lr - 1] + parts[lr + 1:] + ["--set", "model.d_ff=64"])
    report["runs"] = [first, same, other, *report["runs"][1:]]
    text = reproduce._markdown(None, report) if kind == "reproduce" else compare._markdown(report)
    assert (f"- **seeds of a row trained otherwise than its first (the row's mean and sd pool them; their commands are "
            f"below): {label} seed 3 (without train.lr=5e-4; with model.d_ff=64)**") in text
    assert f"- {label}, seeds 1, 2: `cometnmt train " in text
    assert f"- {label}, seed 3: `cometnmt train " in text and "--set model.d_ff=64`" in text
    # one recipe: one line, as before
    report["runs"] = [first, same, *report["runs"][3:]]
    text = reproduce._markdown(None, report) if kind == "reproduce" else compare._markdown(report)
    assert "trained otherwise than its first" not in text and f"- {label}: `cometnmt train " in text


@pytest.mark.parametrize("kind", ["reproduce", "compare"])
def test_a_report_figure_cut_short_leaves_the_one_before(kind, tmp_path, monkeypatch):
    """A kill or a full disk while learning_curves.png was drawn left half a PNG, and the next call
    of the same command, finishing nothing, kept the report folder as it was, that PNG included.
    Figures are written whole or not at all, as report.json and report.md are."""
    import matplotlib.figure

    from cometnmt import compare, reproduce

    png = tmp_path / "learning_curves.png"
    png.write_bytes(b"the earlier figure")

    def cut_short(fig, fname, *args, **kwargs):
        (open(fname, "wb") if isinstance(fname, (str, Path)) else fname).write(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut_short)
    records = [{"row": "comet", "seed": 1, "history": [{"epoch": 1, "val_loss": 5.0}]}]
    with pytest.raises(OSError):
        if kind == "reproduce":
            reproduce._learning_curves(tmp_path, ["comet"], records)
        else:
            compare._curves(tmp_path, ["comet"], records)
    assert png.read_bytes() == b"the earlier figure" and [p.name for p in tmp_path.iterdir()] == [png.name]


def test_a_runs_metrics_log_reads_with_nan_written_either_way(tmp_path):
    """`reproduce` and `compare` read a run's metrics.jsonl (experiments.metrics): a loss that is not
    a number comes back as float NaN from the trainer's lines (null, named under ``nonfinite``) as
    from those of files written before (bare NaN, which json.loads takes)."""
    (tmp_path / "metrics.jsonl").write_text(
        '{"event": "valid", "epoch": 1, "step": 5, "val_loss": NaN, "val_loss_per_100_tokens": Infinity}\n'
        '{"event": "valid", "epoch": 2, "step": 9, "val_loss": null, "val_loss_per_100_tokens": null, '
        '"nonfinite": {"val_loss": "NaN", "val_loss_per_100_tokens": "Infinity"}}\n'
        '{"event": "train", "step": 10, "loss": 2.5}\n', encoding="utf-8")
    records = experiments.metrics(tmp_path)
    assert [r["step"] for r in records] == [5, 9, 10] and records[2] == {"event": "train", "step": 10, "loss": 2.5}
    for r in records[:2]:
        assert r["val_loss"] != r["val_loss"] and r["val_loss_per_100_tokens"] == float("inf") and "nonfinite" not in r
    assert experiments.metrics(tmp_path / "none") == []


def test_an_eval_limit_the_splits_fit_in_is_not_called_a_smoke_setting(monkeypatch):
    """--eval-limit 1014 decodes every sentence of Multi30k's dev (1,014) and test (1,000) splits,
    but report.md said "smoke setting: at most the first 1014 sentences of each split were decoded".
    Each run records the split's size (split_sentences) beside what it scored; report.json names
    the splits the limit cut, and report.md says a smoke setting for those only."""
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")

    def run(seed: int, dev: tuple[int, int], test: tuple[int, int]) -> dict:
        return {"row": "comet", "seed": seed, "valid": {"n_sentences": dev[0], "split_sentences": dev[1]},
                "test": {"n_sentences": test[0], "split_sentences": test[1]}}

    args = argparse.Namespace(device="cpu", set=[], eval_limit=1014, out=".")
    p = provenance(args, 1.0, [run(1, (1014, 1014), (1000, 1000))], [])
    text = "\n".join(provenance_lines(p))
    assert p["eval_limit_cut"] == [] and "smoke setting" not in text and "first 1014" not in text
    assert "--eval-limit 1014 cut no split: every sentence of the dev and test splits was decoded" in text
    args.eval_limit = 1000  # the dev split's first 1,000 of 1,014; the whole test split
    p = provenance(args, 1.0, [run(1, (1000, 1014), (1000, 1000))], [])
    assert p["eval_limit_cut"] == ["valid"]
    assert "smoke setting: only the first 1000 sentences of the dev split were decoded (--eval-limit 1000)" in \
        "\n".join(provenance_lines(p))
    args.eval_limit = 30
    p = provenance(args, 1.0, [run(1, (30, 1014), (30, 1000))], [])
    assert p["eval_limit_cut"] == ["valid", "test"]
    assert "smoke setting: only the first 30 sentences of each split were decoded" in "\n".join(provenance_lines(p))
    del p["eval_limit_cut"]  # a report.json from before the key (cometnmt render): said as it was
    assert "smoke setting: at most the first 30 sentences of each split were decoded" in "\n".join(provenance_lines(p))


def test_the_hypotheses_folder_holds_the_reports_runs_only(tmp_path, caplog):
    """OUT/hypotheses kept the copies of runs a later report no longer covered (a row or seed not
    asked for again, a config left out of compare, a run whose done.json was deleted), beside those
    it does cover: a reader recomputing the report's scores from that folder met runs it does not
    name. Copies of runs the report does not cover are removed after it is written; a user's other
    files there are kept, and so is a copy whose run folder is gone (its only copy), with a warning.
    A run the report took from an earlier one (reproduce --merge-report) keeps its copy."""
    import logging

    out = tmp_path / "report"
    hyps = out / "hypotheses"

    def run(name: str, seed: int, done: bool) -> RunSpec:
        spec = RunSpec(name, Path("configs/multi30k/comet.yaml"), seed, out / "runs" / name / f"seed{seed}")
        spec.run_dir.mkdir(parents=True)
        for split in ("valid", "test"):
            (spec.run_dir / f"{split}.hyp").write_text(f"{name} {seed} {split}\n")
        if done:
            (spec.run_dir / "done.json").write_text(json.dumps({"row": name, "seed": seed}))
        return spec

    a1, a2, b1 = run("a", 1, True), run("a", 2, True), run("b", 1, True)
    merged = []

    def report(records, missing, seconds):
        return {"runs": records + merged}

    run_and_report(_args(out, True), [a1, a2, b1], lambda run: {}, report)
    assert sorted(str(p.relative_to(hyps)) for p in hyps.rglob("*")) == [
        "a", "a/seed1", "a/seed1/test.hyp", "a/seed1/valid.hyp", "a/seed2", "a/seed2/test.hyp", "a/seed2/valid.hyp",
        "b", "b/seed1", "b/seed1/test.hyp", "b/seed1/valid.hyp"]
    (hyps / "b" / "seed1" / "notes.txt").write_text("mine\n")  # a user's own files: kept
    (hyps / "README.md").write_text("mine\n")
    # a run whose folder is gone (an earlier report merged it): its copy is the only one
    (hyps / "c" / "seed3").mkdir(parents=True)
    (hyps / "c" / "seed3" / "test.hyp").write_text("c 3 test\n")
    (a2.run_dir / "done.json").unlink()  # to be evaluated again: not in this report
    with caplog.at_level(logging.INFO, logger="cometnmt.experiments"):
        run_and_report(_args(out, True), [a1, a2], lambda run: {}, report)  # row b no longer asked for
    assert sorted(str(p.relative_to(hyps)) for p in hyps.rglob("*")) == [
        "README.md", "a", "a/seed1", "a/seed1/test.hyp", "a/seed1/valid.hyp", "b", "b/seed1", "b/seed1/notes.txt",
        "c", "c/seed3", "c/seed3/test.hyp"]
    assert str(hyps / "a" / "seed2" / "valid.hyp") in caplog.text and str(hyps / "b" / "seed1" / "test.hyp") in caplog.text
    assert f"run folders are gone (the only copies; delete them by hand if they are not wanted): {hyps / 'c' / 'seed3'}" \
        in caplog.text
    assert (a2.run_dir / "test.hyp").exists() and (out / "runs" / "b" / "seed1" / "test.hyp").exists()  # runs/ untouched
    merged.append({"row": "c", "seed": 3})  # covered by the report (merged): kept, no warning
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cometnmt.experiments"):
        run_and_report(_args(out, True), [a1], lambda run: {}, report)
    assert (hyps / "c" / "seed3" / "test.hyp").exists() and "c/seed3" not in caplog.text


def test_an_interrupt_stops_a_runs_evaluation_within_a_batch(tmp_path, monkeypatch):
    """Ctrl-C while a run's splits were decoded stopped the trainings at once, but the command
    waited for the decoding to end (the pool's thread gets no signal; minutes on a CPU), and then
    wrote the run's done.json. The decoding stops at its next batch now: the run has no done.json
    (the next call evaluates it again), and the training time before the evaluation is kept."""
    import signal
    import threading

    from cometnmt.interrupts import check_stop

    monkeypatch.setattr(experiments.subprocess, "Popen", _FinishedTraining)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    batches = []

    def evaluate(run):
        for b in range(100):  # a decoding loop's batches, as Translator.translate_ids checks between them
            check_stop()
            batches.append(b)
            if b == 0:  # a real SIGINT at the main thread: it wakes from waiting on this run (interrupt_main does not)
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            if b == 1:
                assert experiments._stopping.wait(10)  # the command took the interrupt
        return {"test": 1}

    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, tmp_path / "seed1")
    with pytest.raises(KeyboardInterrupt):
        experiments.run_all([spec], jobs=1, overrides=[], device="cpu", stop_at=None, evaluate=evaluate)
    assert batches == [0, 1] and not (spec.run_dir / "done.json").exists()
    assert float((spec.run_dir / "train_seconds_before.txt").read_text()) >= 0


def test_the_decoding_loop_stops_between_batches_when_its_thread_is_asked_to(monkeypatch):
    """Translator.translate_ids checks interrupts.check_stop before each batch: within a stop_on
    block whose event is set, it raises Stopped (a KeyboardInterrupt) having decoded no more."""
    import threading
    import types

    import torch

    from cometnmt import inference
    from cometnmt.config import Config
    from cometnmt.interrupts import Stopped, stop_on

    words = types.SimpleNamespace(kind="spacy", detokenize=" ".join)
    codec = types.SimpleNamespace(src_tok=words, tgt_tok=words, src_sos_eos=False,
                                  tgt_vocab=types.SimpleNamespace(decode=lambda ids: [str(i) for i in ids]))
    translator = inference.Translator(torch.nn.Linear(1, 1), codec, Config(), torch.device("cpu"))
    monkeypatch.setattr(translator, "_check_positions", lambda *a: None)
    stop, searched = threading.Event(), []

    def search(model, src, *args, **kwargs):
        searched.append(src.shape[0])
        stop.set()  # Ctrl-C during the first batch
        return [[types.SimpleNamespace(tokens=[5], score=0.0)] for _ in range(src.shape[0])]

    monkeypatch.setattr(inference, "search", search)
    cfg = translator.search_config(batch_size=1)
    assert len(translator.translate_ids([[4, 5]] * 3, cfg)) == 3 and searched == [1, 1, 1]  # no block: all decoded
    searched.clear()
    stop.clear()
    with stop_on(stop), pytest.raises(Stopped):
        translator.translate_ids([[4, 5]] * 3, cfg)
    assert searched == [1]


def _strict_json(text: str):
    """``text`` parsed as a strict reader parses it (jq, JSON.parse, render's schema): a bare NaN,
    Infinity or -Infinity is an error, where json.loads takes them."""
    def refuse(name):
        raise ValueError(f"not JSON: a bare {name}")

    return json.loads(text, parse_constant=refuse)


def test_strict_json_names_each_value_that_is_not_finite_and_reads_it_back():
    """done.json and report.json are written by run_files.strict_json: a float that is not finite,
    at any depth, is null and named by its JSON Pointer under "nonfinite" (keys with "/" and "~"
    escaped), and read_strict_json gives the float back; a null of the record's own stays null, and
    a bare NaN of a file written before reads as it always did."""
    from cometnmt.training.run_files import read_strict_json, strict_json

    nan, inf = float("nan"), float("inf")
    record = {"valid": {"bleu": nan, "chrf": 50.0}, "history": [{"val_loss": 2.0}, {"val_loss": inf}],
              "a/b~c": [-inf, None], "pair": (1.5, nan), "none": None, "checkpoints": {1: ["best.pt"]}}
    text = strict_json(record, indent=1)
    strict = _strict_json(text)
    assert strict["nonfinite"] == {"/valid/bleu": "NaN", "/history/1/val_loss": "Infinity", "/a~1b~0c/0": "-Infinity",
                                   "/pair/1": "NaN"}
    assert strict["valid"]["bleu"] is None and strict["pair"] == [1.5, None]
    back = read_strict_json(text)
    assert "nonfinite" not in back and back["valid"]["bleu"] != back["valid"]["bleu"] and back["pair"][1] != back["pair"][1]
    assert back["history"][1]["val_loss"] == inf and back["a/b~c"] == [-inf, None] and back["none"] is None
    assert strict_json({"bleu": 30.0}) == '{"bleu": 30.0}'  # all finite: as json.dumps writes it, no key
    old = read_strict_json('{"valid": {"bleu": NaN}, "history": [{"val_loss": Infinity}]}')  # written before
    assert old["valid"]["bleu"] != old["valid"]["bleu"] and old["history"][0]["val_loss"] == inf
    with pytest.raises(TypeError):  # a value nothing can name: not written as a bare NaN
        strict_json([nan])


def test_a_runs_done_json_is_strict_json_and_an_old_one_with_nan_still_reads(tmp_path, monkeypatch):
    """A run whose validation diverged (its learning curve holds a NaN loss, its BLEU NaN) wrote
    done.json with json.dumps' bare NaN, which is not JSON. It is strict now, with the value named
    under "nonfinite" (run_files.strict_json), and read back as the float; a done.json written
    before, with bare NaN, still reads."""
    import platform

    platform.processor()  # asks `uname -p` through subprocess.Popen once a process, cached: not the mock's to answer
    monkeypatch.setattr(experiments.subprocess, "Popen", _FinishedTraining)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    experiments._stopping.clear()  # an earlier test's Ctrl-C (run_all clears it; train_run alone does not)
    nan = float("nan")
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, tmp_path / "seed1")
    experiments.train_run(spec, overrides=[], device="cpu", stop_at=None, evaluate=lambda run: {
        "valid": {"bleu": nan, "chrf": 1.0}, "history": [{"epoch": 1, "val_loss": nan, "val_bleu": 0.0}]})
    done = spec.run_dir / "done.json"
    strict = _strict_json(done.read_text(encoding="utf-8"))
    assert strict["valid"]["bleu"] is None and strict["nonfinite"] == {"/valid/bleu": "NaN", "/history/0/val_loss": "NaN"}
    again = experiments.train_run(spec, overrides=[], device="cpu", stop_at=None, evaluate=lambda run: {})  # finished: read
    assert again["valid"]["bleu"] != again["valid"]["bleu"] and again["history"][0]["val_loss"] != again["history"][0]["val_loss"]
    assert "nonfinite" not in again
    done.write_text('{"row": "comet", "seed": 1, "valid": {"bleu": NaN}}', encoding="utf-8")  # an older version's
    old = experiments.read_done(done)
    assert old["valid"]["bleu"] != old["valid"]["bleu"]


@pytest.mark.parametrize("kind,name", [("reproduce", "multi30k_label_smoothing_cpu"), ("compare", "tie_embeddings_cpu")])
def test_a_run_with_a_nan_score_gives_a_strict_report_json_that_renders(kind, name, tmp_path, monkeypatch):
    """report.json held a bare NaN for a run whose validation loss or BLEU was NaN (and for the mean
    and sd of a row over it), which strict readers refuse. It is strict JSON now (the numbers null,
    named under "nonfinite"), `cometnmt render` draws it with the numbers as they were, and the
    readers (render, --merge-report, a call's check of the report it keeps) still take the bare NaN
    of a report.json written before."""
    import argparse

    from cometnmt import compare, reproduce
    from cometnmt.render import render_report
    from conftest import REPO

    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    committed = json.loads((REPO / "reports" / name / "report.json").read_text(encoding="utf-8"))
    first, nan = committed["runs"][0], float("nan")
    history = [dict(h, val_loss=nan, val_bleu=nan) if i == 1 else h for i, h in enumerate(first["history"])]
    diverged = {**first, "seed": 2, "valid": {**first["valid"], "bleu": nan}, "history": history}
    runs = [first, diverged, *committed["runs"][1:]]
    out = tmp_path / "out"
    out.mkdir()
    args = argparse.Namespace(out=str(out), device="cpu", set=[], eval_limit=None, seeds=[], merge_report=None,
                              candidate=None, examples=5, bootstrap=10, metrics=committed.get("metrics", ["bleu"]))
    if kind == "reproduce":
        reproduce.build_report(args, ["comet", "transformer"], runs, [], 1.0)
    else:
        compare.build_report(args, committed["systems"], runs, [], 1.0)
    text = (out / "report.json").read_text(encoding="utf-8")
    strict = _strict_json(text)
    row = strict["table"][0]
    assert row["seeds"] == [1, 2] and row["valid_bleu"] == [None, None]  # the mean and sd over the NaN seed
    assert strict["nonfinite"]["/runs/1/valid/bleu"] == "NaN" and strict["nonfinite"]["/runs/1/history/1/val_loss"] == "NaN"
    assert strict["nonfinite"]["/table/0/valid_bleu/0"] == "NaN"
    (out / "learning_curves.png").unlink()
    md = render_report(out / "report.json").read_text(encoding="utf-8")
    assert "re-rendered" in md and (out / "learning_curves.png").stat().st_size > 0
    assert "| nan ± nan |" in md  # the row's dev BLEU over the NaN seed, as before (it stopped the report: mean_sd)
    assert experiments._reports_all(out / "report.json", runs)

    # a report.json written before: bare NaN, which json.loads takes (render, --merge-report)
    old = out / "old" / "report.json"
    old.parent.mkdir()
    old.write_text(json.dumps(_strict_json(text) | {"runs": runs}, indent=1), encoding="utf-8")
    assert "NaN" in old.read_text(encoding="utf-8")
    render_report(old)
    assert experiments._reports_all(old, runs)
    if kind == "reproduce":
        args.merge_report, args.seeds = old, [1, 2]
        prev = reproduce._previous_report(args, ["comet", "transformer"])
        assert prev["runs"][1]["valid"]["bleu"] != prev["runs"][1]["valid"]["bleu"]


def test_the_deadline_stops_a_runs_evaluation_within_a_batch(tmp_path, monkeypatch):
    """--deadline started no run or evaluation after it and stopped the trainings at it, but an
    evaluation under way decoded its splits to their end (minutes on a CPU past the time given),
    and wrote done.json. It stops within a batch of the deadline now, as Ctrl-C stops it (the same
    per-thread flag: interrupts.stop_on, checked by Translator.translate_ids between batches): the
    run has no done.json, the report lists it as not finished, and the next call evaluates it."""
    import platform
    import time
    import types

    import torch

    from cometnmt import inference
    from cometnmt.config import Config

    platform.processor()  # asks `uname -p` through subprocess.Popen once a process, cached: not the mock's to answer
    words = types.SimpleNamespace(kind="spacy", detokenize=" ".join)
    codec = types.SimpleNamespace(src_tok=words, tgt_tok=words, src_sos_eos=False,
                                  tgt_vocab=types.SimpleNamespace(decode=lambda ids: [str(i) for i in ids]))
    translator = inference.Translator(torch.nn.Linear(1, 1), codec, Config(), torch.device("cpu"))  # before Popen's mock:
    monkeypatch.setattr(translator, "_check_positions", lambda *a: None)  # it may look up a library through a process
    monkeypatch.setattr(experiments.subprocess, "Popen", _FinishedTraining)
    monkeypatch.setenv("COMETNMT_COMMIT", "abc1234")
    searched = []

    def search(model, src, *args, **kwargs):  # a slow batch: the split's 400 decode for 4 s
        searched.append(src.shape[0])
        time.sleep(0.01)
        return [[types.SimpleNamespace(tokens=[5], score=0.0)] for _ in range(src.shape[0])]

    monkeypatch.setattr(inference, "search", search)
    cfg = translator.search_config(batch_size=1)

    def evaluate(run):
        return {"test": {"n_sentences": len(translator.translate_ids([[4, 5]] * 400, cfg))}}

    out = tmp_path / "report"
    spec = RunSpec("comet", Path("configs/multi30k/comet.yaml"), 1, out / "runs" / "comet" / "seed1")
    reports = []

    def report(records, missing, seconds):
        reports.append((records, missing))

    # the training (a stand-in) ends at once: the evaluation starts well before the deadline
    assert run_and_report(_args(out, False, deadline=1.0), [spec], evaluate, report) == 0
    assert 0 < len(searched) < 400  # it started before the deadline and stopped at it, not after the whole split
    assert not (spec.run_dir / "done.json").exists() and reports == [([], ["comet seed 1"])]
    assert float((spec.run_dir / "train_seconds_before.txt").read_text()) >= 0
    searched.clear()
    assert run_and_report(_args(out, False, deadline=None), [spec], evaluate, report) == 0  # the next call finishes it
    assert len(searched) == 400 and reports[-1][1] == [] and reports[-1][0][0]["test"] == {"n_sentences": 400}
    assert (spec.run_dir / "done.json").exists()


def _scored(row: str, seed: int, eval_limit, valid: tuple[int, int], test: tuple[int, int]) -> dict:
    """A finished run's record: (sentences scored, the split's size) of each split."""
    return {**_record(row, seed, eval_limit),
            **{split: {"bleu": 30.0, "n_sentences": n, "split_sentences": size}
               for split, (n, size) in (("valid", valid), ("test", test))}}


def test_an_eval_limit_that_cuts_no_split_is_the_same_evaluation_as_none(tmp_path):
    """--eval-limit was compared as a number: runs evaluated with --eval-limit 1014 (every sentence
    of Multi30k's 1,014 dev and 1,000 test sentences) were refused by a call without it, as another
    evaluation setting, and one without it by a call of --eval-limit 5000. The setting is the
    sentences each split decoded (split_sentences records the split's size): a limit at or above a
    split's size cuts nothing, as no limit does; one that cuts a split (1000 of the 1,014 dev
    sentences) is another setting, whichever way round. A run that predates split_sentences is
    compared by its number, as before."""
    whole = ((1014, 1014), (1000, 1000))
    runs = [("a", _scored("comet", 1, 1014, *whole)), ("b", _scored("comet", 2, None, *whole))]
    for limit in (None, 1014, 5000):
        experiments.evaluation_mismatch(runs, {"eval_limit": limit})  # one setting: each split whole
    cut = [("c", _scored("comet", 3, 1000, (1000, 1014), (1000, 1000)))]  # the dev split's first 1,000
    for limit in (None, 1014, 1005):
        with pytest.raises(CometNMTError, match="c was evaluated with --eval-limit 1000, but this call has"):
            experiments.evaluation_mismatch(cut, {"eval_limit": limit})
    experiments.evaluation_mismatch(cut, {"eval_limit": 1000})
    with pytest.raises(CometNMTError) as err:  # 1014 and none: one setting, which the fix names
        experiments.evaluation_mismatch(runs, {"eval_limit": 1000})
    assert str(err.value) == ("a was evaluated with --eval-limit 1014; b was evaluated without --eval-limit, but this call "
                              "has --eval-limit 1000; leave out --eval-limit as before, or delete their done.json files "
                              "to evaluate them again")
    older = [("d", _record("comet", 4, 1014))]  # no split_sentences: the number decides
    with pytest.raises(CometNMTError, match="d was evaluated with --eval-limit 1014, but this call has none"):
        experiments.evaluation_mismatch(older, {"eval_limit": None})

    # through a call: finished runs of --eval-limit 1014 are reported by one without it, not called a smoke setting
    out = tmp_path / "report"
    specs = [RunSpec("comet", Path("comet.yaml"), s, out / "runs" / "comet" / f"seed{s}") for s in (1, 2)]
    for spec, (_, rec) in zip(specs, runs):
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "done.json").write_text(json.dumps(rec))
    reports = []
    args = _args(out, True)
    run_and_report(args, specs, lambda run: {}, lambda records, *a: reports.append(records))
    assert [r["seed"] for r in reports[-1]] == [1, 2]
    lines = "\n".join(provenance_lines(provenance(args, 1.0, reports[-1], [])))
    assert "smoke" not in lines and "--eval-limit" not in lines
    (specs[1].run_dir / "done.json").write_text(json.dumps(cut[0][1] | {"seed": 2}))
    with pytest.raises(CometNMTError, match="seed2 was evaluated with --eval-limit 1000, but this call has none"):
        run_and_report(args, specs, lambda run: {}, lambda records, *a: reports.append(records))
