"""CUDA kernels and CUDA time per training step, by operator, of bench.py's models (and the
difference of each from the Transformer). A GPU step at Multi30k's batch sizes is bound by kernel
launches and host overhead, and ``count_ops.py`` counts ATen operators on the CPU as a proxy; but
operators such as ``convolution_backward`` or ``native_batch_norm_backward`` launch several
kernels each, so the operator count undercounts COMET. This counts the kernels themselves.

It runs bench.py's training path (``setup_model``, ``training_groups``, ``warm_up``:
``Trainer.train_step``, forward + backward + clipping + the fused Adam step, in the preset's
precision or ``--precision``, bf16 autocast by default) on the first ``--warmup + --steps`` steps of
training epoch 1, the same batches for every model (refused otherwise), and for each model:

1. the warm-up steps, then the timed batches once untimed (every batch shape met once);
2. the timed batches unprofiled: the host time of each ``train_step`` call (the CPU's dispatch time:
   on CUDA the call returns once its kernels are queued, nothing synchronises) and the step's time
   (CUDA events around it on the GPU stream, as bench.py's StepTimer; the wall clock on the CPU);
3. the timed batches under ``torch.profiler`` (CPU, and CUDA activities on a GPU): every kernel
   (memcpy and memset included) attributed to the outermost operator it was launched under (the
   operator the model, autograd or the optimizer dispatched: ``aten::convolution_backward``, not
   cuDNN's inner call), with its GPU time; and the CPU time of those operators (inflated by the
   profiler: read it relatively);
4. the timed batches under bench.py's ``OpCounter``: ATen operators a step (views apart), the
   proxy that ``count_ops.py`` and bench.py's ops/step report.

On a machine without CUDA it still runs, counting operators and CPU times, and says plainly that
no kernels are counted (``kernels_counted: false``; the kernel columns are empty).

    python bench/kernel_count.py --gpu --models transformer comet comet@unfused   # bf16, 20 steps
    python bench/kernel_count.py --models transformer comet --steps 2 --set data.max_train_pairs=300   # CPU
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (  # noqa: E402
    _VIEW_OPS, REPO, OpCounter, StepTimer, check_entries, check_step_counts, finish_run, setup_model, split_entry, start_run, sync,
    training_groups, warm_up,
)

from cometnmt.data.batching import collate  # noqa: E402

log = logging.getLogger("kernel_count")
OUTSIDE = "(outside any operator)"  # kernels the profiler linked to no operator
_NOT_OPERATORS = {"autograd", "torch", "profiler"}  # autograd's nodes and engine, the profiler's own events
GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}  # kineto's activity types of work on the GPU
NO_KERNELS = "CPU run: CUDA kernels are NOT counted (no GPU); counts are ATen operators and times are CPU times"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["transformer", "comet"],
                   help="as bench.py's --models: presets in configs/multi30k, NAME@VARIANT[,VARIANT] (e.g. comet@unfused); "
                        "differences are taken against transformer (else the first entry)")
    p.add_argument("--gpu", action="store_true", help="run on CUDA and count its kernels (default: the CPU, operators only)")
    p.add_argument("--steps", type=int, default=20, help="steps profiled per model, each also timed unprofiled (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed training steps first (default 5)")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16",
                   help="training precision (default bf16, autocast, as the GPU sessions train)")
    p.add_argument("--rows", type=int, default=12, help="operators listed in each table (default 12)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's choice)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every model (repeatable)")
    p.add_argument("--data-cache", type=Path, help="as bench.py's: the encoded corpus, read if present, else written")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="JSON results (default bench/results/kernels_gpu.json or kernels_cpu.json)")
    args = p.parse_args(argv)
    check_step_counts(p, args, "the profiled training steps per model")
    check_entries(p, args.models)
    args.compile, args.warm_shapes = None, True  # what bench.py's setup_model and warm_up read: eager, shapes warmed
    return args


# -- the profile, by operator ---------------------------------------------------------------------


def is_operator(name: str) -> bool:
    """``aten::mm``, ``cometnmt::blocked_linear``: a dispatched operator, not an autograd node
    (``torch::autograd::AccumulateGrad``, ``autograd::engine::...``), a profiler annotation
    (``Optimizer.step#Adam.step``) or a CUDA runtime call (``cudaLaunchKernel``)."""
    namespace, sep, op = name.partition("::")
    return bool(sep) and namespace.isidentifier() and op.isidentifier() and namespace not in _NOT_OPERATORS


def outermost_operator(event):
    """The outermost operator among ``event`` and its CPU ancestors, or None."""
    found = None
    while event is not None:
        if is_operator(event.name):
            found = event
        event = event.cpu_parent
    return found


def is_gpu_work(event) -> bool:
    """A kernel, memcpy or memset on the GPU; not a ``record_function`` range drawn on the GPU's
    timeline (``gpu_user_annotation``, e.g. ``Optimizer.step#FusedAdam.step``), which spans the
    kernels inside it and would count them twice. Kineto has spelt that type
    ``gpu_user_Annotation``; torch versions whose events have no ``activity_type`` still flag those
    ranges ``is_user_annotation``. Any other GPU activity counts as work."""
    if event.device_type != DeviceType.CUDA:
        return False
    kind = str(getattr(event, "activity_type", None) or "").lower()
    if kind in GPU_WORK:
        return True
    return kind != "gpu_user_annotation" and not getattr(event, "is_user_annotation", False)


def by_operator(events, steps: int, kernels_counted: bool) -> dict:
    """Per step, from a profile's events (``prof.events()``: CPU events with their ``kernels``, the
    device activities linked to them, and the device activities themselves): each outermost
    operator's calls (views apart), CPU milliseconds (inclusive), kernels and their GPU
    milliseconds (kernels of inner operators count for the outermost one); the totals, and what
    the profiler linked to no operator."""
    rows: dict[str, dict] = {}

    def row(name: str) -> dict:
        return rows.setdefault(name, {"calls": 0, "kernels": 0, "kernel_ms": 0.0, "cpu_ms": 0.0})

    events = list(events)
    # GPU ranges that are no work: the profiler links them to CPU events as it links kernels
    ranges = {e.name for e in events if e.device_type == DeviceType.CUDA and not is_gpu_work(e)}
    device_events, device_us, linked, linked_us, copies = 0, 0.0, 0, 0.0, 0
    for e in events:
        if is_gpu_work(e):
            device_events += 1
            device_us += e.time_range.end - e.time_range.start
            copies += e.name.startswith(("Memcpy", "Memset"))
            continue
        if e.device_type != DeviceType.CPU:
            continue
        top = outermost_operator(e)
        if top is e and e.name.partition("::")[2] not in _VIEW_OPS:
            r = row(e.name)
            r["calls"] += 1
            r["cpu_ms"] += e.cpu_time_total / 1e3
        kernels = [] if getattr(e, "is_user_annotation", False) else [k for k in e.kernels if k.name not in ranges]
        if kernels:
            r = row(top.name if top is not None else OUTSIDE)
            r["kernels"] += len(kernels)
            r["kernel_ms"] += sum(k.duration for k in kernels) / 1e3
            linked += len(kernels)
            linked_us += sum(k.duration for k in kernels)
    if device_events > linked:  # activities whose launch the profiler tied to no CPU event
        r = row(OUTSIDE)
        r["kernels"] += device_events - linked
        r["kernel_ms"] += max(device_us - linked_us, 0.0) / 1e3
    per_step = {name: {k: v / steps for k, v in r.items()} for name, r in rows.items()}
    totals = {"operators": sum(r["calls"] for r in per_step.values()),
              "cpu_op_ms": sum(r["cpu_ms"] for r in per_step.values()),
              "kernels": device_events / steps if kernels_counted else None,
              "memcpy_memset": copies / steps if kernels_counted else None,
              "kernel_ms": device_us / 1e3 / steps if kernels_counted else None,
              "kernels_outside_operators": per_step.get(OUTSIDE, {}).get("kernels", 0.0) if kernels_counted else None,
              "kernels_linked_to_events": linked / steps if kernels_counted else None}
    if not kernels_counted:
        for r in per_step.values():
            r["kernels"] = r["kernel_ms"] = None
    return {"totals": totals, "by_operator": per_step}


# -- one model -----------------------------------------------------------------------------------


def batch_shapes(data, groups: list) -> list[list[list[int]]]:
    """Per step, each micro-batch's [sentences, source length, target length] as the trainer collates it."""
    shapes = []
    for group in groups:
        step = []
        for idx in group:
            b = collate([data.train.src_ids[i] for i in idx], [data.train.tgt_ids[i] for i in idx], idx)
            step.append([*b.src.shape, b.tgt_in.shape[1]])
        shapes.append(step)
    return shapes


def profile_model(name: str, args: argparse.Namespace, device: torch.device, data_cache: dict, tmp: str,
                  batches: list | None) -> tuple[dict, list]:
    """One --models entry: warm-up, the timed batches unprofiled, profiled and op-counted (module
    docstring). ``batches``: the first model's batch shapes (warm-up steps included), which this
    one's must equal; returns the result and this model's shapes."""
    cfg, data, model, _ = setup_model(name, args, device, {}, data_cache, tmp)
    trainer, groups = training_groups(cfg, model, data, device, args, args.steps)
    shapes = batch_shapes(data, groups)
    if batches is not None and shapes != batches:
        raise SystemExit(f"--models {name}: its training batches differ from the first model's (its preset's data, "
                         "train.batch_tokens, train.batch_sentences, train.accum_steps or train.seed differ); kernels "
                         "are compared on the same batches: make them equal with --set")
    timed = groups[args.warmup :]
    cuda = device.type == "cuda"
    log.info("%s: %d warm-up steps, then the %d timed batches once untimed ...", name, args.warmup, len(timed))
    torch.manual_seed(args.seed)
    warm_up(trainer, groups, device, args)

    log.info("%s: %d steps timed, profiled and op-counted ...", name, len(timed))
    timer, host = StepTimer(device), []
    for group in timed:
        timer.start()
        t0 = time.perf_counter()
        trainer.train_step(group)
        host.append(time.perf_counter() - t0)
        timer.stop()
    sync(device)
    step_s = timer.seconds()

    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for group in timed:
            trainer.train_step(group)
        sync(device)
    table = by_operator(prof.events(), len(timed), kernels_counted=cuda)

    counter = OpCounter()
    with counter:
        for group in timed:
            trainer.train_step(group)
    sync(device)
    per_step = dict(table["totals"], aten_ops=counter.ops / len(timed),
                    host_ms=1e3 * statistics.mean(host), step_ms=1e3 * statistics.mean(step_s))
    per_step["gpu_busy"] = per_step["kernel_ms"] / per_step["step_ms"] if cuda else None
    result = {"preset": name, "arch": cfg.model.arch, "variants": split_entry(name)[1],
              "parameters": sum(p.numel() for p in model.parameters()), "precision": cfg.train.precision,
              "per_step": per_step, "host_ms_steps": [1e3 * s for s in host], "step_ms_steps": [1e3 * s for s in step_s],
              "by_operator": table["by_operator"], "batches": shapes[args.warmup :]}
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result, shapes


def difference(a: dict, b: dict) -> dict:
    """Model ``a`` minus model ``b``: the per-step totals and every operator's row."""
    totals = {k: (v - b["per_step"][k] if v is not None and b["per_step"][k] is not None else None)
              for k, v in a["per_step"].items()}
    empty = {"calls": 0, "kernels": 0, "kernel_ms": 0.0, "cpu_ms": 0.0}
    rows = {}
    for op in set(a["by_operator"]) | set(b["by_operator"]):
        x, y = a["by_operator"].get(op, empty), b["by_operator"].get(op, empty)
        rows[op] = {k: (x[k] - y[k] if x[k] is not None and y[k] is not None else None) for k in empty}
    return {"of": f"{a['preset']} - {b['preset']}", "per_step": totals, "by_operator": rows}


# -- report --------------------------------------------------------------------------------------


def _num(v, width: int, precision: int, sign: str = "") -> str:
    """``v`` right-aligned in ``width`` (``sign`` "+": signed), or "-" for a value not measured."""
    return f"{'-':>{width}}" if v is None else f"{v:>{sign}{width}.{precision}f}"


def _top(rows: dict, key: str, n: int, absolute: bool = False) -> list[tuple[str, dict]]:
    value = (lambda r: abs(r[key] or 0)) if absolute else (lambda r: r[key] or 0)
    return sorted(rows.items(), key=lambda kv: (-value(kv[1]), kv[0]))[:n]


def _op_table(title: str, rows: list[tuple[str, dict]], signed: bool = False) -> list[str]:
    s = "+" if signed else ""
    w = max([34] + [len(op) + 2 for op, _ in rows])
    lines = [title, f"  {'operator':<{w}}{'calls':>8}{'kernels':>9}{'kernel ms':>11}{'CPU ms':>9}"]
    for op, r in rows:
        lines.append(f"  {op:<{w}}{r['calls']:>{s}8.1f}{_num(r['kernels'], 9, 1, s)}{_num(r['kernel_ms'], 11, 3, s)}"
                     f"{r['cpu_ms']:>{s}9.2f}")
    return lines


def format_report(res: dict, rows: int) -> str:
    counted = res["kernels_counted"]
    m = res["machine"]
    lines = [f"kernels per training step, {res['date']}", f"command: {res['command']}",
             f"device {m['device']}" + (f" = {m['gpu']} (CUDA {m['cuda']})" if "gpu" in m else f" ({m['cpu']})")
             + f"; torch {m['torch']}; {res['precision']}; {res['steps']} steps of Trainer.train_step a model after "
               f"{res['warmup']} warm-up steps and the same batches once untimed; the same batches for every model"]
    if not counted:
        lines.append(NO_KERNELS)
    key, what = ("kernels", "kernels") if counted else ("calls", "calls")
    time_key = "kernel_ms" if counted else "cpu_ms"
    for r in res["models"].values():
        ops = r["by_operator"]
        lines += [""] + _op_table(f"{r['preset']}: top operators by {what} a step", _top(ops, key, rows))
        lines += _op_table(f"{r['preset']}: top operators by {'kernel (GPU)' if counted else 'CPU'} time a step",
                           _top(ops, time_key, rows))
    for d in res["differences"].values():
        lines += [""] + _op_table(f"{d['of']}, by operator (largest differences in {what}, a step)",
                                  _top(d["by_operator"], key, rows, absolute=True), signed=True)
        lines += _op_table(f"{d['of']}, by operator (largest differences in {'kernel' if counted else 'CPU'} time)",
                           _top(d["by_operator"], time_key, rows, absolute=True), signed=True)
    w = max([14] + [len(name) + 2 for name in res["models"]] + [len(d["of"]) + 2 for d in res["differences"].values()])
    lines += ["", "per training step (means over the steps). kernels: GPU activities (memcpy/memset included); step ms: "
                  "CUDA events on the stream (CPU: wall clock); host ms: the train_step call on the host, unsynchronised "
                  "(the CPU's dispatch time); GPU busy = kernel ms / step ms; operators: outermost ATen operators the "
                  "profiler saw (views apart); aten ops: bench.py's OpCounter (count_ops.py's proxy); op CPU ms: the "
                  "operators' CPU time under the profiler" + ("" if counted else ". " + NO_KERNELS),
              f"{'model':<{w}}{'kernels':>9}{'kernel ms':>11}{'step ms':>9}{'host ms':>9}{'GPU busy':>10}"
              f"{'operators':>11}{'aten ops':>10}{'op CPU ms':>11}"]
    entries = [(name, r["per_step"], "") for name, r in res["models"].items()]
    entries += [(d["of"], d["per_step"], "+") for d in res["differences"].values()]
    for name, t, s in entries:
        busy = t["gpu_busy"]
        lines.append(f"{name:<{w}}{_num(t['kernels'], 9, 1, s)}{_num(t['kernel_ms'], 11, 2, s)}"
                     f"{t['step_ms']:>{s}9.2f}{t['host_ms']:>{s}9.2f}"
                     + (f"{'-':>10}" if busy is None else f"{100 * busy:>{s}9.1f}%")
                     + f"{t['operators']:>{s}11.1f}{t['aten_ops']:>{s}10.1f}{t['cpu_op_ms']:>{s}11.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, res = start_run(args)
    counted = device.type == "cuda"
    res.update({"kernels_counted": counted, "note": None if counted else NO_KERNELS,
                "precision": args.precision, "steps": args.steps, "warmup": args.warmup, "models": {}})
    data_cache: dict = {}
    batches = None
    with tempfile.TemporaryDirectory(prefix="cometnmt-kernels-") as tmp:
        for name in args.models:
            res["models"][name], batches = profile_model(name, args, device, data_cache, str(Path(tmp) / name), batches)
    res["batches"] = next(iter(res["models"].values()))["batches"]
    reference = "transformer" if "transformer" in res["models"] else args.models[0]
    res["reference"] = reference
    res["differences"] = {name: difference(r, res["models"][reference])
                          for name, r in res["models"].items() if name != reference}
    return finish_run(res, format_report(res, args.rows),
                      args.out or REPO / "bench" / "results" / ("kernels_gpu.json" if counted else "kernels_cpu.json"))


if __name__ == "__main__":
    raise SystemExit(main())
