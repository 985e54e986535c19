"""Holding Ctrl-C and SIGTERM off while something must not be cut in two.

An interrupt lands between any two bytecodes. Inside a training step that is between the batch
norms' running statistics being updated (in the forward) and the weights (in the optimizer), or
between the step counter and the count of consumed batches; the checkpoint saved on the way out
then holds half a step, and the resume is not exact. Inside a checkpoint's write it aborts the
write. :func:`deferred` runs a block to its end and delivers the interrupt after it;
:func:`first_raises` lets the first interrupt through and holds off the ones after it while it is
handled (last.pt saved).
"""

from __future__ import annotations

import signal
import threading
import traceback
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred(redeliver: bool = True) -> Iterator[list[int]]:
    """Within the block, SIGINT and SIGTERM are only noted; the block runs to its end. On leaving
    it, the first one noted is delivered to the handler that was in place before (Ctrl-C's
    KeyboardInterrupt, the CLI's SIGTERM), unless ``redeliver`` is False: the block is the clean-up
    of an interrupt already being handled, and a second signal (a second Ctrl-C, or the SIGTERM
    that `reproduce` sends its trainings after the terminal's SIGINT) must not abort it.

    Nested blocks note into the outer one. Yields the list of signals noted. Outside the main
    thread, where Python delivers no signal, it does nothing.

    A block that raises delivers its signal too (it was dropped: a SIGTERM during a failed
    checkpoint write showed only as the failure, and a caller that handles the failure, such as
    the attention plots' warning, went on as if it never came). The failure stays the one
    reported, the signal's exit wins: where the handler before notes it (an outer block), the
    failure goes on and the outer block delivers the signal when it ends; where it raises
    (KeyboardInterrupt, the CLI's SIGTERM), that is raised *from* the failure, so it passes every
    ``except Exception`` and the process stops as asked, its traceback (and the CLI's message,
    ``cometnmt.cli``) naming the failure; ``Trainer.fit`` saves no last.pt for such an interrupt,
    as it saves none for the failure alone. Under DDP fit's own block (``redeliver=False``) takes
    a step's signal, and delivers it from the failure the same way (:func:`raise_noted`), so a rank
    exits as one process does (130, 143). Where the handler is SIGTERM's
    default (no CLI), the failure's traceback is printed before the process ends. Nothing written
    is lost: the block ran to its failure, and the writes it holds are atomic (the old file stays)."""
    noted: list[int] = []
    try:
        with _handled_by(lambda signum, frame: noted.append(signum)) as previous:
            yield noted
    except BaseException as failure:
        if noted and redeliver:
            _deliver_after(failure, noted[0], previous[noted[0]])
        raise
    if noted and redeliver:
        _deliver(noted[0], previous[noted[0]])


@contextmanager
def first_raises() -> Iterator[list[int]]:
    """Within the block, the first SIGINT or SIGTERM does what it did before (Ctrl-C's
    KeyboardInterrupt, the CLI's SIGTERM), and every one after it is only noted until the block
    ends: the block's handling of the first (saving last.pt) is not cut short by a second one, also
    not by one already pending when the first was raised (the terminal's SIGINT and the SIGTERM
    that `reproduce` sends its trainings arrive together: the second was raised at the next
    bytecode check, before any guard inside the handler was up). An ignored signal (SIG_IGN) does
    not count as the first. A :func:`deferred` block inside delivers its signal to this one.

    Yields the list of signals noted after the first. Outside the main thread it does nothing."""
    later: list[int] = []
    first: list[int] = []

    def handler(signum, frame):
        if first:
            later.append(signum)
            return
        first.append(signum)  # before delivering: a signal pending behind this one is noted
        _deliver(signum, previous[signum])
        first.clear()  # reached only when the signal was ignored (nothing raised)

    with _handled_by(handler) as previous:
        yield later


class HandOver:
    """The signals of a :func:`noted_until_taken` block: noted until :meth:`take`, delivered after it
    to the handlers that were in place before the block (as if the block had ended)."""

    def __init__(self) -> None:
        self.noted: list[int] = []
        self.taken = False
        self.ignored = ignored()  # before the block's handler is in place: it hides SIG_IGN from ignored()
        self.previous: dict = {}

    def handle(self, signum, frame) -> None:
        if self.taken:
            _deliver(signum, self.previous[signum])
        else:
            self.noted.append(signum)

    def take(self) -> list[int]:
        """Called by the code that notes the signals itself from now on, once its own handlers are
        in place over the block's: the signals noted so far (this one block's, ignored ones
        included), which are its to count; any that reaches the block's handler after this is
        delivered as if the block had ended."""
        self.taken = True
        return list(self.noted)


@contextmanager
def noted_until_taken() -> Iterator[HandOver]:
    """Within the block, SIGINT and SIGTERM are only noted, as in ``deferred(redeliver=False)``,
    until the yielded :class:`HandOver`'s ``take()``; after it, the block's handler passes them to
    the handlers in place before it. So code that installs its own handlers (:func:`deferred`,
    :func:`first_raises`) inside the block can take the signals over with no gap between the
    block's handler and its own, where one would have been raised, and the block's handler may stay
    under the inner ones without swallowing what they deliver to it. On leaving, the handlers
    before it come back; signals noted and never taken are dropped. Outside the main thread it
    installs nothing."""
    hand = HandOver()
    with _handled_by(hand.handle) as previous:
        hand.previous = previous
        yield hand


@contextmanager
def _handled_by(handler) -> Iterator[dict]:
    """Within the block, ``handler`` handles SIGINT and SIGTERM; yields the handlers it replaced
    (filled in before any signal can reach it), which come back afterwards. Outside the main
    thread, where Python delivers no signal, it installs nothing and yields an empty dict."""
    previous: dict = {}
    if threading.current_thread() is not threading.main_thread():
        yield previous
        return
    try:
        for signum in SIGNALS:
            if signal.getsignal(signum) is not None:  # None: a handler set outside Python, left alone
                previous[signum] = signal.signal(signum, handler)
        yield previous
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class Stopped(KeyboardInterrupt):
    """Raised by :func:`check_stop` in a thread asked to stop (:func:`stop_on`). A KeyboardInterrupt,
    so that no ``except Exception`` on the way out takes it for a failure."""


_stop = threading.local()  # per thread: the Event that asks it to stop (stop_on), if any


@contextmanager
def stop_on(event) -> Iterator[None]:
    """Within the block, in this thread, :func:`check_stop` raises :class:`Stopped` once ``event``
    is set (a ``threading.Event``, or any object whose ``is_set()`` says so: `reproduce`'s
    evaluations stop on Ctrl-C or once their deadline passed, ``experiments._EvaluationStop``).
    Python delivers signals to the main thread only, and a worker thread runs on whatever
    the main thread's handler did: `reproduce` evaluates its runs in a thread pool, and after Ctrl-C
    the command waited for the running decoding to end (minutes on a CPU) before it stopped. The
    main thread sets the event (``experiments._stopping``); the worker's loop checks it at points
    where stopping loses nothing (between decoded batches: :meth:`Translator.translate_ids`).
    Nested blocks: the inner event holds within it, the outer one after it."""
    before = getattr(_stop, "event", None)
    _stop.event = event
    try:
        yield
    finally:
        _stop.event = before


def check_stop() -> None:
    """Raise :class:`Stopped` where this thread's :func:`stop_on` event is set; nothing otherwise
    (outside any block, in the main thread too, where Ctrl-C raises by itself)."""
    event = getattr(_stop, "event", None)
    if event is not None and event.is_set():
        raise Stopped("stopped: the command was interrupted, or its deadline passed")


def ignored() -> set[int]:
    """The signals of :data:`SIGNALS` ignored now (SIG_IGN: a run started in the background by a
    script ignores SIGINT): noted inside a block, delivering them does nothing."""
    return {signum for signum in SIGNALS if signal.getsignal(signum) == signal.SIG_IGN}


def raise_noted(noted: list[int], failure: BaseException | None = None) -> None:
    """Deliver the first signal of ``noted`` (a :func:`deferred` block's, after it ended without
    delivering it) to the handler now in place, as it would have been delivered when it came.
    ``failure``: the block ended raising it; the signal is delivered as :func:`deferred` delivers
    one after a block that raised (what the handler raises is raised from the failure, the signal's
    exit wins), and the caller raises the failure again where the handler raised nothing."""
    if noted and failure is not None:
        _deliver_after(failure, noted[0], signal.getsignal(noted[0]))
    elif noted:
        _deliver(noted[0], signal.getsignal(noted[0]))


def _deliver_after(failure: BaseException, signum: int, handler) -> None:
    """Deliver ``signum`` to ``handler`` after a :func:`deferred` block raised ``failure``: what the
    handler raises is raised from the failure; one that only notes it lets the failure go on."""
    if handler == signal.SIG_DFL:
        traceback.print_exception(failure)  # the process ends at once: say why it was failing
    try:
        _deliver(signum, handler)
    except BaseException as interrupt:
        if interrupt is failure:
            raise
        raise interrupt from failure


def _deliver(signum: int, handler) -> None:
    """Do what ``handler`` (as ``signal.signal`` returned it) would have done with ``signum``."""
    if callable(handler):
        handler(signum, None)  # KeyboardInterrupt, the CLI's SIGTERM, or an outer block noting it
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # SIGTERM's default: the process ends, as it would have
