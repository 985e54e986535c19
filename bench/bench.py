"""Training and decoding speed of the paper-size Transformer and COMET on Multi30k, with the
matrix-multiply throughput of the same machine measured in the same run, so that the numbers can be
read as a fraction of what the hardware does (model FLOPs utilisation, MFU).

    python bench/bench.py [--models transformer comet] [--gpu] [--steps N] [--out bench/results/cpu.json]
    python bench/bench.py --models transformer comet comet@unfused ...   # COMET's GPU path before and after the operator cuts

What it measures (bench/README.md says how to read it):

* matmul: fp32 square matrix products (1024, 2048 on the CPU; 2048-8192 and also bf16 on a GPU),
  best and median of several repetitions. Measured again right before each model's training
  benchmark, because a shared machine's speed drifts.
* training, per model, at the preset's size (configs/multi30k/<model>.yaml): target tokens per
  second of ``Trainer.train_step`` on real Multi30k batches (``make_batches`` with the preset's
  batch_tokens, the shuffled order of training epoch 1), warm-up steps excluded (on a GPU the timed
  batches are also run once untimed first, ``--warm-shapes``: the first call of each new batch shape
  is slow there, and without this the model measured first paid for it); model FLOPs per
  target token counted by ``torch.utils.flop_counter.FlopCounterMode`` over the forward and
  backward pass of every timed batch (on meta tensors: shapes only, no extra compute); MFU =
  achieved FLOP/s / measured matmul FLOP/s; on the CPU also MFU/step, the median over timed steps
  of each step's FLOP/s over a 2048^3 matmul timed right after that step (the machine's speed
  drifts by 20% within a minute on a shared VM; this ratio does not); peak memory (CPU: peak
  resident set size, GPU: ``torch.cuda.max_memory_allocated``).
* decoding, per model: all 1,000 sentences of test_2016_flickr with greedy search (incremental),
  greedy search re-decoding the whole prefix at every step (``greedy_search_full_prefix``, the
  no-cache reference) and beam search (beam 5), batched as ``translate`` batches them, the three
  methods taking turns batch by batch so that a machine's drift slows them alike. A
  randomly initialised model would stop at random lengths, so </s> is suppressed and every
  method generates exactly ``max_len_a * source_words + max_len_b`` tokens (default 1.0 * S + 2,
  about a real translation's length); with ``--checkpoint`` the trained model decodes with its
  own length bound and stops at </s>. The mean output length is reported either way.
* the COMET/Transformer training tokens-per-second ratio (issue 3's target: at least 0.80), from
  the two models taking turns in rounds (``--rounds``, on by default): after the per-model runs,
  each model is built again and the two alternate over the same batches, so a drift of the
  machine's speed between the two per-model runs does not enter the ratio. Every COMET entry of
  --models (``comet`` and its variants below) takes its turn in the same rounds, each with its own
  ratio to the Transformer.
* variants, ``--models NAME@VARIANT[,VARIANT]``: the preset NAME built, then VARIANTS changed on the
  built model (``VARIANTS`` below), e.g. ``comet@unfused``, COMET's GPU training path without the
  operator cuts of 2026-11-27, timed beside ``comet`` in one run.

Benchmarks are never timed assertions in tests (DESIGN.md); this script only reports.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import logging
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from cometnmt.config import COMPILE_MODES, PRECISIONS, Config, config_from_dict, load_config, to_dict
from cometnmt.data.batching import collate
from cometnmt.data.pipeline import VOCAB_COUNT, Examples, TextCodec, build_codec, encode_pairs, read_split
from cometnmt.data.vocab import BOS, EOS, PAD
from cometnmt.decoding import (PRECISION_DTYPES, beam_search, greedy_search, greedy_search_full_prefix,
                               precision_context)
from cometnmt.inference import set_cuda_backends
from cometnmt.models import build_model
from cometnmt.training.checkpoint import load_checkpoint
from cometnmt.training.trainer import Trainer, token_loss

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "configs" / "multi30k"
RATIO_TARGET = 0.80  # issue 3: COMET trains at >= 80% of the Transformer's tokens/s
MFU_TARGET = 0.60  # issue 6: CPU training at >= 60% of the measured matmul throughput
BUSY_SHARE = 0.8  # below this share of CPU time for our threads, other processes disturbed the timing
log = logging.getLogger("bench")

# PyTorch's flop counter knows the CUDA attention kernels but not the CPU one; same formulas.
CPU_SDPA_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda g, q, k, v, *a, out_shape=None, **kw: sdpa_backward_flop_count(g, q, k, v)
    ),
}


# -- command line ------------------------------------------------------------------------------

# --models NAME@VARIANT: changes to the built model (not config keys) that time one code path beside another
VARIANTS = {
    "unfused": "COMET's GPU training path before the operator cuts of 2026-11-27: every GatedConv trains through "
               "autograd of F.conv1d and the gate (fused_gate=False, not _GatedConv1d) and every ConvUnit casts its "
               "input and parameters once per consumer under autocast (cast_once=False, not _CastForTwo and one cast of "
               "the unit's parameters)",
    "conv1d": "every GatedConv takes F.conv1d, CUDA's path, on any device (use_conv1d=True; the CPU takes im2col), "
              "so the CPU counts the GPU path's ops/step",
}


def split_entry(entry: str) -> tuple[str, list[str]]:
    """A --models entry ``NAME`` or ``NAME@VARIANT[,VARIANT]`` -> (preset NAME, [VARIANT, ...])."""
    preset, _, variants = entry.partition("@")
    return preset, variants.split(",") if variants else []


def check_entries(p: argparse.ArgumentParser, models: list[str]) -> None:
    """Refuse, as ``p`` refuses a bad value, an unknown variant, an empty one and a repeated entry."""
    for entry in models:
        preset, variants = split_entry(entry)
        bad = [v for v in variants if v not in VARIANTS]
        if not preset or "@" in entry and not variants or bad:
            p.error(f"--models {entry}: {'variant ' + repr(bad[0]) + ' is unknown; ' if bad else ''}an entry is NAME or "
                    f"NAME@VARIANT[,VARIANT] with VARIANT one of {', '.join(VARIANTS)}")
    if len(set(models)) < len(models):
        p.error(f"--models {' '.join(models)}: an entry given twice")


def apply_variants(model: torch.nn.Module, entry: str) -> None:
    """The variants of --models entry ``entry`` (``VARIANTS``), set on every gated convolution and
    convolution unit of the built model; a model with no gated convolution for them is refused."""
    from cometnmt.models.comet import ConvUnit, GatedConv

    variants = split_entry(entry)[1]
    if not variants:
        return
    convs = [m for m in model.modules() if isinstance(m, GatedConv)]
    if not convs:
        raise SystemExit(f"--models {entry}: the model has no gated convolution (COMET's) for {', '.join(variants)}")
    for m in convs:
        m.fused_gate = "unfused" not in variants
        if "conv1d" in variants:
            m.use_conv1d = True
    for m in model.modules():
        if isinstance(m, ConvUnit):
            m.cast_once = "unfused" not in variants


def check_step_counts(p: argparse.ArgumentParser, args: argparse.Namespace, steps_are: str | None = None) -> None:
    """Refuse, as ``p`` refuses a bad value (usage and message on stderr, exit 2), a ``--steps`` below 1
    and a ``--warmup`` below 0 (where the script has one). ``steps_are``: what the steps are, said in
    the message. --steps 0 ran the untimed work, then stopped on the time of no steps (bench.py: a
    ZeroDivisionError, seconds / steps; bench_transformer_pp.py: the median of no step times;
    profile_step.py: the time divided by 0 steps) and wrote no JSON; a negative --warmup took the last
    steps of the list for warm-up ones. The benchmark scripts import it from here, as count_ops.py
    imports OpCounter (bench/ is no package)."""
    if args.steps < 1:
        p.error(f"--steps {args.steps} must be at least 1" + (f" ({steps_are})" if steps_are else ""))
    if getattr(args, "warmup", 0) < 0:
        p.error(f"--warmup {args.warmup} must be at least 0")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["transformer", "comet"],
                   help="presets in configs/multi30k (default: transformer comet); NAME@VARIANT[,VARIANT] builds NAME, "
                        "then changes the built model: unfused (COMET's GPU training path before the operator cuts: "
                        "autograd through F.conv1d and the gate, a cast per consumer) or conv1d (F.conv1d on the CPU "
                        "too, to count the GPU path's ops/step), e.g. comet@unfused comet@conv1d,unfused. Every COMET "
                        "entry takes its turn in the rounds with its own ratio to the Transformer")
    p.add_argument("--gpu", action="store_true", help="run on CUDA (default: the CPU)")
    p.add_argument("--steps", type=int, default=12, help="timed training steps per model (default 12)")
    p.add_argument("--warmup", type=int, default=2, help="untimed training steps first (default 2)")
    p.add_argument("--warm-shapes", action=argparse.BooleanOptionalAction, default=None,
                   help="before timing, run the timed batches once untimed (twice with CUDA graphs), so no model pays "
                        "the first call of a batch shape in its timed steps (default: on with --gpu, where that first "
                        "call costs far more than the step and made whichever model went first look 4-8x slower; off "
                        "on the CPU; with --compile use it there too, or compilation of new shapes is timed)")
    p.add_argument("--rounds", type=int, default=None,
                   help="after the per-model runs, time the models again taking turns: R rounds, each model running "
                        "its share of the timed steps in every round (the order rotating: ABC, BCA, CAB, then BAC, ACB, CBA; two "
                        "models AB, BA), and report the median of the "
                        "per-round ratios; a machine whose speed drifts between the models' runs (seen on the GPU "
                        "host: 0.48-1.04 for the same line) slows both alike within a round (default: 8, at most --steps, "
                        "on the CPU too: a ratio is measured side by side; 0 = off)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="training precision (default: the preset's)")
    p.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                   help="train.compile=true with this train.compile_mode (default: default; reduce-overhead = CUDA "
                        "graphs); compilation happens in the warm-up steps, so give it more --warmup")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's choice)")
    p.add_argument("--checkpoint", nargs="+", default=[], metavar="CKPT",
                   help="trained checkpoints; each replaces the random-init model of its architecture")
    p.add_argument("--decode-sentences", type=int, help="decode only the first N test sentences (default: all 1,000)")
    p.add_argument("--no-decode", action="store_true", help="skip the decoding benchmark")
    p.add_argument("--beam", type=int, default=5, help="beam size of the beam-search run (default 5)")
    p.add_argument("--decode-precision", dest="decode_precision", choices=PRECISIONS, default="fp32",
                   help="the searches' arithmetic, as decode.precision (default fp32; bf16 pays on CPUs with AMX); "
                        "bench_precision.py compares them side by side")
    p.add_argument("--max-len-a", type=float, help="output length bound a*S+b (default 1.0 for random init, else the checkpoint's)")
    p.add_argument("--max-len-b", type=int, help="output length bound a*S+b (default 2 for random init, else the checkpoint's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every model (repeatable)")
    p.add_argument("--data-cache", type=Path, help="JSON(.gz) of the encoded corpus: read if present, else written (skips spaCy next time)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="JSON results (default bench/results/cpu.json or gpu.json)")
    args = p.parse_args(argv)
    check_step_counts(p, args, "the timed training steps per model")
    check_entries(p, args.models)
    # checked here, before anything trains: the rounds run after the per-model runs, and a refusal there
    # lost their results (``--gpu --steps 4`` trained both models, then stopped with "--rounds 8 exceeds
    # --steps 4", a flag nobody had given, and wrote no JSON)
    if args.rounds is None:
        args.rounds = min(8, args.steps)
    elif args.rounds < 0 or args.rounds > args.steps:
        p.error(f"--rounds {args.rounds} must be between 0 and --steps {args.steps} (a round runs at least one "
                "timed step of each model)")
    return args


# -- machine -----------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info(device: torch.device) -> dict:
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _mem_total_gib(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY") if k in os.environ},
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                    tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    return info


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- matmul throughput ---------------------------------------------------------------------------


def matmul_throughput(device: torch.device, dtype: torch.dtype, sizes: list[int], reps: int) -> dict:
    """GFLOP/s of n x n x n products: best and median of ``reps`` timings per size."""
    out = {"dtype": str(dtype).replace("torch.", ""), "sizes": {}}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        inner = 1 if device.type == "cpu" else max(1, int(2e12 // (2 * n**3)))  # ~10 ms per GPU timing
        for _ in range(2):
            a @ b
        times = []
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                a @ b
            sync(device)
            times.append((time.perf_counter() - t0) / inner)
        flops = 2 * n**3
        out["sizes"][str(n)] = {"best_gflops": flops / min(times) / 1e9, "median_gflops": flops / statistics.median(times) / 1e9}
        del a, b
    out["best_gflops"] = max(s["best_gflops"] for s in out["sizes"].values())
    out["median_gflops"] = max(s["median_gflops"] for s in out["sizes"].values())
    return out


PROBE_N, PROBE_REPS = 2048, 2


class MatmulProbe:
    """GFLOP/s of the best of PROBE_REPS PROBE_N^3 products on the CPU (about 0.2 s a call), in
    ``dtype`` (the training precision's: on a CPU with AMX bf16's run at several times fp32's),
    into matrices made (and written once) at construction. Make it before the run's peak memory is
    reset: the probe runs between timed steps, inside that window, and it allocated two random
    matrices and their product at every call (kept resident by the trainer's keep_freed_memory),
    which the CPU's ``peak mem`` counted as the model's: 94 against 16 MiB for a tiny model, 616
    against 589 MiB for the paper-size Transformer."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype
        self.a, self.b = torch.randn(PROBE_N, PROBE_N, dtype=dtype), torch.randn(PROBE_N, PROBE_N, dtype=dtype)
        self.out = torch.mm(self.a, self.b)  # its pages touched now, not in the first probe

    def __call__(self) -> float:
        best = float("inf")
        for _ in range(PROBE_REPS):
            t0 = time.perf_counter()
            torch.mm(self.a, self.b, out=self.out)
            best = min(best, time.perf_counter() - t0)
        return 2 * PROBE_N**3 / best / 1e9


def measure_matmul(device: torch.device, precision: str) -> dict:
    """The throughput that MFU is measured against: the training precision's matmul."""
    if device.type == "cpu":  # and the training precision's, where it is not fp32: bf16 under autocast on AMX
        res = {"fp32": matmul_throughput(device, torch.float32, [1024, 2048], reps=5)}
        if precision != "fp32":
            res[precision] = matmul_throughput(device, PRECISION_DTYPES[precision], [1024, 2048], reps=5)
        return res
    res = {"fp32": matmul_throughput(device, torch.float32, [2048, 4096, 8192], reps=5),
           "bf16": matmul_throughput(device, torch.bfloat16, [2048, 4096, 8192], reps=5)}
    if precision == "fp16":
        res["fp16"] = matmul_throughput(device, torch.float16, [2048, 4096, 8192], reps=5)
    return res


# -- memory --------------------------------------------------------------------------------------


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _malloc_trim() -> None:
    """glibc keeps freed memory mapped; malloc_trim(0) returns it to the system (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """GPU: torch.cuda.max_memory_allocated minus the memory allocated before. CPU: peak resident set size (Linux VmHWM, reset through
    /proc/self/clear_refs right before the run) minus the resident size before it; where the peak
    cannot be reset, getrusage's lifetime peak (an upper bound), and the JSON says which."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
            return
        _malloc_trim()  # hand memory freed by an earlier model back first, or RSS would not grow
        self.before = (_status_kib("VmRSS") or 0) * 1024
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "cpu peak RSS (VmHWM reset before the run) minus RSS before"
        except OSError:
            self.method = "cpu process-lifetime peak RSS (getrusage; could not be reset) minus RSS before"

    def stop(self) -> dict:
        if self.device.type == "cuda":
            sync(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            # the method names what delta_mib (the table's column) is: the label said max_memory_allocated
            # alone, under a column that had the memory allocated before (the model's weights) taken off
            return {"method": "torch.cuda.max_memory_allocated (reset before the run) minus memory allocated before",
                    "peak_mib": peak / 2**20,
                    "before_mib": self.before / 2**20, "delta_mib": (peak - self.before) / 2**20,
                    "reserved_peak_mib": torch.cuda.max_memory_reserved(self.device) / 2**20}
        hwm = _status_kib("VmHWM")
        peak = hwm * 1024 if hwm is not None and "VmHWM" in self.method else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"method": self.method, "peak_mib": peak / 2**20, "before_mib": self.before / 2**20,
                "delta_mib": (peak - self.before) / 2**20}


# -- models and data -----------------------------------------------------------------------------


def model_config(name: str, args: argparse.Namespace, save_dir: str) -> Config:
    """The preset configs/multi30k/<name>.yaml, or the Transformer preset with model.arch=<name>
    (of a --models entry NAME@VARIANT, NAME's)."""
    name = split_entry(name)[0]
    preset = PRESETS / f"{name}.yaml"
    overrides = [] if preset.exists() else [f"model.arch={name}", f"name={name}"]
    if not preset.exists():
        preset = PRESETS / "transformer.yaml"
    overrides += list(args.set) + [f"train.save_dir={save_dir}", "train.progress=false"]
    if args.precision:
        overrides.append(f"train.precision={args.precision}")
    if args.compile:
        overrides += ["train.compile=true", f"train.compile_mode={args.compile}"]
    return load_config(preset, overrides)


def _data_key(cfg: Config) -> dict:
    d = cfg.data
    return {**{k: getattr(d, k) for k in ("corpus", "src_lang", "tgt_lang", "train_split", "test_split", "tokenizer",
                                          "lowercase", "min_freq", "max_vocab", "sp_vocab_size", "sp_model_type",
                                          "max_len", "src_sos_eos", "max_train_pairs")},
            "vocab_count": VOCAB_COUNT}


class Data:
    """Encoded training pairs and test sources for one data config (and codec)."""

    def __init__(self, train: Examples, test_src: list[list[int]], src_vocab: int, tgt_vocab: int, codec=None) -> None:
        self.train, self.test_src, self.src_vocab, self.tgt_vocab, self.codec = train, test_src, src_vocab, tgt_vocab, codec


def load_data(cfg: Config, codec: TextCodec | None, cache: Path | None) -> Data:
    """Tokenise and index Multi30k as ``cometnmt train`` does (the codec is fitted on the training
    split, or taken from a checkpoint); ``cache`` stores the result for random-init runs."""
    key = _data_key(cfg)
    if codec is None and cache is not None and cache.exists():
        opener = gzip.open if cache.suffix == ".gz" else open
        with opener(cache, "rt", encoding="utf-8") as f:
            stored = json.load(f)
        if stored["key"] == key:
            log.info("data from %s", cache)
            return Data(Examples(stored["train_src"], stored["train_tgt"], [], []), stored["test_src"],
                        stored["src_vocab"], stored["tgt_vocab"])
        log.warning("%s holds another data config; rebuilding", cache)
    t0 = time.perf_counter()
    corpus = read_split(cfg.data, "train")
    if codec is None:
        fitted, src_tokens, tgt_tokens = build_codec(cfg.data, corpus)
        train = encode_pairs(fitted, corpus, cfg.data.max_len, (src_tokens, tgt_tokens))
    else:
        fitted = codec
        train = encode_pairs(codec, corpus, cfg.data.max_len)
    test = read_split(cfg.data, "test")
    test_src = [fitted.encode_src(t) for t in fitted.src_tok.tokenize_many(test.src)]
    log.info("data: %d training pairs, %d test sentences (%.0f s)", len(train), len(test_src), time.perf_counter() - t0)
    data = Data(train, test_src, len(fitted.src_vocab), len(fitted.tgt_vocab), fitted)
    if codec is None and cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        opener = gzip.open if cache.suffix == ".gz" else open
        with opener(cache, "wt", encoding="utf-8") as f:
            json.dump({"key": key, "train_src": train.src_ids, "train_tgt": train.tgt_ids, "test_src": test_src,
                       "src_vocab": data.src_vocab, "tgt_vocab": data.tgt_vocab}, f)
    return data


# -- training ------------------------------------------------------------------------------------


def count_flops(cfg: Config, data: Data, groups: list[list[list[int]]]) -> list[int]:
    """Model FLOPs (forward + backward, every matmul/convolution/attention) of each step's batches,
    counted by FlopCounterMode on a meta-device copy of the model: exact shapes, no arithmetic."""
    with torch.device("meta"):
        model = build_model(cfg.model, data.src_vocab, data.tgt_vocab, PAD)
    model.train()
    counts = []
    for group in groups:
        counter = FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS)
        with counter:
            for idx in group:
                batch = collate([data.train.src_ids[i] for i in idx], [data.train.tgt_ids[i] for i in idx], idx).to("meta")
                logits = model(batch.src, batch.src_pad_mask, batch.tgt_in)  # B,T,V
                token_loss(logits, batch.tgt_out, cfg.train.label_smoothing).backward()
        counts.append(counter.get_total_flops())
    return counts


_VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "slice", "select",
             "narrow", "as_strided", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "unfold",
             "lift_fresh", "_reshape_alias"}


class OpCounter(TorchDispatchMode):
    """Counts the ATen operators a step dispatches, views (no kernel, no launch) apart. With the
    small batches of Multi30k a GPU step is bound by kernel launches, not FLOPs, so this count
    explains GPU step times that MFU does not. A custom operator counts once, as the dispatcher
    sees it: on an AVX2 CPU the output layer's forward is ``cometnmt::blocked_linear`` (13 ``addmm`` of
    512 columns for Multi30k's 6,191 words), counted as 1, like the single ``addmm`` of the
    ``F.linear`` that CUDA runs; its backward (2 ``mm``, 1 ``sum``) is CUDA's too. The counted step
    takes the logits and ``token_loss``, as CUDA does, not the CPU's fused loss (its row blocks would
    add about 100 operators). So the count
    stands for a GPU step's kernels, not for the CPU's, and every model with the Transformer's
    output layer (COMET, Transformer++) has it alike. Counted on the CPU, COMET's gated convolutions
    take their CPU path (im2col), more operators than CUDA's ``F.conv1d``; ``count_ops.py --conv1d``
    counts the CUDA path."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter = Counter()  # operators (views apart) by ATen name
        self.views = 0

    @property
    def ops(self) -> int:
        return sum(self.by_name.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _VIEW_OPS:
            self.views += 1
        else:
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))


def training_groups(cfg: Config, model: torch.nn.Module, data: Data, device: torch.device, args: argparse.Namespace,
                    n_timed: int) -> tuple[Trainer, list]:
    """A trainer of ``model`` and its first ``--warmup`` + ``n_timed`` steps (each a list of
    accum_steps micro-batches) of training epoch 1, in its order."""
    trainer = Trainer(cfg, model, data.codec, data.train, Examples([], [], [], []), device)
    batches = trainer.epoch_batches(0)
    G = cfg.train.accum_steps
    n_groups = args.warmup + n_timed
    if len(batches) < n_groups * G:
        raise SystemExit(f"only {len(batches) // G} steps in an epoch; ask for fewer --warmup/--steps")
    return trainer, [batches[i * G : (i + 1) * G] for i in range(n_groups)]


def warm_up(trainer: Trainer, groups: list, device: torch.device, args: argparse.Namespace) -> bool:
    """The untimed warm-up steps, then (``--warm-shapes``) the timed steps untimed: once, or twice
    where the trainer replays CUDA graphs (``--compile reduce-overhead``: a new shape's first call
    runs eagerly, its second records the graph, later ones replay it). Returns whether shapes were
    warmed."""
    trainer.net.train()
    warm_shapes = device.type == "cuda" if args.warm_shapes is None else args.warm_shapes
    passes = (2 if trainer.cuda_graphs else 1) if warm_shapes else 0
    for group in groups[: args.warmup] + groups[args.warmup :] * passes:
        trainer.train_step(group)
    sync(device)
    return warm_shapes


class StepTimer:
    """Seconds of each timed step. CPU: the wall clock around the step. CUDA: a step returns before
    its kernels finish, and a synchronisation after each would stall the queue that the timed loop
    keeps full, so a CUDA event is recorded before and after each step and read once the loop has
    synchronised: each step's time on the GPU stream (before, the GPU had no per-step times and
    ``median_step_s`` held the mean)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def start(self) -> None:
        self.marks.append(self._mark())

    def stop(self) -> None:
        self.marks.append(self._mark())

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self) -> list[float]:
        """Per step, after the loop (and, on CUDA, a synchronisation)."""
        pairs = zip(self.marks[::2], self.marks[1::2])
        return [a.elapsed_time(b) / 1e3 if self.cuda else b - a for a, b in pairs]


def bench_training(cfg: Config, model: torch.nn.Module, data: Data, device: torch.device, args: argparse.Namespace) -> dict:
    trainer, groups = training_groups(cfg, model, data, device, args, args.steps)
    G = cfg.train.accum_steps
    torch.manual_seed(args.seed)
    # before the peak is reset: its matrices are no model's
    probe = MatmulProbe(PRECISION_DTYPES[cfg.train.precision]) if device.type == "cpu" else None
    memory = PeakMemory(device)
    memory.start()
    warm_shapes = warm_up(trainer, groups, device, args)
    timer, probes, tokens = StepTimer(device), [], 0
    cpu_start = _cpu_seconds()
    probe_seconds = 0.0
    t_start = time.perf_counter()
    for group in groups[args.warmup :]:
        timer.start()
        _, n = trainer.train_step(group)
        timer.stop()
        tokens += n
        if probe is not None:
            t1 = time.perf_counter()
            probes.append(probe())  # the machine's speed right after this step
            probe_seconds += time.perf_counter() - t1
    sync(device)
    seconds = time.perf_counter() - t_start - probe_seconds
    # the trainer trains eagerly where torch.compile is unavailable or fails (a warning in the log):
    # the JSON said "compile": true and the table "compiled (default)" for such an eager run
    compiled = trainer._compiled
    step_seconds = timer.seconds()
    cpu_share = (_cpu_seconds() - cpu_start) / ((seconds + probe_seconds) * torch.get_num_threads())
    mem = memory.stop()
    counter = OpCounter()  # one more (untimed) step, counting its operators
    fused, trainer.fused_loss = trainer.fused_loss, False  # with logits and token_loss, as a GPU step
    with counter:
        trainer.train_step(groups[args.warmup])
    trainer.fused_loss = fused
    flops = count_flops(cfg, data, groups[args.warmup :])
    timed = [i for g in groups[args.warmup :] for idx in g for i in idx]
    padded = sum(len(idx) * (max(len(data.train.tgt_ids[i]) for i in idx) + 1) for g in groups[args.warmup :] for idx in g)
    out = {
        "batch_tokens": cfg.train.batch_tokens,
        "accum_steps": G,
        "precision": cfg.train.precision,
        "compile": cfg.train.compile,
        "compile_mode": cfg.train.compile_mode if cfg.train.compile else None,
        "compiled": compiled,  # still compiled after the timed steps: false where --compile fell back to eager
        "warmup_steps": args.warmup,
        "warm_shapes": warm_shapes,
        "timed_steps": args.steps,
        "sentences": len(timed),
        "target_tokens": tokens,
        "target_padding_fraction": 1 - tokens / padded,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "step_seconds": step_seconds,
        "median_step_s": statistics.median(step_seconds),
        "mean_step_s": seconds / args.steps,
        "cpu_share": cpu_share,
        "flops": sum(flops),
        "flops_per_target_token": sum(flops) / tokens,
        "achieved_gflops": sum(flops) / seconds / 1e9,
        "memory": mem,
        "aten_ops_per_step": counter.ops,
        "aten_view_ops_per_step": counter.views,
    }
    if probes:  # MFU per step against the matmul measured right after it; robust to a drifting machine
        per_step = [f / t / 1e9 / p for f, t, p in zip(flops, step_seconds, probes)]
        out["mfu_interleaved"] = {
            "median": statistics.median(per_step),
            "per_step": per_step,
            "matmul_gflops": probes,
            "method": f"each step's FLOP/s over the best of {PROBE_REPS} {str(probe.dtype).replace('torch.', '')} "
                      f"{PROBE_N}x{PROBE_N} matmuls timed right after it",
        }
    return out


# -- decoding ------------------------------------------------------------------------------------


def bench_decoding(model: torch.nn.Module, cfg: Config, data: Data, device: torch.device, args: argparse.Namespace,
                   a: float, b: float) -> dict:
    """Output bound ``a * words + b``: with ``data.src_sos_eos`` the source's <s> </s> are no words,
    as in ``cometnmt translate`` (``decoding.search``'s ``src_specials``), so every model decodes
    the same lengths."""
    ids = data.test_src[: args.decode_sentences] if args.decode_sentences else data.test_src
    specials = 2 if cfg.data.src_sos_eos else 0
    bound_b, b = b, b - specials * a  # b: the offset over source tokens, <s> </s> included
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # as Translator batches
    size = cfg.decode.batch_sentences
    batches = [order[s : s + size] for s in range(0, len(order), size)]
    methods = {
        "greedy": lambda src, mask: greedy_search(model, src, mask, BOS, EOS, a, b),
        "greedy_full_prefix": lambda src, mask: greedy_search_full_prefix(model, src, mask, BOS, EOS, a, b),
        f"beam{args.beam}": lambda src, mask: [h[0] for h in beam_search(
            model, src, mask, BOS, EOS, args.beam, cfg.decode.length_penalty, 1, a, b, cfg.decode.length_norm)],
    }
    model.eval()
    out = {"sentences": len(ids), "batch_sentences": size, "max_len_a": a, "max_len_b": bound_b, "src_specials": specials,
           "precision": args.decode_precision,
           "schedule": "methods interleaved batch by batch (a drifting machine slows all alike)", "methods": {}}
    hyps = {name: [] for name in methods}
    seconds = dict.fromkeys(methods, 0.0)
    cpu = dict.fromkeys(methods, 0.0)
    names = list(methods)
    # untimed, each method once on a few sentences (as bench_convs2s.py): the process's first search
    # call (lazy initialisation, on a GPU the first load of each kernel training never ran) fell in
    # greedy's timed first batch, as greedy went first there, and in no other method's
    warm = batches[0][:8]
    warm_batch = collate([ids[i] or [EOS] for i in warm], None, warm).to(device)
    with torch.inference_mode(), precision_context(device, args.decode_precision):
        for name in names:
            methods[name](warm_batch.src, warm_batch.src_pad_mask)
    for j, idx in enumerate(batches):
        batch = collate([ids[i] or [EOS] for i in idx], None, idx).to(device)
        for name in names[j % len(names):] + names[: j % len(names)]:  # rotate which method goes first
            sync(device)
            cpu0 = _cpu_seconds()
            t0 = time.perf_counter()
            with torch.inference_mode(), precision_context(device, args.decode_precision):
                hyps[name] += [h.tokens for h in methods[name](batch.src, batch.src_pad_mask)]
            sync(device)
            seconds[name] += time.perf_counter() - t0
            cpu[name] += _cpu_seconds() - cpu0
    for name in names:
        n_out = sum(len(t) for t in hyps[name])
        out["methods"][name] = {"seconds": seconds[name], "sentences_per_s": len(ids) / seconds[name],
                                "mean_output_tokens": n_out / len(ids), "output_tokens_per_s": n_out / seconds[name],
                                "cpu_share": cpu[name] / (seconds[name] * torch.get_num_threads())}
    greedy, full, beam = (out["methods"][k]["seconds"] for k in methods)
    out["incremental_speedup_over_full_prefix"] = full / greedy
    out[f"beam{args.beam}_over_greedy_time"] = beam / greedy
    out["greedy_equals_full_prefix"] = sum(x == y for x, y in zip(hyps["greedy"], hyps["greedy_full_prefix"])) / len(ids)
    return out


# -- one model -----------------------------------------------------------------------------------


def assign_checkpoints(paths: list[str], models: list[str]) -> dict[str, dict]:
    """The --models entry each --checkpoint replaces: the one its config is named after, else the
    only one of its architecture. A checkpoint that matches none, or two for one entry, is an error
    (before, checkpoints were filed by architecture and looked up by preset name, so
    ``--models comet_bn_length --checkpoint X`` decoded a random-init model without a word)."""
    out: dict[str, dict] = {}
    for path in paths:
        payload = load_checkpoint(path)
        name, arch = payload["config"].get("name"), payload["config"]["model"]["arch"]
        presets = {m: split_entry(m)[0] for m in models}
        same_arch = [m for m in models if presets[m] == arch or (PRESETS / f"{presets[m]}.yaml").exists()
                     and load_config(PRESETS / f"{presets[m]}.yaml").model.arch == arch]
        target = name if name in models else (same_arch[0] if len(same_arch) == 1 else None)
        if target is None:
            raise SystemExit(f"--checkpoint {path}: its config {name!r} ({arch}) matches no single entry of --models "
                             f"{' '.join(models)}; name its preset in --models")
        if target in out:
            raise SystemExit(f"--checkpoint {path}: a second checkpoint for --models entry {target!r}")
        out[target] = payload
    return out


def setup_model(name: str, args: argparse.Namespace, device: torch.device, checkpoints: dict, data_cache: dict, tmp: str):
    """(config, data, model on ``device``, checkpoint payload or None) of one preset."""
    payload = checkpoints.get(name)
    if payload is None:
        cfg = model_config(name, args, tmp)
        codec = None
    else:  # the checkpoint's own config, training in a scratch folder
        saved = to_dict(config_from_dict(payload["config"]))
        saved["train"].update(save_dir=tmp, progress=False, **({"precision": args.precision} if args.precision else {}))
        cfg = config_from_dict(saved)
        codec = TextCodec.from_state(payload["codec"])
    key = (json.dumps(_data_key(cfg), sort_keys=True), name if codec is not None else "")
    if key not in data_cache:
        data_cache[key] = load_data(cfg, codec, None if codec is not None else args.data_cache)
    data = data_cache[key]

    if device.type == "cuda":
        set_cuda_backends(cfg.train.cudnn_attention)  # as `cometnmt train` does
    torch.manual_seed(args.seed)
    model = build_model(cfg.model, data.src_vocab, data.tgt_vocab, PAD)
    if payload is not None:
        model.load_state_dict(payload["model"])
    apply_variants(model, name)
    model.to(device)
    return cfg, data, model, payload


def bench_model(name: str, args: argparse.Namespace, device: torch.device, checkpoints: dict, data_cache: dict, tmp: str) -> dict:
    cfg, data, model, payload = setup_model(name, args, device, checkpoints, data_cache, tmp)
    result = {"preset": name, "config": cfg.name, "arch": cfg.model.arch, "variants": split_entry(name)[1],
              "checkpoint": payload is not None, "parameters": sum(p.numel() for p in model.parameters())}
    log.info("%s: %.2fM parameters; matmul reference ...", name, result["parameters"] / 1e6)
    result["matmul"] = measure_matmul(device, cfg.train.precision)
    log.info("%s: training %d+%d steps ...", name, args.warmup, args.steps)
    trained_state = {k: v.detach().clone() for k, v in model.state_dict().items()} if payload is not None else None
    result["training"] = bench_training(cfg, model, data, device, args)
    ref_key = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}[cfg.train.precision]
    ref = result["matmul"].get(ref_key, result["matmul"]["fp32"])
    result["training"]["mfu_vs_best_matmul"] = result["training"]["achieved_gflops"] / ref["best_gflops"]
    result["training"]["mfu_vs_median_matmul"] = result["training"]["achieved_gflops"] / ref["median_gflops"]
    result["training"]["mfu_reference"] = f"{ref['dtype']} matmul measured just before"
    if not args.no_decode:
        if trained_state is not None:
            model.load_state_dict(trained_state)  # decode the checkpoint, not the benchmark's updates
            a = cfg.decode.max_len_a if args.max_len_a is None else args.max_len_a
            b = cfg.decode.max_len_b if args.max_len_b is None else args.max_len_b
        else:
            a = 1.0 if args.max_len_a is None else args.max_len_a
            b = 2 if args.max_len_b is None else args.max_len_b
            with torch.no_grad():  # random init: same work for every method (see the module docstring)
                model.out_proj.bias[EOS] = -1e4
        log.info("%s: decoding ...", name)
        result["decoding"] = bench_decoding(model, cfg, data, device, args, a, b)
        result["decoding"]["eos_suppressed"] = trained_state is None
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def bench_rounds(names: list[str], args: argparse.Namespace, device: torch.device, checkpoints: dict,
                 data_cache: dict, tmp: str) -> dict:
    """Training tokens/s of the models taking turns: each model is built afresh, runs its warm-up
    (and, as in ``bench_training``, the timed batches once untimed where shapes are warmed), then
    in every round each model runs the next ``steps // rounds`` of its timed batches, in the order
    ``round_order`` gives (ABC, BCA, CAB, BAC, ACB, CBA, ...; two models AB, BA, ...). Per round, tokens/s of each model
    and, in ``over_first``, the ratio of each later model's to the first's; their median is robust
    to a machine whose speed drifts on the scale of a model's whole run. ``flops_ratio`` is that
    median times the ratio of the models' FLOPs per target token on these batches: the achieved
    FLOP/s ratio (both ran on the machine as it was then, so no matmul reference is needed)."""
    rounds = args.rounds
    per_round = args.steps // rounds
    if per_round < 1:
        raise SystemExit(f"--rounds {rounds} exceeds --steps {args.steps}")
    runners = []
    per = {}
    orders = [round_order(names, r) for r in range(rounds)]
    for name in names:
        cfg, data, model, _ = setup_model(name, args, device, checkpoints, data_cache, str(Path(tmp) / f"{name}-rounds"))
        trainer, groups = training_groups(cfg, model, data, device, args, per_round * rounds)
        torch.manual_seed(args.seed)
        warm_up(trainer, groups, device, args)
        runners.append((name, trainer, groups[args.warmup :]))
        per[name] = {"seconds": [], "cpu_seconds": [], "tokens": [], "flops": sum(count_flops(cfg, data, groups[args.warmup :]))}
    by_name = {runner[0]: runner for runner in runners}
    for r, order in enumerate(orders):
        for name, trainer, groups in (by_name[name] for name in order):
            sync(device)
            cpu0, t0 = _cpu_seconds(), time.perf_counter()
            tokens = sum(trainer.train_step(group)[1] for group in groups[r * per_round : (r + 1) * per_round])
            sync(device)
            per[name]["seconds"].append(time.perf_counter() - t0)
            per[name]["cpu_seconds"].append(_cpu_seconds() - cpu0)
            per[name]["tokens"].append(tokens)
    for name, trainer, _ in runners:  # false where --compile fell back to eager (as bench_training's)
        per[name]["compiled"] = trainer._compiled
    for name in names:
        p = per[name]
        p["tokens_per_s"] = [n / t for n, t in zip(p["tokens"], p["seconds"])]
        p["pooled_tokens_per_s"] = sum(p["tokens"]) / sum(p["seconds"])
        # as bench_training's: the verdict comes from here, and other processes' load here went unseen
        p["cpu_share"] = sum(p.pop("cpu_seconds")) / (sum(p["seconds"]) * torch.get_num_threads())
        p["flops_per_target_token"] = p["flops"] / sum(p["tokens"])
    del runners
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"rounds": rounds, "steps_per_round": per_round, "order": orders,
            "order_rule": "rotations, then reversed rotations (round_order): over 2 x models rounds each model is "
                          "in each position, and before each other model, equally often",
            "models": per, "over_first": {name: _round_ratios(per, names[0], name) for name in names[1:]}}


def round_order(names: list[str], r: int) -> list[str]:
    """The order of the models in round ``r`` of ``bench_rounds``: the rotations of ``names``, then
    the rotations of their reverse (ABC, BCA, CAB, BAC, ACB, CBA, then again). Over any ``len(names)``
    consecutive rounds of one half each model runs once in each position, and over the ``2 x
    len(names)`` of a cycle each model also runs before each other model as often as after it; two
    models alternate (AB, BA, AB, ...), as before. Before, three or more models alternated ABC, CBA,
    so the middle one was always second: a position bias in the per-round ratios (a model run right
    after another met the GPU in the state that one left)."""
    n = len(names)
    k = r % n
    base = names if (r // n) % 2 == 0 else names[::-1]
    # the reverse half starts one rotation on (BAC, not CBA), so that two models keep alternating
    shift = k if (r // n) % 2 == 0 else (k + 1) % n
    return base[shift:] + base[:shift]


def _round_ratios(per: dict, first: str, other: str) -> dict:
    """``other``'s tokens/s over ``first``'s in the rounds: per round, their median, range and pooled."""
    ratios = [b / a for a, b in zip(per[first]["tokens_per_s"], per[other]["tokens_per_s"])]
    median = statistics.median(ratios)
    return {"ratio": f"{other}/{first}", "ratios": ratios, "median_ratio": median,
            "min_ratio": min(ratios), "max_ratio": max(ratios),
            "pooled_ratio": per[other]["pooled_tokens_per_s"] / per[first]["pooled_tokens_per_s"],
            # achieved FLOP/s ratio (median ratio x FLOPs per token ratio): the same batches on the same machine at the
            # same time, so the matmul reference cancels
            "flops_ratio": median * per[other]["flops_per_target_token"] / per[first]["flops_per_target_token"]}


# -- report --------------------------------------------------------------------------------------


def format_report(res: dict) -> str:
    m = res["machine"]
    lines = [f"cometnmt benchmark, {res['date']}", f"command: {res['command']}",
             f"machine: {m['cpu']}, {m['cpus_usable']} of {m['cpu_count']} CPUs usable, {m['memory_gib']} GiB; {m['platform']}",
             f"torch {m['torch']} ({m['cpu_capability']}, MKL {m['mkl']}, oneDNN {m['mkldnn']}); threads {m['torch_threads']}"
             f" (interop {m['torch_interop_threads']}){'; ' + str(m['env']) if m['env'] else ''}; device {m['device']}"
             + (f" = {m['gpu']} ({m['gpu_memory_gib']} GiB, CUDA {m['cuda']}, TF32 matmul {m['tf32_matmul']})" if "gpu" in m else ""),
             f"load average: start {_fmt_load(m['load_average_start'])}, end {_fmt_load(res['load_average_end'])}"
             + ("" if m["device"] != "cpu" else "; CPU share of our threads while timed: "
                + ", ".join(f"{what} {100 * share:.0f}%" for what, share in _cpu_shares(res).items()))
             + ("  << OTHER PROCESSES TOOK CPU TIME: timings unreliable" if _busy(res) else "")]
    mm = res["matmul_start"]
    lines.append("matmul throughput at start: " + "; ".join(
        f"{k} " + ", ".join(f"n={n}: best {s['best_gflops']:.0f} / median {s['median_gflops']:.0f}" for n, s in v["sizes"].items())
        + " GFLOP/s" for k, v in mm.items()))
    models = res["models"]
    w = max([12] + [len(r["preset"]) + 2 for r in models])  # the model column: comet@conv1d,unfused is wider
    lines += ["", "training (Trainer.train_step on real Multi30k batches; warm-up excluded)",
              f"{'model':<{w}}{'params':>8}{'steps':>7}{'tok/s':>9}{'s/step':>8}{'GFLOP/tok':>10}{'GFLOP/s':>9}"
              f"{'matmul':>9}{'MFU':>7}{'MFU/step':>10}{'peak mem':>11}{'ops/step':>10}"]
    for r in models:
        t = r["training"]
        ref = r["matmul"].get(t["precision"], r["matmul"]["fp32"])
        lines.append(f"{r['preset']:<{w}}{r['parameters'] / 1e6:>7.2f}M{t['timed_steps']:>7}{t['tokens_per_s']:>9.0f}"
                     f"{t['median_step_s']:>8.3f}{t['flops_per_target_token'] / 1e9:>10.3f}{t['achieved_gflops']:>9.1f}"
                     f"{ref['best_gflops']:>9.0f}{100 * t['mfu_vs_best_matmul']:>6.1f}%"
                     + (f"{100 * t['mfu_interleaved']['median']:>9.1f}%" if "mfu_interleaved" in t else f"{'-':>10}")
                     + f"{t['memory']['delta_mib']:>8.0f} MiB" + f"{t.get('aten_ops_per_step', '-'):>10}")
    if models:
        t = models[0]["training"]
        lines.append(f"  batch_tokens {t['batch_tokens']}, accum {t['accum_steps']}, {t['precision']}"
                     f"{_compiled_note(t)}; tok/s = target tokens (words + </s>, padding excluded) a second;"
                     f" matmul = best {t['mfu_reference']}; MFU = achieved / matmul;"
                     f" peak mem = {t['memory']['method']}; ops/step = ATen operators (views apart) one training"
                     " step dispatches, about the kernels it launches on a GPU (the CPU output layer's"
                     " blocked product, a custom operator, counts as 1)")
        if "mfu_interleaved" in t:
            lines.append(f"  MFU/step = median over steps of {t['mfu_interleaved']['method']} (issue 6 target >= {100 * MFU_TARGET:.0f}%)")
    verdicts = res.get("over_transformer") or (
        {"comet": res["comet_over_transformer"]} if "comet_over_transformer" in res else {})
    for i, (name, r) in enumerate(verdicts.items()):
        # which COMET entry a line is about, where --models has more than plain comet
        label = "COMET/Transformer" + ("" if list(verdicts) == ["comet"] else f" ({name}/transformer)")
        if "rounds" in r:
            q = r["rounds"]
            lines.append(f"{label} training tokens/s, the models taking turns in {q['rounds']} rounds of "
                         f"{q['steps_per_round']} steps: median {q['median_ratio']:.2f} (rounds {q['min_ratio']:.2f}-"
                         f"{q['max_ratio']:.2f}; pooled {q['pooled_ratio']:.2f}); Transformer "
                         f"{q['models']['transformer']['pooled_tokens_per_s']:.0f}, {name} "
                         f"{q['models'][name]['pooled_tokens_per_s']:.0f} tok/s")
            eager = [m_name for m_name, m in q["models"].items() if models and models[0]["training"]["compile"]
                     and not m.get("compiled", True)]
            if eager and i == 0:
                lines.append(f"  in the rounds, {' and '.join(eager)} FELL BACK TO EAGER from --compile (see the log)")
            lines.append(f"  one model after the other (the table above): {r['ratio_one_after_other']:.2f}")
        # issue 3's target is plain comet's; a variant's ratio is read against comet's, not against it
        verdict = (f"issue 3 target >= {RATIO_TARGET:.2f}: {'met' if r['meets_target'] else 'MISSED'}" if name == "comet"
                   else "a variant: issue 3's target is plain comet's")
        lines.append(f"{label} training tokens/s: {r['ratio']:.2f} ({verdict}"
                     f"{'; the rounds median' if 'rounds' in r else ''}); "
                     f"per FLOP-normalised ratio {r['mfu_ratio']:.2f}"
                     f"{' (the rounds median x FLOPs per token)' if 'rounds' in r else ' (MFU ratio)'}")
    dec = [r for r in models if "decoding" in r]
    if dec:
        d0 = dec[0]["decoding"]
        names = list(d0["methods"])
        lines += ["", f"decoding test_2016_flickr ({d0['sentences']} sentences, batches of {d0['batch_sentences']}, "
                      f"output <= {d0['max_len_a']:g}*S+{d0['max_len_b']:g} tokens{', </s> suppressed (random init)' if d0['eos_suppressed'] else ''}"
                      f"{'' if d0.get('precision', 'fp32') == 'fp32' else ', search in ' + d0['precision']})",
                  f"{'model':<{w}}" + "".join(f"{n + ' s':>22}" for n in names) + f"{'incr. speed-up':>16}{names[2] + '/greedy':>15}"
                  + f"{'mean len':>10}{'agree':>7}"]
        for r in dec:
            d = r["decoding"]
            lines.append(f"{r['preset']:<{w}}" + "".join(f"{d['methods'][n]['seconds']:>22.2f}" for n in names)
                         + f"{d['incremental_speedup_over_full_prefix']:>15.2f}x{d[names[2] + '_over_greedy_time']:>14.2f}x"
                         + f"{d['methods']['greedy']['mean_output_tokens']:>10.1f}{100 * d['greedy_equals_full_prefix']:>6.0f}%")
        lines.append("  incr. speed-up = full-prefix time / incremental greedy time; agree = greedy outputs equal to full-prefix outputs")
    return "\n".join(lines)


def _over_transformer(by: dict, name: str, turns: dict | None) -> dict:
    """--models entry ``name``'s training tokens/s over the Transformer's: the rounds median where the
    rounds ran (``turns``), else the per-model runs' ratio; with issue 3's target."""
    t, c = by["transformer"]["training"], by[name]["training"]
    one_after_other = c["tokens_per_s"] / t["tokens_per_s"]
    q = None
    if turns:  # the rounds' common fields and this entry's ratios
        q = {k: v for k, v in turns.items() if k != "over_first"} | turns["over_first"][name]
    ratio = q["median_ratio"] if q else one_after_other
    # the FLOP-normalised ratio of the measurement that gives the verdict: the rounds' where they ran
    # (the per-model runs' MFU ratio came from the one-after-the-other timing the rounds replace)
    mfu_ratio = q["flops_ratio"] if q else _mfu(c) / _mfu(t)
    out = {"model": name, "ratio": ratio, "ratio_one_after_other": one_after_other, "target": RATIO_TARGET,
           "meets_target": ratio >= RATIO_TARGET, "mfu_ratio": mfu_ratio}
    if q:
        out["rounds"] = q
    return out


def _mfu(training: dict) -> float:
    """The interleaved per-step MFU where measured (CPU), else achieved / matmul measured before."""
    return training["mfu_interleaved"]["median"] if "mfu_interleaved" in training else training["mfu_vs_best_matmul"]


def _fmt_load(load) -> str:
    return "n/a" if load is None else "/".join(f"{x:.2f}" for x in load)


def _cpu_shares(res: dict) -> dict[str, float]:
    """Each timed part's share of our threads' CPU time, by part: every model's training run, its
    turns in the rounds (which give issue 3's verdict) and its decoding (the lowest of its methods).
    Only the training runs were judged before, so a machine loaded while the rounds or the decoding
    ran left the ratios unflagged. Result files without a part's share (older ones) leave it out."""
    shares = {f"{r['preset']} training": r["training"]["cpu_share"] for r in res["models"]}
    for r in res["models"]:
        decoding = [m["cpu_share"] for m in r.get("decoding", {}).get("methods", {}).values() if "cpu_share" in m]
        if decoding:
            shares[f"{r['preset']} decoding"] = min(decoding)
    rounds = next((v["rounds"] for v in (res.get("over_transformer") or {}).values() if "rounds" in v), {})
    shares.update({f"{name} rounds": m["cpu_share"] for name, m in rounds.get("models", {}).items() if "cpu_share" in m})
    return shares


def _busy(res: dict) -> bool:
    """CPU runs: this process got less than 80% of its threads' time while a timed part ran (the
    other processes took the rest; OpenMP threads that wait spin, so an idle machine gives ~100%)."""
    return res["machine"]["device"] == "cpu" and any(s < BUSY_SHARE for s in _cpu_shares(res).values())


def _compiled_note(t: dict) -> str:
    """How the table's training ran: compiled, or fallen back to eager from --compile (the trainer's
    warning in the log says why); nothing for an eager run asked for."""
    if not t["compile"]:
        return ""
    if not t.get("compiled", True):  # results written before "compiled" was recorded did not say
        return f", --compile {t['compile_mode']} FELL BACK TO EAGER (torch.compile unavailable or failed; see the log)"
    return f", compiled ({t['compile_mode']})"


def start_run(args: argparse.Namespace) -> tuple[torch.device, dict]:
    """A bench script's start (this one's and kernel_count.py's): logging, --threads, the device of
    --gpu (CUDA's backends set as `cometnmt train` sets them), and the result's header: date, the
    command and the machine."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("--gpu: CUDA is not available")
    device = torch.device("cuda" if args.gpu else "cpu")
    if device.type == "cuda":  # as `cometnmt train` sets them (training/run.py)
        set_cuda_backends()
    return device, run_header(device, sys.argv[0])


def run_header(device: torch.device, script: str, argv: list[str] | None = None) -> dict:
    """A result's header: the date, the command that reruns ``script`` (:func:`command_line`) and the machine."""
    return {"date": _dt.datetime.now().isoformat(timespec="seconds"), "command": command_line(script, argv),
            "machine": machine_info(device)}


RERUN_ENV = ("COMETNMT_MULTI30K_DIR", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
"""Environment variables a result depends on: the data a run read, and its threads or GPUs."""


def command_line(script: str, argv: list[str] | None = None) -> str:
    """The command that reruns a bench script from any folder: the set variables of
    :data:`RERUN_ENV` (without COMETNMT_MULTI30K_DIR the rerun downloads the data, or reads
    another copy), the interpreter, ``script``'s absolute path and the arguments (``argv``, else
    the process's own), each quoted for the shell. The benchmark scripts import it from here
    (bench/ is no package)."""
    args = sys.argv[1:] if argv is None else argv
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in RERUN_ENV if name in os.environ]
    return " ".join([*env, *(shlex.quote(a) for a in [sys.executable, str(Path(script).resolve()), *args])])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, res = start_run(args)
    checkpoints = assign_checkpoints(args.checkpoint, args.models)
    log.info("matmul throughput ...")
    res["matmul_start"] = measure_matmul(device, args.precision or "fp32")
    data_cache: dict = {}
    res["models"] = []
    rounds = args.rounds  # parse_args: the default filled in, checked against --steps
    comets = [m for m in args.models if split_entry(m)[0] == "comet"]  # comet and its variants (comet@unfused, ...)
    both = "transformer" in args.models and bool(comets)
    turns = None
    with tempfile.TemporaryDirectory(prefix="cometnmt-bench-") as tmp:
        for name in args.models:
            res["models"].append(bench_model(name, args, device, checkpoints, data_cache, str(Path(tmp) / name)))
        if rounds and both:
            log.info("training, the models taking turns in %d rounds ...", rounds)
            turns = bench_rounds(["transformer", *comets], args, device, checkpoints, data_cache, tmp)
    by = {r["preset"]: r for r in res["models"]}
    if both:
        # each COMET entry against the Transformer; comet_over_transformer (issue 3's verdict) is plain comet's
        res["over_transformer"] = {name: _over_transformer(by, name, turns) for name in comets}
        res["comet_over_transformer"] = res["over_transformer"]["comet" if "comet" in comets else comets[0]]
    res["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return finish_run(res, format_report(res), args.out or REPO / "bench" / "results" / ("gpu.json" if args.gpu else "cpu.json"))


def finish_run(res: dict, report: str, out: Path) -> int:
    """A bench script's end (this one's and kernel_count.py's): the printed ``report`` kept in the
    result, the result written to ``out`` as JSON, the report and the file's name printed."""
    res["report"] = report
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(report)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
