"""Data parallelism on PyTorch's own engine: ``torchrun`` sets RANK/WORLD_SIZE/LOCAL_RANK, we join
the process group (gloo on the CPU, NCCL on GPUs) and wrap the model in DistributedDataParallel.
Without those variables everything runs as a single process."""

from __future__ import annotations

import datetime
import inspect
import os
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from cometnmt import errors

T = TypeVar("T")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(device_kind: str, timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group torchrun described, if any. ``device_kind``: 'cpu' or 'cuda'.
    ``timeout_minutes`` (train.distributed_timeout_minutes): the group's timeout, how long a rank
    waits in one collective (and for the others to join) before it fails; a join that outlasts it
    raises an error naming the key (:func:`_joined_too_late`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if device_kind == "cuda":  # before joining, so NCCL binds each rank to its own GPU
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        started = time.monotonic()
        try:
            dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo",
                                    timeout=datetime.timedelta(minutes=timeout_minutes))
        except RuntimeError as exc:  # torch.distributed.DistError: the store's, a timeout among them
            _joined_too_late(info, time.monotonic() - started, timeout_minutes, exc)
            raise
    return info


def waited_out(seconds: float, timeout_minutes: float) -> bool:
    """Whether a collective that failed after ``seconds`` ran out of the process group's timeout
    (train.distributed_timeout_minutes; 1% early for the clocks' difference), rather than failing
    for another reason (a rank that died, a port in use): torch's error text does not say which."""
    return seconds / 60 >= 0.99 * timeout_minutes


def _joined_too_late(info: DistInfo, seconds: float, timeout_minutes: float, exc: RuntimeError) -> None:
    """After joining the process group failed with ``exc``, ``seconds`` after it began: if the wait
    lasted the group's timeout (train.distributed_timeout_minutes), raise an error naming the key,
    the rank and, where torch counted them (rank 0's store: "1/2 clients joined"), the ranks that
    joined. torch's own text said neither the key nor what to do: rank 0 "DistStoreError: Timed out
    after 7 seconds waiting for clients. 1/2 clients joined.", under torchrun "DistStoreError: wait
    timeout after 6000ms, keys: /default_pg/0//cpu//0/1", a rank whose rank 0 never came
    "DistNetworkError: The client socket has timed out after 6000ms while trying to connect to
    (127.0.0.1, 29500)." Another failure (a port in use) is left to ``exc``."""
    if not waited_out(seconds, timeout_minutes):
        return
    minutes = seconds / 60
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    counted = re.search(r"(\d+)/(\d+) clients joined", text)
    joined = f" ({counted[1]} of {counted[2]} ranks joined)" if counted else ""
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    raise errors.ConfigError.at(
        "train.distributed_timeout_minutes", f"rank {info.rank} of {info.world_size} gave up joining the "
        f"process group after {minutes:.2f} minutes{joined}, the {timeout_minutes:g} minutes a rank waits for the others "
        f"to start: check that every rank started and can reach rank 0 at MASTER_ADDR:MASTER_PORT ({address}), or raise "
        f"the key where ranks start minutes apart ({type(exc).__name__}: {text})") from exc


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` (pickled) on every rank; the other ranks' ``obj`` is ignored. ``obj`` itself
    in a single process."""
    if not info.enabled:
        return obj
    box = [obj if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class PeerLeft(RuntimeError):
    """A rank's collective failed because another rank left the process group (gloo's "Connection
    closed by peer", or "reset" where it left unread data behind): that rank's own error says why
    it left. ``cometnmt train`` shows this one as a line, so that the traceback of a collective,
    which says nothing of why, does not follow the other rank's error on the terminal the ranks
    share; it exits 1 (130, 143 where the rank held a signal). NCCL raises no such error for a rank
    that died (a peer waits for the group's timeout)."""


def peer_left(exc: BaseException, info: DistInfo) -> PeerLeft | None:
    """A :class:`PeerLeft` for ``exc`` where it is gloo's error for a peer that closed its
    connection (the peer's address kept, for a run over several hosts); None for any other error."""
    text = str(exc) if isinstance(exc, RuntimeError) else ""  # gloo's DistBackendError is one
    found = re.search(r"Connection (?:closed|reset) by peer(?: \[[^\]]*\](?::\d+)?)?", text)
    if found is None or not info.enabled:
        return None
    return PeerLeft(f"rank {info.rank} of {info.world_size} stopped training: another rank left the process group "
                    f"({found[0]}); that rank's own error says why")


class RankFailed(RuntimeError):
    """Another rank's error that is not the toolkit's own (a bug, an OSError, PyTorch's RuntimeError),
    as a rank that learnt of it in a collective raises it (:func:`rank_error`): its message names
    the rank, what it was doing, the error's class and message ("rank 1 failed DOING: ValueError:
    ..."), for a Python caller and rank 0's train.log, which also keeps :attr:`trace`, the failing
    rank's formatted traceback (the failing rank writes no train.log of its own). ``cometnmt
    train`` shows it as :attr:`relayed_line`, without the error's message: the failing rank shows
    the error itself, with its traceback, on the terminal the ranks share, and the copy (with the
    traceback of the collective, which says nothing) showed it twice; it exits 1, as the failing
    rank does."""

    def __init__(self, rank: int, kind: str, message: str, trace: str, doing: str) -> None:
        super().__init__(f"rank {rank} failed {doing}: {kind}: {message}")
        self.trace = trace
        self.relayed_line = _relayed_line(rank, kind, doing, "the error with its traceback")


def _relayed_line(rank: int, kind: str, doing: str, shown: str) -> str:
    """The line ``cometnmt train`` shows for another rank's error in place of the error itself."""
    return f"rank {rank} failed {doing} ({kind}); that rank's own output shows {shown}"


def rank_error(rank: int, kind: str, message: str, trace: str, doing: str, keys: tuple[str, ...] = ()) -> Exception:
    """The error another rank raises for one rank ``rank`` had while ``doing`` (its class name
    ``kind``, its message and its formatted traceback ``trace``, as that rank sent them:
    :func:`sent`): the same class for the toolkit's own errors, a :class:`RankFailed` otherwise.
    Either's message is the whole error ("rank 0 failed DOING: data/train.de:7: ..."), for a
    Python caller and rank 0's train.log; either carries ``relayed_line``, the one line ``cometnmt
    train`` shows in its place, since the failing rank shows the error itself on the terminal the
    ranks share (a usage error was shown twice). ``keys``: the config keys the error names (a
    ConfigError's or DataError's), kept so that the relayed error names, as the failing rank's does,
    the file or ``--set`` that gave them (:func:`cometnmt.config.name_origin`)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.CometNMTError):
        keyed = {"keys": keys} if issubclass(cls, errors.KeyedError) else {}
        error = cls(f"rank {rank} failed {doing}: {message}", **keyed)
        error.relayed_line = _relayed_line(rank, kind, doing, "the error")
        return error
    return RankFailed(rank, kind, message, trace, doing)


def sent(exc: BaseException) -> tuple[str, str, str, tuple[str, ...]]:
    """What another rank receives of this rank's error ``exc`` (pickled) to raise as :func:`rank_error`:
    its class name, its message, its formatted traceback (from where this rank caught it) and the
    config keys it names (empty for an error that names none)."""
    return type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)), tuple(getattr(exc, "keys", ()))


def _attempt(compute: Callable[[], T]) -> tuple[tuple, Exception | None]:
    """``compute()`` as an outcome another rank can receive (pickled): ``(True, result)``, or
    ``(False, sent(error))`` with the error itself beside it for this rank to raise."""
    try:
        return (True, compute()), None
    except Exception as exc:  # the other ranks learn of it from the outcome
        return (False, sent(exc)), exc


def _raise_failure(outcomes: list[tuple | None], error: Exception | None, doing: str) -> None:
    """After the ranks exchanged ``outcomes`` (rank r's at index r; None for a rank that computed
    nothing): a rank that failed raises its own ``error``; the others, if any rank failed, an error
    naming the first that did (:func:`rank_error`)."""
    if error is not None:
        raise error
    for rank, outcome in enumerate(outcomes):
        if outcome is not None and not outcome[0]:
            kind, message, trace, keys = outcome[1]
            raise rank_error(rank, kind, message, trace, doing, keys)


def broadcast_result(compute: Callable[[], T], info: DistInfo, doing: str) -> T:
    """``compute()`` run on rank 0 alone and its result broadcast to every rank, with success or
    rank 0's error: if it raises, rank 0 raises its error and every other rank at once a copy that
    names it ("rank 0 failed DOING: ..."; :func:`rank_error`). The other ranks wait in the
    broadcast either way: with a plain broadcast of the result, they waited there for one that never
    came, until the process group's timeout (gloo's 30 minutes by default). ``compute()`` itself in a
    single process."""
    if not info.enabled:
        return compute()
    outcome, error = _attempt(compute) if info.is_main else (None, None)
    outcome = broadcast_object(outcome, info)
    _raise_failure([outcome], error, doing)
    return outcome[1]


def gather_results(compute: Callable[[], T], info: DistInfo, doing: str) -> list[T]:
    """``compute()`` run on every rank and every rank's result on every rank, in rank order, with
    success or each rank's error: if it raises on a rank, that rank raises its error and every
    other rank at once a copy that names it ("rank 1 failed DOING: ..."; the first such rank where
    several failed). With a plain all-gather of the results, the others waited in it for a rank
    that had left, and failed there with gloo's "Connection closed by peer" (or the process group's
    timeout), which does not say what happened. ``[compute()]`` in a single process."""
    if not info.enabled:
        return [compute()]
    outcome, error = _attempt(compute)
    outcomes = all_gather_objects(outcome, info)
    _raise_failure(outcomes, error, doing)
    return [value for _, value in outcomes]


def all_gather_objects(obj, info: DistInfo) -> list:
    """Every rank's ``obj`` (pickled), in rank order; ``[obj]`` in a single process."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; unchanged in a single process."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, info: DistInfo | None, device: torch.device | str = "cpu") -> bool:
    """Whether ``flag`` holds on any rank (an interrupt one of them noted, say): an all-reduce of a
    0-dim 1 or 0 made on ``device`` (the process group's: a CUDA device under NCCL). Every rank must
    call it at the same point. In a single process (``info`` None or one rank) it is ``flag``."""
    if info is None or not info.enabled:
        return flag
    return bool(all_reduce_sum((torch.ones if flag else torch.zeros)((), device=device), info) > 0)


class SyncedRunningStatistics:
    """Running statistics of training batches (COMET's batch norm) that are the same on every rank
    and equal those of one process training the step's micro-batches in turn.

    Under DDP each rank's batch norms would follow their own micro-batches; PyTorch's answer,
    broadcasting rank 0's buffers before each forward, keeps rank 0's alone. Here every module that
    keeps such statistics (any with ``defer_running``, ``recorded`` and ``replay``, e.g.
    :class:`cometnmt.models.comet.MaskedBatchNorm`) only records each training batch's statistics;
    after the step's micro-batches the ranks all-gather the records (one collective a step, a few
    hundred floats a micro-batch) and each rank replays them all, rank 0's micro-batches first as
    they come first in the step, so the running statistics, per-length buckets and their counts
    included, equal a single process's (``tests/test_distributed.py``). Records stay on the device:
    no host sync. In a single process (or a model without such modules) it does nothing.

    The batch statistics a training forward normalises with are its micro-batch's own, on each rank
    as in one process accumulating the step's micro-batches: not those of the step's global batch
    (every rank's micro-batches together). ``torch.nn.SyncBatchNorm`` would take those, and is
    deliberately not offered: a step would then depend on the number of ranks, so two ranks would
    no longer train as one process does, nor would a run resume exactly at another world size
    (``trainer``'s module docstring); and it does not know COMET's masked, per-length statistics."""

    def __init__(self, model: torch.nn.Module, info: DistInfo) -> None:
        self.info = info
        self.modules = [m for m in model.modules() if hasattr(m, "defer_running")] if info.enabled else []
        for m in self.modules:
            m.defer_running = True
        self.rows: list[torch.Tensor] = []

    def owns_every_changing_buffer(self, model: torch.nn.Module) -> bool:
        """True if every persistent buffer of ``model`` belongs to a module synchronised here (the
        non-persistent ones are constants, such as positional tables): then DDP need not broadcast
        buffers before each forward."""
        mine = {id(b) for m in self.modules for b in m.buffers()}
        persistent = model.state_dict(keep_vars=True)
        return all(id(b) in mine for name, b in model.named_buffers() if name in persistent)

    def start_step(self) -> None:
        self.rows = []

    def record(self) -> None:
        """After a micro-batch's forward (not a zero-weighted one): keep its records."""
        if self.modules:
            self.rows.append(torch.cat([m.recorded for m in self.modules]))

    def end_step(self, counts: list[int]) -> None:
        """``counts[r]``: the micro-batches rank r trained this step (0 for a rank that joined with a
        zero-weighted one); the same list on every rank."""
        if not self.modules:
            return
        if len(self.rows) != counts[self.info.rank]:
            raise RuntimeError(f"rank {self.info.rank} recorded {len(self.rows)} micro-batches, expected {counts[self.info.rank]}")
        first = self.modules[0].recorded
        local = first.new_zeros(max(counts), sum(m.recorded.numel() for m in self.modules))
        if self.rows:
            local[: len(self.rows)] = torch.stack(self.rows)
        gathered = [torch.empty_like(local) for _ in range(self.info.world_size)]
        dist.all_gather(gathered, local)
        with torch.no_grad():
            for records, n in zip(gathered, counts):
                for row in records[:n]:
                    offset = 0
                    for m in self.modules:
                        size = m.recorded.numel()
                        m.replay(row[offset : offset + size])
                        offset += size
        self.rows = []


def ddp_buffer_sync(sync: bool) -> dict:
    """DistributedDataParallel's keyword for broadcasting buffers before each forward
    (``forward_sync_buffers`` where torch has it, ``broadcast_buffers``, now deprecated, before)."""
    params = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": sync} if "forward_sync_buffers" in params else {"broadcast_buffers": sync}


def shutdown(info: DistInfo, clean: bool = True) -> None:
    """Leave the process group. After a clean finish each rank first waits for the others (a
    barrier), so that none tears down its gloo/NCCL connections and threads while a peer is still
    writing checkpoints or talking to it. (A rank once aborted at exit in the test suite with
    "terminate called without an active exception", a C++ thread left running; this and freeing
    the DDP model first, in ``run.train``, are the likely remedies, not a proven cause.) After an
    error (``clean=False``) it leaves at once: a barrier would wait for a rank that may have died."""
    if info.enabled and dist.is_initialized():
        try:
            if clean:
                dist.barrier()
        finally:
            dist.destroy_process_group()
