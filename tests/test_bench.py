"""The benchmark scripts run end to end on tiny settings (their numbers are not asserted: speed
lives in bench/, never in tests). A change that breaks a bench path the training tests do not
take (the meta-device FLOP count, the rounds, decoding three ways, the operator counter) fails
here rather than on the next GPU session."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from conftest import REPO

TINY = ["--set", "data.max_train_pairs=300", "--set", "model.d_model=32", "--set", "model.n_heads=2",
        "--set", "model.d_ff=64", "--set", "train.batch_tokens=256"]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _rerun_env() -> list[str]:
    """The NAME=VALUE words a recorded bench command starts with in this process (bench.RERUN_ENV)."""
    import os

    return [f"{name}={os.environ[name]}" for name in _script("bench.py").RERUN_ENV if name in os.environ]


def _script(name: str):
    """bench/NAME (a script, not a package module) imported for its functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name.removesuffix('.py')}", REPO / "bench" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_bench(data_dir, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """One tiny bench.py run (its output and JSON result), which several tests read: a run is ~15 s."""
    out = tmp_path_factory.mktemp("bench") / "cpu.json"
    proc = run("bench.py", "--steps", "2", "--warmup", "1", "--rounds", "2", "--decode-sentences", "8",
               "--threads", "1", *TINY, "--out", str(out))
    return proc, json.loads(out.read_text())


def test_bench_py_trains_decodes_and_compares_in_rounds(tiny_bench):
    proc, result = tiny_bench
    assert [m["arch"] for m in result["models"]] == ["transformer", "comet"]
    for m in result["models"]:
        training, decoding = m["training"], m["decoding"]
        assert training["timed_steps"] == 2 and training["tokens_per_s"] > 0
        assert len(training["step_seconds"]) == 2 and training["median_step_s"] == statistics.median(training["step_seconds"])
        assert training["mean_step_s"] == pytest.approx(training["seconds"] / 2)
        assert training["flops_per_target_token"] > 0 and training["aten_ops_per_step"] > 0
        assert decoding["sentences"] == 8 and decoding["greedy_equals_full_prefix"] == 1.0
    ratio = result["comet_over_transformer"]
    assert len(ratio["rounds"]["ratios"]) == 2 and ratio["ratio"] == ratio["rounds"]["median_ratio"]
    # the FLOP-normalised ratio normalises the verdict's ratio (the rounds'), not the one-after-the-other
    # runs' MFU; the rounds (2 x 1 step) time the same 2 batches as the runs, so the FLOPs per token agree
    transformer, comet = (m["training"]["flops_per_target_token"] for m in result["models"])
    assert ratio["mfu_ratio"] == pytest.approx(ratio["ratio"] * comet / transformer)
    assert "COMET/Transformer training tokens/s" in proc.stdout
    # which tokens tok/s counts is said under the table, not only in bench/README.md
    assert "tok/s = target tokens (words + </s>, padding excluded)" in proc.stdout


def test_comet_variants_take_turns_in_the_rounds_each_with_its_ratio(data_dir, tmp_path):
    """``--models transformer comet comet@unfused ...``: NAME@VARIANT builds the preset NAME and then
    changes the built model (unfused: the gated convolutions' GPU training path without
    _GatedConv1d and _CastForTwo; conv1d: that path on the CPU too). Before, an entry with @ was no
    preset, and the rounds took transformer and comet alone, so the two COMET paths could not be
    timed side by side in one run. Every COMET entry now runs in the table and takes its turn in the
    same rounds, with its own ratio to the Transformer in the JSON and the report; plain comet's stays
    the verdict. On the CPU (im2col) unfused changes nothing; on F.conv1d it dispatches more operators."""
    out = tmp_path / "cpu.json"
    models = ["transformer", "comet", "comet@unfused", "comet@conv1d", "comet@conv1d,unfused"]
    proc = run("bench.py", "--models", *models, "--steps", "2", "--warmup", "1", "--rounds", "2", "--no-decode",
               "--threads", "1", *TINY, "--out", str(out))
    result = json.loads(out.read_text())
    assert [m["preset"] for m in result["models"]] == models
    assert [m["variants"] for m in result["models"]] == [[], [], ["unfused"], ["conv1d"], ["conv1d", "unfused"]]
    ops = {m["preset"]: m["training"]["aten_ops_per_step"] for m in result["models"]}
    assert ops["comet@unfused"] == ops["comet"]  # im2col: no gate Function to switch off
    assert ops["comet@conv1d,unfused"] > ops["comet@conv1d"]  # autograd's operators in place of _GatedConv1d's
    comets = models[1:]
    over = result["over_transformer"]
    assert list(over) == comets and result["comet_over_transformer"] == over["comet"]
    for name in comets:
        rounds = over[name]["rounds"]
        assert over[name]["model"] == name and rounds["ratio"] == f"{name}/transformer"
        assert list(rounds["models"]) == ["transformer", *comets]  # one set of rounds, all five taking turns
        assert len(rounds["ratios"]) == 2 and over[name]["ratio"] == rounds["median_ratio"]
        per = rounds["models"]
        assert rounds["ratios"] == [c / t for t, c in zip(per["transformer"]["tokens_per_s"], per[name]["tokens_per_s"])]
        assert f"COMET/Transformer ({name}/transformer) training tokens/s, the models taking turns" in proc.stdout
        assert f"COMET/Transformer ({name}/transformer) training tokens/s: " in proc.stdout


def test_rounds_put_each_model_in_each_position_equally_often(monkeypatch):
    """bench.py's rounds ran three or more models ABC, CBA, ABC, ...: the middle model was always
    second (gcab's comet, between the Transformer and comet@unfused), a position bias in its
    per-round ratios. The order now rotates (ABC, BCA, CAB, then BAC, ACB, CBA), so over a cycle
    each model runs in each position, and before each other model, equally often; two models keep
    AB, BA, .... bench_rounds runs the models in that order (stand-in trainers record it) and the
    JSON lists each round's."""
    import argparse

    import torch

    bench = _script("bench.py")
    for names in (["a", "b", "c"], ["a", "b", "c", "d"], ["t", "c", "u", "v", "w"]):
        n = len(names)
        orders = [bench.round_order(names, r) for r in range(2 * n)]
        assert all(sorted(o) == sorted(names) for o in orders)
        for pos in range(n):
            for half in (orders[:n], orders[n:]):  # every model once in each position per half cycle
                assert sorted(o[pos] for o in half) == sorted(names), (names, pos)
        for x in names:  # and before each other model as often as after it over the cycle
            for y in names:
                if x != y:
                    assert sum(o.index(x) < o.index(y) for o in orders) == n, (names, x, y)
        assert bench.round_order(names, 2 * n + 1) == orders[1]  # then again
    assert [bench.round_order(["t", "c"], r) for r in range(5)] == [["t", "c"], ["c", "t"]] * 2 + [["t", "c"]]
    assert [bench.round_order(["a", "b", "c"], r) for r in range(6)] == [list(o) for o in
                                                                        ("abc", "bca", "cab", "bac", "acb", "cba")]

    ran = []

    class Trainer:
        _compiled = False

        def __init__(self, name):
            self.name = name

        def train_step(self, group):
            ran.append(self.name)
            return torch.zeros(()), 10

    monkeypatch.setattr(bench, "setup_model", lambda name, *a: (name, None, None, None))
    monkeypatch.setattr(bench, "training_groups", lambda cfg, model, data, device, args, n: (Trainer(cfg), [[]] * n))
    monkeypatch.setattr(bench, "warm_up", lambda *a: True)
    monkeypatch.setattr(bench, "count_flops", lambda cfg, data, groups: [1] * len(groups))
    args = argparse.Namespace(rounds=6, steps=6, warmup=0, seed=1)
    names = ["transformer", "comet", "comet@unfused"]
    turns = bench.bench_rounds(names, args, torch.device("cpu"), {}, {}, "unused")
    expected = [bench.round_order(names, r) for r in range(6)]
    assert turns["order"] == expected and ran == [name for order in expected for name in order]
    assert [o[1] for o in turns["order"]].count("comet") == 2  # second in 2 of 6 rounds, not in all of them


def test_a_bad_model_variant_is_refused_by_the_argument_parser(capsys):
    bench = _script("bench.py")
    assert bench.split_entry("comet@conv1d,unfused") == ("comet", ["conv1d", "unfused"])
    for argv, needle in ((["--models", "comet@fused"], "--models comet@fused: variant 'fused' is unknown"),
                         (["--models", "comet@"], "--models comet@: an entry is NAME or NAME@VARIANT"),
                         (["--models", "comet", "comet"], "an entry given twice")):
        with pytest.raises(SystemExit) as stop:
            bench.parse_args(argv)
        assert stop.value.code == 2 and needle in capsys.readouterr().err, argv


def test_rounds_default_fits_the_steps_and_a_bad_rounds_stops_before_training(capsys):
    """``bench.py --gpu --steps 4`` trained and timed both models, then stopped in the rounds with
    "--rounds 8 exceeds --steps 4": a flag nobody had given (its GPU default), and no JSON written.
    The default is now 8 rounds or --steps if fewer, and a --rounds the steps cannot fill is refused
    by the argument parser, naming both flags, before anything trains."""
    bench = _script("bench.py")
    assert bench.parse_args(["--gpu", "--steps", "4"]).rounds == 4
    assert bench.parse_args(["--gpu"]).rounds == 8
    assert bench.parse_args(["--steps", "4", "--rounds", "2"]).rounds == 2
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--gpu", "--steps", "4", "--rounds", "8"])
    assert stop.value.code == 2 and "--rounds 8 must be between 0 and --steps 4" in capsys.readouterr().err


def test_no_timed_steps_is_refused_by_the_argument_parser(capsys):
    """``bench.py --steps 0`` trained and decoded, then stopped with a ZeroDivisionError (seconds /
    steps) and wrote no JSON; bench_transformer_pp.py stopped on the median of no step times and
    profile_step.py divided by 0. Each now refuses it at parse, naming the flag, as a negative
    --warmup (which took the last steps for warm-up ones)."""
    for script, argv, needle in (("bench.py", ["--steps", "0"], "--steps 0 must be at least 1"),
                                 ("bench.py", ["--warmup", "-1"], "--warmup -1 must be at least 0"),
                                 ("bench_transformer_pp.py", ["--steps", "0"], "--steps 0 must be at least 1"),
                                 ("bench_transformer_pp.py", ["--warmup", "-2"], "--warmup -2 must be at least 0")):
        with pytest.raises(SystemExit) as stop:
            _script(script).parse_args(argv)
        assert stop.value.code == 2 and needle in capsys.readouterr().err, (script, argv)
    with pytest.raises(SystemExit) as stop:
        _script("profile_step.py").main(["--steps", "0"])
    assert stop.value.code == 2 and "--steps 0 must be at least 1" in capsys.readouterr().err


def test_a_compile_that_fell_back_to_eager_says_so(data_dir, tmp_path, monkeypatch, capsys):
    """Where torch.compile is unavailable or fails, the trainer warns and trains eagerly; bench.py's
    JSON still said "compile": true and its table "compiled (default)" for that eager run
    (bench_transformer_pp.py: "compile": "default"). The JSON now records whether the timed steps
    ran compiled, and the table says the run fell back."""
    import torch

    import cometnmt.training.trainer as trainer_module

    def no_compiler(module, mode):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(trainer_module, "compile_module", no_compiler)
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", str(data_dir))
    out, pp_out = tmp_path / "cpu.json", tmp_path / "pp.json"
    bench, bench_pp = _script("bench.py"), _script("bench_transformer_pp.py")
    threads = torch.get_num_threads()
    try:
        bench.main(["--models", "transformer", "--steps", "1", "--warmup", "1", "--rounds", "0", "--no-decode",
                    "--threads", "1", "--compile", *TINY, "--set", f"data.multi30k_dir={data_dir}", "--out", str(out)])
        training = json.loads(out.read_text())["models"][0]["training"]
        assert (training["compile"], training["compile_mode"], training["compiled"]) == (True, "default", False)
        report = capsys.readouterr().out
        assert "--compile default FELL BACK TO EAGER" in report and "compiled (default)" not in report
        assert bench._compiled_note({"compile": True, "compile_mode": "default", "compiled": True}) == ", compiled (default)"
        bench_pp.main(["--steps", "1", "--warmup", "1", "--no-tags", "--max-pairs", "300", "--threads", "1", "--compile",
                       "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.transformer_pp.conv_heads=2",
                       "--set", "model.d_ff=64", "--set", "model.enc_layers=1", "--set", "model.dec_layers=1",
                       "--batch-tokens", "256", "--out", str(pp_out)])
    finally:
        torch.set_num_threads(threads)
    result = json.loads(pp_out.read_text())
    assert result["compile"] == "default" and [r["compiled"] for r in result["results"].values()] == [False, False]
    assert "transformer_pp and transformer: --compile default FELL BACK TO EAGER" in capsys.readouterr().out


def test_the_cpu_peak_memory_holds_no_matmul_probe(data_dir, tmp_path):
    """On the CPU the bench times a 2048^3 matmul after every timed step (MFU/step), inside the window
    whose peak resident size is the table's ``peak mem``. The probe allocated two random matrices
    and their product at every call, and the trainer's keep_freed_memory keeps freed memory
    resident, so the column counted them as the model's: 81-94 MiB for this tiny model, whose
    training needs about 16 (found comparing the column with the probe stubbed out; the paper-size
    Transformer: 616 against 589 MiB). The probe's matrices are now made before the peak is reset,
    so the column is below what the probe's three matrices alone take."""
    bench = _script("bench.py")
    out = tmp_path / "cpu.json"
    run("bench.py", "--models", "transformer", "--steps", "2", "--warmup", "1", "--rounds", "0", "--no-decode",
        "--threads", "1", *TINY, "--out", str(out))
    training = json.loads(out.read_text())["models"][0]["training"]
    assert len(training["mfu_interleaved"]["matmul_gflops"]) == 2  # the probe still ran after each timed step
    assert training["memory"]["delta_mib"] < 3 * bench.PROBE_N**2 * 4 / 2**20  # 48 MiB


def test_the_gpu_peak_memory_label_says_what_the_column_holds(monkeypatch):
    """The table's ``peak mem`` is ``delta_mib``: on a GPU, max_memory_allocated minus the memory
    allocated before the run (the model's weights). The note under the table, the JSON's
    ``method``, said "torch.cuda.max_memory_allocated (reset before the run)" alone, so 427 MiB in
    bench/results/gpu_h200/2026-11-27-opcut read as the peak where the peak was 514 (found reading
    that file's report beside its JSON). Checked with stand-ins for torch.cuda's counters."""
    import torch

    bench = _script("bench.py")
    allocated = {"now": 87 * 2**20, "peak": 514 * 2**20}
    for name, fake in {"synchronize": lambda device=None: None, "reset_peak_memory_stats": lambda device=None: None,
                       "memory_allocated": lambda device=None: allocated["now"],
                       "max_memory_allocated": lambda device=None: allocated["peak"],
                       "max_memory_reserved": lambda device=None: 1132 * 2**20}.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    memory = bench.PeakMemory(torch.device("cuda"))
    memory.start()
    mem = memory.stop()
    assert (mem["peak_mib"], mem["before_mib"], mem["delta_mib"]) == (514, 87, 427)
    assert "minus memory allocated before" in mem["method"]


def test_a_loaded_machine_during_the_rounds_or_decoding_is_flagged(tiny_bench):
    """The table's "OTHER PROCESSES TOOK CPU TIME" judged the per-model training runs alone, but
    issue 3's verdict comes from the rounds, timed later, and the beam/greedy ratio from the
    decoding: a machine loaded while those ran left them unflagged (found reading _busy against
    what gives the verdict). The rounds now measure their CPU share too, and every timed part is
    listed and judged. A real run records the rounds' share; the verdict is checked on its result
    with one part's share lowered at a time."""
    import copy

    bench = _script("bench.py")
    res = copy.deepcopy(tiny_bench[1])  # its shares are lowered below
    rounds = res["over_transformer"]["comet"]["rounds"]["models"]
    assert all(0 < m["cpu_share"] for m in rounds.values())
    assert set(bench._cpu_shares(res)) == {f"{name} {part}" for name in ("transformer", "comet")
                                           for part in ("training", "decoding", "rounds")}
    for r in res["models"]:  # an idle machine everywhere: no flag
        r["training"]["cpu_share"] = 1.0
        for m in r["decoding"]["methods"].values():
            m["cpu_share"] = 1.0
    for m in rounds.values():
        m["cpu_share"] = 1.0
    assert not bench._busy(res)
    rounds["comet"]["cpu_share"] = 0.5  # other processes took half our time during the rounds only
    assert bench._busy(res) and "comet rounds 50%" in bench.format_report(res)
    rounds["comet"]["cpu_share"] = 1.0
    res["models"][0]["decoding"]["methods"]["beam5"]["cpu_share"] = 0.5  # ... during the decoding only
    assert bench._busy(res) and "transformer decoding 50%" in bench.format_report(res)


def test_the_cpu_speed_ratio_is_measured_side_by_side_by_default():
    """The COMET/Transformer ratio came on the CPU from one model's run after the other's unless
    --rounds was given (its default was 8 with --gpu, else 0), so a drift of the machine's speed
    between the two runs went into the verdict (docs/benchmarks.md: 1.04 one after the other where the rounds
    gave a median of 1.23 on the 2-core machine). The rounds are now the default everywhere; --rounds
    0 still turns them off."""
    bench = _script("bench.py")
    assert bench.parse_args([]).rounds == 8 and bench.parse_args(["--steps", "3"]).rounds == 3
    assert bench.parse_args(["--rounds", "0"]).rounds == 0


def test_gpu_step_times_come_from_cuda_events_so_the_median_is_one(monkeypatch):
    """On CUDA a training step returns before its kernels finish, so bench.py had no per-step times
    there and its JSON's ``median_step_s`` held seconds / steps, the mean (0.0318 s for both
    columns of bench/results/gpu_h100/2026-11-23/bf16.json). Now a CUDA event is recorded before
    and after each step and read after the loop's synchronisation. Checked here with stand-in
    events that report one slow step among fast ones: the median is the fast steps' time."""
    import torch

    bench = _script("bench.py")
    clock = iter([0.0, 0.1, 0.1, 1.1, 1.1, 1.2])  # seconds on the GPU stream: steps of 0.1, 1.0 and 0.1 s

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self) -> None:
            self.at = next(clock)

        def elapsed_time(self, end: "Event") -> float:  # milliseconds, as torch.cuda.Event's
            return (end.at - self.at) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Event)
    timer = bench.StepTimer(torch.device("cuda"))
    for _ in range(3):
        timer.start()
        timer.stop()
    assert timer.seconds() == pytest.approx([0.1, 1.0, 0.1])
    assert statistics.median(timer.seconds()) == pytest.approx(0.1)  # the mean would be 0.4


def test_count_ops_compares_two_presets_operator_by_operator():
    proc = run("count_ops.py", "--presets", "comet", "transformer", "--batch", "4", "--src-len", "5", "--tgt-len", "6",
               "--vocab", "50", "--conv1d", "--precision", "bf16")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("comet: ") and "bf16, conv1d" in lines[0] and lines[1].startswith("transformer: ")
    assert lines[2].startswith("ratio comet / transformer: ")
    assert any(line.startswith("convolution ") for line in lines)  # COMET's convolutions, absent from the Transformer


def test_bench_transformer_pp_steps_both_models(data_dir, tmp_path):
    out = tmp_path / "pp.json"
    args = ["--steps", "2", "--warmup", "1", "--no-tags", "--threads", "1", "--max-pairs", "300",
            "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.transformer_pp.conv_heads=2",
            "--set", "model.d_ff=64", "--set", "model.transformer_pp.tasks=[]", "--batch-tokens", "256", "--out", str(out)]
    proc = run("bench_transformer_pp.py", *args)
    result = json.loads(out.read_text())
    # the command reruns the bench from any folder: it was "bench_transformer_pp.py --steps ...", the
    # script's bare name (bench/results/transformer_pp_cpu.json), each argument unquoted
    import shlex

    assert shlex.split(result["command"]) == [*_rerun_env(), sys.executable, str(REPO / "bench" / "bench_transformer_pp.py"), *args]
    assert f"command: {result['command']}" in proc.stdout
    assert set(result["results"]) == {"transformer_pp", "transformer"}
    assert all(r["timed_steps"] == 2 for r in result["results"].values()) and result["ratio_pp_over_transformer"] > 0


def _ids_key() -> dict:
    """The data config a bench_convs2s.py --ids cache must have been written for: the Transformer preset's."""
    from cometnmt.config import load_config, to_dict

    from cometnmt.data.pipeline import VOCAB_COUNT

    return {**to_dict(load_config(REPO / "configs" / "multi30k" / "transformer.yaml").data), "vocab_count": VOCAB_COUNT}


def test_bench_convs2s_ids_cache_of_another_data_config_is_rebuilt(monkeypatch, tmp_path, capsys):
    """bench_convs2s.py --ids read any cache file that existed: one written before the preset's data
    config changed (here data.min_freq) gave the models its old vocabulary sizes (20 words) and ids,
    and the run's parameter counts, matched sizes and speeds were for them, without a word. The cache
    now stores the data config it was built for; another one (or none) is rebuilt and rewritten.
    The corpus and codec are stubbed (a real rebuild tokenises Multi30k with spaCy)."""
    from types import SimpleNamespace

    bench = _script("bench_convs2s.py")
    cfg = bench.load_config(bench.PRESETS["transformer"])
    vocab = SimpleNamespace(src_vocab=[0] * 30, tgt_vocab=[0] * 40,
                            src_tok=SimpleNamespace(tokenize_many=lambda texts: [t.split() for t in texts]),
                            encode_src=lambda words: [4 + len(w) for w in words])
    monkeypatch.setattr(bench, "read_split", lambda data, split: SimpleNamespace(src=["ab c", "d"]))
    monkeypatch.setattr(bench, "build_codec", lambda data, corpus: (vocab, None, None))
    cache = tmp_path / "ids.json"
    stale = {**_ids_key(), "min_freq": cfg.data.min_freq + 1}
    cache.write_text(json.dumps({"data": stale, "ids": [[5, 6]], "src_vocab": 20, "tgt_vocab": 20}))
    assert bench.load_test_ids(cfg, str(cache)) == ([[6, 5], [5]], 30, 40)
    assert "data.min_freq differ" in capsys.readouterr().err
    assert json.loads(cache.read_text())["data"] == _ids_key()
    monkeypatch.setattr(bench, "build_codec", None)  # the rewritten cache is read as it is
    assert bench.load_test_ids(cfg, str(cache)) == ([[6, 5], [5]], 30, 40)
    # one written before the vocabularies were counted on the pairs kept at data.max_len: rebuilt too
    before = {k: v for k, v in _ids_key().items() if k != "vocab_count"}
    cache.write_text(json.dumps({"data": before, "ids": [[5, 6]], "src_vocab": 20, "tgt_vocab": 20}))
    monkeypatch.setattr(bench, "build_codec", lambda data, corpus: (vocab, None, None))
    assert bench.load_test_ids(cfg, str(cache)) == ([[6, 5], [5]], 30, 40)
    assert "(vocab_count differ)" in capsys.readouterr().err


def test_bench_transformer_pp_times_the_trainers_step(data_dir, tmp_path, monkeypatch):
    """bench_transformer_pp.py timed a step of its own: a plain Adam (lr 1e-4, not the fused one the
    trainer uses on the CPU and CUDA) after every micro-batch, no gradient clipping, no schedule, no
    label smoothing, where training (the thing whose speed the ratio claims) takes one optimizer
    step with clipping per train.accum_steps micro-batches (8 in the presets). It now times
    ``Trainer.train_step`` on groups of accum_steps micro-batches: here 2, each step clipped."""
    import torch

    from cometnmt.training import trainer as trainer_module

    bench = _script("bench_transformer_pp.py")
    steps, clipped = [], []
    real_step, real_clip = trainer_module.Trainer.train_step, torch.nn.utils.clip_grad_norm_

    def train_step(self, group):
        steps.append((self.cfg.model.arch, len(group)))
        return real_step(self, group)

    def clip_grad_norm_(*args, **kwargs):
        clipped.append(kwargs.get("max_norm", args[1] if len(args) > 1 else None))
        return real_clip(*args, **kwargs)

    monkeypatch.setattr(trainer_module.Trainer, "train_step", train_step)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_grad_norm_)
    out = tmp_path / "pp.json"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        bench.main(["--steps", "2", "--warmup", "1", "--no-tags", "--max-pairs", "300", "--set", "model.d_model=32",
                    "--set", "model.n_heads=4", "--set", "model.transformer_pp.conv_heads=2", "--set", "model.d_ff=64",
                    "--set", "model.enc_layers=1", "--set", "model.dec_layers=1", "--set", "train.accum_steps=2",
                    "--batch-tokens", "256", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    # per model: 1 warm-up step and 2 timed ones, each of 2 micro-batches and clipped at train.clip_norm
    assert sorted(steps) == sorted([("transformer_pp", 2)] * 3 + [("transformer", 2)] * 3)
    assert clipped == [1.0] * 6
    result = json.loads(out.read_text())
    assert result["accum_steps"] == 2 and all(r["timed_steps"] == 2 for r in result["results"].values())


def test_bench_convs2s_decodes_a_few_sentences(tmp_path):
    """bench_convs2s.py on its smallest setting: the tokenised test source from an --ids cache (no
    spaCy), the presets as they are, 3 sentences. Its warm-up decoded the first 8 sentences with 8
    indices whatever --sentences said, so under 8 it stopped with "collate: 3 sources, 8 indices"."""
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"data": _ids_key(), "ids": [[5, 6, 7], [8, 9], [10, 11, 12, 13]], "src_vocab": 20,
                               "tgt_vocab": 20}))
    out = tmp_path / "convs2s.json"
    args = ["--ids", str(ids), "--which", "preset", "--sentences", "3", "--repeats", "1", "--batch", "2", "--threads", "1",
            "--out", str(out)]
    proc = run("bench_convs2s.py", *args)
    result = json.loads(out.read_text())
    rows = result["rows"]
    # the command that reruns it, recorded and printed (the results files had none)
    import shlex

    assert shlex.split(result["meta"]["command"]) == [*_rerun_env(), sys.executable, str(REPO / "bench" / "bench_convs2s.py"), *args]
    assert f"command: {result['meta']['command']}" in proc.stdout
    assert [r["arch"] for r in rows] == ["transformer", "convs2s", "rnn"]
    assert all(r["tokens"] == 3 + 2 + 4 + 3 * 2 for r in rows)  # </s> suppressed: 1.0 * S + 2 tokens each


def test_bench_convs2s_models_take_turns_batch_by_batch(monkeypatch, tmp_path):
    """bench_convs2s.py timed each model's --repeats passes over the whole test set, then the next
    model's, so a drift of the machine's speed between the models went into "vs transformer". The
    models of a group now take turns batch by batch, which goes first rotating: after the warm-ups,
    no model decodes two batches in a row."""
    bench = _script("bench_convs2s.py")
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"data": _ids_key(), "ids": [[5, 6, 7], [8, 9], [10, 11, 12, 13], [5, 6]], "src_vocab": 20,
                               "tgt_vocab": 20}))
    calls, real = [], bench.greedy_search

    def greedy_search(model, *args):
        calls.append(type(model).__name__)
        return real(model, *args)

    monkeypatch.setattr(bench, "greedy_search", greedy_search)
    bench.main(["--ids", str(ids), "--which", "preset", "--repeats", "2", "--batch", "2", "--threads", "1",
                "--out", str(tmp_path / "out.json")])
    archs = sorted(set(calls))
    assert len(archs) == 3 and sorted(calls[:3]) == archs  # one warm-up each, then the timed batches
    timed = calls[3:]
    assert len(timed) == 2 * 2 * 3 and all(a != b for a, b in zip(timed, timed[1:]))


def test_profile_step_times_and_profiles_a_tiny_step(monkeypatch):
    """bench/profile_step.py on its smallest setting (it had no test): the mean step time line, then
    the profiler's table. One thread: two OpenMP threads on a shared 2-core machine took a minute."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the CPU trainer's loss (the default), the B,T,V logits, and bf16 (its products in bf16, as the trainer's)
    for loss, precision in (("fused", "fp32"), ("logits", "fp32"), ("fused", "bf16")):
        proc = run("profile_step.py", "--preset", "comet", "--batch", "2", "--src-len", "3", "--tgt-len", "4", "--vocab", "40",
                   "30", "--steps", "1", "--rows", "3", "--no-dropout", "--loss", loss, "--precision", precision)
        first = proc.stdout.splitlines()[0]
        assert first.startswith(f"comet, eager, no dropout, {loss} loss, {precision}: ")
        assert "s/step (batch 2 x 3 -> 4, 1 threads)" in first
        assert "Self CPU time total" in proc.stdout


def test_each_checkpoint_replaces_the_model_it_was_trained_as(tmp_path):
    """--checkpoint files are matched to --models entries by config name, else by the only entry
    of their architecture; one that matches none, or a second for one entry, stops the bench
    (before: filed by architecture and looked up by preset name, so a comet_bn_length checkpoint
    left comet_bn_length a random-init model without a word)."""

    import torch

    from cometnmt.training.checkpoint import FORMAT_VERSION

    bench = _script("bench.py")

    def ckpt(file: str, name: str, arch: str) -> str:
        torch.save({"format_version": FORMAT_VERSION, "config": {"name": name, "model": {"arch": arch}}, "codec": {},
                    "model": {}}, tmp_path / file)
        return str(tmp_path / file)

    bn, mine, other = ckpt("bn.pt", "comet_bn_length", "comet"), ckpt("mine.pt", "mine", "transformer"), ckpt("o.pt", "x", "comet")
    found = bench.assign_checkpoints([bn, mine], ["transformer", "comet_bn_length"])
    assert {k: v["config"]["name"] for k, v in found.items()} == {"comet_bn_length": "comet_bn_length", "transformer": "mine"}
    with pytest.raises(SystemExit, match="matches no single entry of --models comet comet_bn_length"):
        bench.assign_checkpoints([other], ["comet", "comet_bn_length"])  # two entries are COMETs
    with pytest.raises(SystemExit, match="a second checkpoint for --models entry 'comet_bn_length'"):
        bench.assign_checkpoints([bn, bn], ["comet_bn_length"])


def test_beam_search_ranks_as_the_config_says(monkeypatch):
    """bench.py's beam search ranks hypotheses by the model config's ``decode.length_norm``, as
    ``cometnmt translate`` does (``decoding.search``); it passed only ``length_penalty``, so a
    checkpoint trained with ``length_norm: length`` (configs/iwslt/convs2s_iwslt.yaml) was decoded
    with GNMT's penalty instead."""
    import argparse

    import torch

    from cometnmt.data.pipeline import Examples
    from cometnmt.data.vocab import PAD

    bench = _script("bench.py")
    cfg = bench.load_config(bench.PRESETS / "transformer.yaml", ["model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                                                                "model.enc_layers=1", "model.dec_layers=1",
                                                                "decode.length_norm=length"])
    torch.manual_seed(0)
    model = bench.build_model(cfg.model, 30, 30, PAD)
    data = bench.Data(Examples([], [], [], []), [[5, 6, 7], [8, 9]], 30, 30)
    seen = []
    real = bench.beam_search

    def beam_search(*args):
        seen.append(args[10] if len(args) > 10 else "gnmt (the default)")
        return real(*args)

    monkeypatch.setattr(bench, "beam_search", beam_search)
    args = argparse.Namespace(decode_sentences=None, beam=2, decode_precision="fp32")
    bench.bench_decoding(model, cfg, data, torch.device("cpu"), args, 1.0, 2)
    assert seen and set(seen) == {"length"}


def test_decoding_bound_counts_source_words_not_sos_eos():
    """With ``data.src_sos_eos`` (configs/multi30k/comet_src_sos_eos.yaml) the sources carry <s> </s>;
    the bench's output bound ``a * S + b`` counted them as words for a random-init model, so such a
    model decoded 2 tokens a sentence more than the others (1.0 * S + 2 became S + 4), unlike
    ``cometnmt translate`` and the README's like-with-like comparison."""
    import argparse

    import torch

    from cometnmt.data.pipeline import Examples
    from cometnmt.data.vocab import BOS, EOS, PAD

    bench = _script("bench.py")
    words = [[5, 6, 7], [8, 9]]
    lengths = {}
    for sos_eos, precision in ((False, "fp32"), (True, "fp32"), (True, "bf16")):
        args = argparse.Namespace(decode_sentences=None, beam=2, decode_precision=precision)
        cfg = bench.load_config(bench.PRESETS / "transformer.yaml", [
            "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.enc_layers=1", "model.dec_layers=1",
            f"data.src_sos_eos={str(sos_eos).lower()}"])
        torch.manual_seed(0)
        model = bench.build_model(cfg.model, 30, 30, PAD)
        with torch.no_grad():
            model.out_proj.bias[EOS] = -1e4  # as bench_model does for a random-init model
        src = [[BOS, *w, EOS] for w in words] if sos_eos else words
        result = bench.bench_decoding(model, cfg, bench.Data(Examples([], [], [], []), src, 30, 30), torch.device("cpu"),
                                      args, 1.0, 2)
        lengths[sos_eos, precision] = {name: m["mean_output_tokens"] for name, m in result["methods"].items()}
        assert result["max_len_b"] == 2 and result["precision"] == precision
    assert len(set(map(str, lengths.values()))) == 1 and lengths[False, "fp32"] == dict.fromkeys(lengths[False, "fp32"],
                                                                                               (3 + 2) / 2 + 2)


def test_decoding_times_no_methods_first_call(monkeypatch):
    """bench_decoding timed from the process's first search call on: greedy went first in the first
    batch, so its time alone held the one-off costs of a first call (lazy initialisation; on a GPU
    the first load of each kernel that training never ran), and the beam/greedy ratio came out too
    low by them. Each method now runs once, untimed, on a few sentences first. Checked with stand-in
    searches on a stand-in clock: the first call of the process costs 10 s, every later call 1 s."""
    import argparse
    from types import SimpleNamespace

    import torch

    from cometnmt.data.pipeline import Examples

    bench = _script("bench.py")
    clock = {"now": 0.0, "calls": 0}

    def search(src, *rest):
        clock["calls"] += 1
        clock["now"] += 10.0 if clock["calls"] == 1 else 1.0
        return [SimpleNamespace(tokens=[5]) for _ in range(src.size(0))]

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(bench, "greedy_search", lambda model, src, *rest: search(src))
    monkeypatch.setattr(bench, "greedy_search_full_prefix", lambda model, src, *rest: search(src))
    monkeypatch.setattr(bench, "beam_search", lambda model, src, *rest: [[h] for h in search(src)])
    cfg = bench.load_config(bench.PRESETS / "transformer.yaml", ["decode.batch_sentences=2"])
    src = [[5, 6, 7], [8, 9], [10], [11, 12], [13]]  # 3 batches of <= 2 sentences
    result = bench.bench_decoding(torch.nn.Linear(1, 1), cfg, bench.Data(Examples([], [], [], []), src, 30, 30),
                                  torch.device("cpu"), argparse.Namespace(decode_sentences=None, beam=5,
                                                                          decode_precision="fp32"), 1.0, 2)
    assert {name: m["seconds"] for name, m in result["methods"].items()} == dict.fromkeys(result["methods"], 3.0)
    assert result["beam5_over_greedy_time"] == 1.0


def test_flop_count_equals_the_transformer_written_out():
    """bench.py's model FLOPs (FlopCounterMode on a meta-device copy) are exactly the Transformer's
    matrix products counted by hand: per layer the projections, FFN, QK^T and PV, the decoder's
    cross-attention (K, V over the source), the output layer; backward twice the forward. Padded
    positions count (the model computes them). At paper size on a real batch (120 x 14 -> 17) the
    same formula gives the bench's 116,741,099,520 exactly. (FlopCounterMode around a real CPU step
    reports 6% less: it does not see inside the custom operator cometnmt::blocked_linear, the CPU
    output layer's forward; the meta copy takes F.linear.)"""
    import random

    from cometnmt.data.pipeline import Examples

    bench = _script("bench.py")
    cfg = bench.load_config(bench.PRESETS / "transformer.yaml", ["model.d_model=32", "model.n_heads=2", "model.d_ff=64"])
    rng = random.Random(0)
    src = [[rng.randrange(4, 50) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    tgt = [[rng.randrange(4, 40) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    V = 40
    data = bench.Data(Examples(src, tgt, [], []), [], 50, V)
    groups = [[[0, 1, 2], [3, 4, 5]], [[1, 3]]]  # two steps, the first of two micro-batches
    m = cfg.model
    d, f = m.d_model, m.d_ff
    expected = []
    for group in groups:
        macs = 0
        for idx in group:
            B, S, T = len(idx), max(len(src[i]) for i in idx), max(len(tgt[i]) for i in idx) + 1  # T: y + </s>
            macs += m.enc_layers * B * S * (4 * d * d + 2 * d * f + 2 * S * d)
            macs += m.dec_layers * (B * T * (6 * d * d + 2 * d * f + 2 * T * d + 2 * S * d) + B * S * 2 * d * d)
            macs += B * T * d * V
        expected.append(3 * 2 * macs)  # 2 FLOPs a multiply-add; forward + backward (input and weight gradients)
    assert bench.count_flops(cfg, data, groups) == expected


def test_flop_count_equals_comet_written_out():
    """COMET's count as the Transformer's above, its encoder feed-forward replaced by the convolution
    unit: each gated convolution a (K*C_in) x 2n_f product per source position (both gate halves),
    then the unit's W over concat(F1..F3, x), (D + 112) x D at paper size. At paper size on the real
    batch above the formula gives the bench's 91,318,210,560 exactly (checked 2026-11-29)."""
    import random

    from cometnmt.data.pipeline import Examples

    bench = _script("bench.py")
    cfg = bench.load_config(bench.PRESETS / "comet.yaml", ["model.d_model=32", "model.n_heads=2", "model.d_ff=64",
                                                           "model.comet.features=[8,4,2]"])
    rng = random.Random(1)
    src = [[rng.randrange(4, 50) for _ in range(rng.randrange(3, 9))] for _ in range(5)]
    tgt = [[rng.randrange(4, 40) for _ in range(rng.randrange(3, 9))] for _ in range(5)]
    V = 40
    groups = [[[0, 1, 2], [3, 4]]]
    m, c = cfg.model, cfg.model.comet
    d, f, widths = m.d_model, m.d_ff, [m.d_model, *c.features]
    unit = sum(c.kernel_size * widths[i] * 2 * widths[i + 1] for i in range(len(c.features))) + (d + sum(c.features)) * d
    macs = 0
    for idx in groups[0]:
        B, S, T = len(idx), max(len(src[i]) for i in idx), max(len(tgt[i]) for i in idx) + 1
        macs += m.enc_layers * B * S * (4 * d * d + unit + 2 * S * d)
        macs += m.dec_layers * (B * T * (6 * d * d + 2 * d * f + 2 * T * d + 2 * S * d) + B * S * 2 * d * d)
        macs += B * T * d * V
    assert bench.count_flops(cfg, bench.Data(Examples(src, tgt, [], []), [], 50, V), groups) == [6 * macs]


@pytest.mark.parametrize("failing", [0, 1])
def test_stress_resume_exits_1_when_a_trial_fails(monkeypatch, tmp_path, failing):
    """bench/stress_resume.py printed "N trials, K failing" and exited 0 whatever K was, so a script
    or CI job running it passed with failing trials. Trials and references stubbed (a real trial
    trains for about a minute): exit 1 when one of two trials failed, else 0."""
    stress = _script("stress_resume.py")
    monkeypatch.setattr(stress, "run_reference", lambda name, out: {"steps": 1, "epoch_end_steps": [1], "wall": 0.0})
    monkeypatch.setattr(stress, "trial", lambda i, seed, out, refs, configs: {
        "trial": i, "config": "tf", "attempts": [], "problems": ["differs"] if i < failing else []})
    monkeypatch.setattr(sys, "argv", ["stress_resume.py", "--trials", "2", "--jobs", "1", "--configs", "tf",
                                      "--out", str(tmp_path)])
    assert stress.main() == (1 if failing else 0)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("trigger", ["step", "valid"])
def test_stress_resume_triggers_on_the_attempts_own_records(tmp_path, trigger):
    """A resumed attempt's folder holds the records of the attempts before it: a "step" trigger
    (a step at or past N logged) or a "valid" one (an epoch's last step the newest record) fired at
    once on those, so the signal reached the resume at start-up, not mid-epoch or while
    validating (one such SIGINT 48 ms in landed in Python's own imports: exit 1, counted as a
    failing trial). It now waits for a record of its own attempt."""
    import signal
    import time

    stress = _script("stress_resume.py")
    folder = tmp_path / "run"
    folder.mkdir()
    old = [{"event": "train", "step": s, "epoch": 1} for s in range(1, 6)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))

    class Proc:
        sent: list = []

        def poll(self):
            return None

        def send_signal(self, signum):
            self.sent.append(signum)

    plan = {"trigger": trigger, "step": 3, "delay": 0, "sig1": signal.SIGINT}
    watcher = stress.Watcher(Proc(), folder, plan, {"epoch_end_steps": [5, 10]})
    watcher.start()
    time.sleep(0.3)
    assert watcher.sent == []  # before: sent at once
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"event": "train", "step": 6 if trigger == "step" else 10, "epoch": 2}) + "\n")
    watcher.join(timeout=10)
    assert [s for s, _ in watcher.sent] == ["INT"]


def test_kernel_count_profiles_each_model_on_the_cpu_and_says_no_kernels_were_counted(data_dir, tmp_path):
    """bench/kernel_count.py on the CPU at tiny size: the GPU session's tool for CUDA kernels a
    training step must run here too, counting operators, and say that it counted no kernels."""
    out = tmp_path / "kernels.json"
    proc = run("kernel_count.py", "--models", "transformer", "comet", "--steps", "2", "--warmup", "1", "--threads", "1",
               "--rows", "4", *TINY, "--out", str(out))
    result = json.loads(out.read_text())
    assert result["kernels_counted"] is False and "NOT counted" in result["note"] and "NOT counted" in proc.stdout
    assert result["precision"] == "bf16" and result["steps"] == 2 and result["reference"] == "transformer"
    assert list(result["models"]) == ["transformer", "comet"]
    for name, m in result["models"].items():
        assert m["batches"] == result["batches"] and len(m["batches"]) == 2  # the same timed batches for both
        t = m["per_step"]
        assert t["kernels"] is None and t["kernel_ms"] is None and t["gpu_busy"] is None
        assert t["operators"] > 0 and t["aten_ops"] > 0 and t["host_ms"] > 0 and t["step_ms"] > 0
        assert len(m["step_ms_steps"]) == len(m["host_ms_steps"]) == 2
        assert t["operators"] == pytest.approx(sum(r["calls"] for r in m["by_operator"].values()))
        assert all(r["kernels"] is None for r in m["by_operator"].values())
        assert "aten::mm" in m["by_operator"] and "aten::view" not in m["by_operator"]  # views apart
    comet, transformer = (result["models"][k]["per_step"] for k in ("comet", "transformer"))
    assert comet["operators"] > transformer["operators"] and comet["aten_ops"] > transformer["aten_ops"]
    diff = result["differences"]["comet"]
    assert diff["of"] == "comet - transformer"
    assert diff["per_step"]["operators"] == pytest.approx(comet["operators"] - transformer["operators"])
    assert diff["per_step"]["kernels"] is None
    lines = proc.stdout.splitlines()
    assert "comet - transformer, by operator (largest differences in calls, a step)" in lines
    assert any(line.startswith("comet - transformer ") and line.split()[-1].startswith("+") for line in lines)


def test_kernel_count_gives_each_kernel_to_the_outermost_operator_that_launched_it():
    """The CUDA side of kernel_count.py, on stand-in profiler events (no GPU here): a kernel counts
    for the outermost operator above the one that launched it (convolution_backward, not cuDNN's
    inner call), autograd's nodes and the profiler's ranges are no operators, a range drawn on the
    GPU's timeline (gpu_user_annotation) is no kernel, and GPU work the profiler tied to no operator
    is counted apart."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Kernel

    kc = _script("kernel_count.py")
    events = []

    def cpu(name, parent=None, kernels=(), us=10.0, annotation=False):
        e = SimpleNamespace(name=name, device_type=DeviceType.CPU, cpu_parent=parent, cpu_time_total=us,
                            kernels=[Kernel(k, 0, d) for k, d in kernels], is_user_annotation=annotation,
                            activity_type="user_annotation" if annotation else "cpu_op")
        events.append(e)
        return e

    def gpu(name, us, kind="kernel"):
        events.append(SimpleNamespace(name=name, device_type=DeviceType.CUDA, time_range=SimpleNamespace(start=0.0, end=us),
                                      kernels=[], cpu_parent=None, is_user_annotation=kind.lower() == "gpu_user_annotation",
                                      activity_type=kind))

    node = cpu("ConvolutionBackward0", cpu("autograd::engine::evaluate_function: ConvolutionBackward0"))
    conv = cpu("aten::convolution_backward", node, kernels=[("reduce_bias", 2.0)], us=50.0)
    cpu("aten::cudnn_convolution_backward_weight", conv, kernels=[("wgrad", 5.0), ("wgrad_splitk", 1.0)])
    cpu("aten::view", conv)
    accumulate = cpu("torch::autograd::AccumulateGrad")
    cpu("aten::add_", accumulate, kernels=[("add", 1.0)], us=4.0)
    step = cpu("Optimizer.step#FusedAdam.step", kernels=[("Optimizer.step#FusedAdam.step", 30.0)], annotation=True)
    cpu("aten::_fused_adam_", step, kernels=[("adam", 8.0), ("adam", 8.0)], us=20.0)
    cpu("cudaLaunchKernel", conv)
    cpu("aten::view")  # a top-level view: no operator call counted
    for name, us in (("reduce_bias", 2.0), ("wgrad", 5.0), ("wgrad_splitk", 1.0), ("add", 1.0), ("adam", 8.0), ("adam", 8.0),
                     ("Memset (Device)", 0.5)):  # the memset: launched under no operator the profiler saw
        gpu(name, us, "gpu_memset" if name.startswith("Memset") else "kernel")
    gpu("Optimizer.step#FusedAdam.step", 30.0, "gpu_user_annotation")
    gpu("ProfilerStep#1", 40.0, "gpu_user_Annotation")  # as one kineto version spells it

    table = kc.by_operator(events, steps=2, kernels_counted=True)
    rows, totals = table["by_operator"], table["totals"]
    assert set(rows) == {"aten::convolution_backward", "aten::add_", "aten::_fused_adam_", kc.OUTSIDE}
    assert rows["aten::convolution_backward"] == {"calls": 0.5, "kernels": 1.5, "kernel_ms": pytest.approx(0.004),
                                                  "cpu_ms": pytest.approx(0.025)}
    assert rows["aten::_fused_adam_"]["kernels"] == 1.0 and rows["aten::add_"]["calls"] == 0.5
    assert rows[kc.OUTSIDE]["kernels"] == 0.5 and rows[kc.OUTSIDE]["kernel_ms"] == pytest.approx(0.00025)
    assert totals["kernels"] == 3.5 and totals["memcpy_memset"] == 0.5 and totals["kernels_outside_operators"] == 0.5
    assert totals["kernel_ms"] == pytest.approx(25.5 / 2 / 1e3) and totals["operators"] == 1.5
    assert sum(r["kernels"] for r in rows.values()) == totals["kernels"]
    # the GPU report: kernels, kernel time and GPU busy per model and in the difference
    def model(name, table):
        per_step = dict(table["totals"], aten_ops=3.0, host_ms=0.5, step_ms=0.1)
        per_step["gpu_busy"] = per_step["kernel_ms"] / per_step["step_ms"]
        return {"preset": name, "per_step": per_step, "by_operator": table["by_operator"]}

    smaller = kc.by_operator([e for e in events if e.name not in ("aten::add_", "add")], steps=2, kernels_counted=True)
    models = {"transformer": model("transformer", smaller), "comet": model("comet", table)}
    diff = kc.difference(models["comet"], models["transformer"])
    assert diff["per_step"]["kernels"] == 0.5 and diff["by_operator"]["aten::add_"]["kernels"] == 0.5
    report = kc.format_report({"kernels_counted": True, "date": "d", "command": "c", "precision": "bf16", "steps": 2,
                               "warmup": 1, "machine": {"device": "cuda", "gpu": "H200", "cuda": "13.0", "torch": "2.11"},
                               "models": models, "differences": {"comet": diff}}, rows=3)
    assert "NOT counted" not in report and "comet: top operators by kernels a step" in report
    assert "comet - transformer, by operator (largest differences in kernel time)" in report
    last = report.splitlines()[-1].split()
    assert last[:5] == ["comet", "-", "transformer", "+0.5", "+0.00"]  # kernels, kernel ms (+1 us) a step
    for flagged in (True, False):  # a torch whose events have no activity_type: the annotation flag decides
        assert kc.is_gpu_work(SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=flagged)) is not flagged
    cpu_only = kc.by_operator([e for e in events if e.device_type == DeviceType.CPU], steps=2, kernels_counted=False)
    assert cpu_only["totals"]["kernels"] is None and cpu_only["by_operator"]["aten::add_"]["kernels"] is None
def test_bench_serve_times_batching_on_and_off(data_dir, tmp_path, monkeypatch):
    """bench/bench_serve.py on its smallest setting: it trains the tiny model, serves it with dynamic
    batching off, with a fixed wait and on, and writes the rates, one client's latencies and the
    on/off ratio (not asserted: speed lives in bench/)."""
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", str(data_dir))
    out = tmp_path / "serve.json"
    proc = run("bench_serve.py", "--clients", "2", "--requests", "1", "--rounds", "2", "--threads", "1",
               "--latency-requests", "2", "--out", str(out))
    result = json.loads(out.read_text())
    assert len(result["off"]) == len(result["wait"]) == len(result["on"]) == 2 and result["ratio"] > 0
    assert {name: len(rounds) for name, rounds in result["latency_ms"].items()} == {"off": 2, "wait": 2, "on": 2}
    assert result["orders"] == [["off", "wait", "on"], ["wait", "on", "off"]]  # rotating, not one fixed order
    assert "on/off:" in proc.stdout


def test_bench_beam_stop_compares_the_early_stop_with_fairseqs_rule(data_dir, tmp_path, monkeypatch):
    """bench/bench_beam_stop.py on a few sentences: both stopping rules translate alike, the early
    one steps no more decoder rows (timings not asserted)."""
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", str(data_dir))
    out = tmp_path / "stop.json"
    proc = run("bench_beam_stop.py", "--sentences", "12", "--rounds", "1", "--threads", "1",
               "--length-penalty", "0", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert [r["length_penalty"] for r in result["results"]] == [0.0, 1.0] and "--sentences 12" in result["command"]
    for r in result["results"]:
        assert r["same_translations"] == 1.0 and 0 < r["rows_stepped"]["on"] <= r["rows_stepped"]["off"]
    assert "on/off" in proc.stdout


def test_bench_precision_runs_each_search_in_each_precision(data_dir, tmp_path, monkeypatch):
    """bench/bench_precision.py on a few sentences: greedy and beam search in fp32 and bf16, with
    fp32 the reference of the speed-ups and of the share of equal translations (timings not asserted)."""
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", str(data_dir))
    out = tmp_path / "precision.json"
    proc = run("bench_precision.py", "--sentences", "6", "--rounds", "1", "--threads", "1", "--beam", "2",
               "--precisions", "bf16", "--out", str(out))
    result = json.loads(out.read_text())
    assert [r["precision"] for r in result["results"]] == ["fp32", "bf16"] and result["sentences"] == 6
    fp32, bf16 = result["results"]
    assert fp32["greedy_same_as_fp32"] == fp32["beam2_same_as_fp32"] == 1.0 and fp32["greedy_speedup_over_fp32"] == 1.0
    assert 0 <= bf16["beam2_same_as_fp32"] <= 1 and bf16["beam2_over_greedy"] > 0 and "beam2/greedy" in proc.stdout


def test_bench_startup_times_a_spacy_checkpoints_load_and_first_translation(data_dir, tmp_path, monkeypatch):
    """bench/startup.py with one run: it trains the tiny spaCy-tokenized model, times its load and
    first translation in a fresh interpreter, and says what they imported: from_checkpoint spaCy
    alone (the source's pipeline), the translation sacremoses too (Moses detokenizes the output)."""
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", str(data_dir))
    out = tmp_path / "startup.json"
    proc = run("startup.py", "--runs", "1", "--out", str(out))
    [tree] = json.loads(out.read_text())["trees"]
    assert tree["path"] == str(REPO) and len(tree["runs"]) == 1
    run_ = tree["runs"][0]
    assert all(run_[key] > 0 for key in ("import_s", "from_checkpoint_s", "first_translation_s", "total_s", "total_cpu_s"))
    assert run_["modules_after_load"] == ["spacy"] and run_["modules_after_translation"] == ["sacremoses", "spacy"]
    assert tree["summary"]["total_s"]["median"] == run_["total_s"] and "from_checkpoint_s" in proc.stdout


def test_bench_startup_times_the_whole_parser_against_the_typed_commands(tmp_path, monkeypatch):
    """bench/startup.py --parser with one run: build_parser() against build_parser(COMMAND), each in a
    fresh interpreter, and `cometnmt COMMAND --help` through main with each parser; the two helps
    must be the same, or the script stops (a faster parser that printed another help timed nothing)."""
    out = tmp_path / "parser.json"
    proc = run("startup.py", "--parser", "evaluate", "--runs", "1", "--out", str(out))
    result = json.loads(out.read_text())
    [timed] = result["runs"]
    startup = _script("startup.py")
    assert result["command"] == "evaluate" and list(timed) == list(startup.PARSER_TIMES)
    assert all(value > 0 for value in timed.values()) and result["summary"]["help_typed_ms"]["median"] == timed["help_typed_ms"]
    assert result["whole_over_typed"]["build_cpu"] == timed["build_whole_cpu_ms"] / timed["build_typed_cpu_ms"]
    assert "whole/typed" in proc.stdout
    monkeypatch.setitem(startup.HELP, "typed", "print('usage: cometnmt evaluate')")
    with pytest.raises(SystemExit, match="printed another help"):
        startup.time_parser_once("evaluate")


def test_the_recorded_command_sets_the_data_folder_it_read(monkeypatch):
    """A result's command reruns the benchmark on the same data: COMETNMT_MULTI30K_DIR (and the
    thread count) the run had are part of it, quoted for the shell; unset ones are left out."""
    import shlex

    bench = _script("bench.py")
    monkeypatch.setenv("COMETNMT_MULTI30K_DIR", "/data/multi 30k")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    words = shlex.split(bench.command_line("bench/bench.py", ["--steps", "3"]))
    assert words[0] == "COMETNMT_MULTI30K_DIR=/data/multi 30k"
    assert words[1:2] == [sys.executable] and words[-2:] == ["--steps", "3"]
    monkeypatch.delenv("COMETNMT_MULTI30K_DIR")
    assert shlex.split(bench.command_line("bench/bench.py", []))[0] == sys.executable
