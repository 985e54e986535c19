"""One way to write a file whole or not at all: a temporary file beside it, flushed and fsync'd,
then renamed over it (``os.replace``) and its folder fsync'd (so that a power loss keeps the
rename too), or removed on an interrupt. Checkpoints, outputs, JSON results, tag caches and
downloads all go through ``atomic_write``, so an interrupted write never leaves a torn file
(nor its temporary file); and ``refuse_overwrite``, the commands' check that
no output is one of their inputs or outputs."""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

try:
    import fcntl
except ImportError:  # Windows: no flock; temporary files are then never taken for stale
    fcntl = None

from cometnmt.errors import CometNMTError, setting
from cometnmt.interrupts import deferred


class FolderLock:
    """An exclusive ``flock`` on a folder itself (no file is written in it), held from :meth:`take`
    to :meth:`release` or the process's end (the kernel drops it then, on ``kill -9`` too). Where
    there is no flock (Windows) or the file system takes none, nothing is held."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def take(self, folder: Path) -> bool:
        """Hold the lock of ``folder`` (nothing done where it is no folder yet, or held already):
        False where another open of it (a live process) holds it, else True."""
        if self._fd is not None or fcntl is None or not folder.is_dir():
            return True
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:  # not readable: what reads or writes there next says so
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:  # no locks on this file system: unchecked
            os.close(fd)
            return True
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None


@contextmanager
def file_lock(path: str | Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the file ``path`` (created where missing, and left in place:
    removed, a process waiting on it would hold a lock on a file no longer named ``path`` while a
    third locked a new one), waiting for it, around a short read-modify-write that other processes
    and threads do too (a tag cache's index). :class:`FolderLock` does not wait (it refuses a second
    run in a folder) and locks the folder itself, which a run's process holds already where the
    two folders are one (a tag cache inside a run folder): waiting there, it would wait for itself.
    Yields whether the lock is held: False where there is no flock (Windows), the file can be
    neither created nor opened (a read-only folder: the write guarded fails there anyway) or the
    file system takes no locks; the block runs unguarded then, as it did before."""
    fd = None
    if fcntl is not None:
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):  # another user's lock file: read-only serves
            try:
                fd = os.open(path, flags, 0o644)
                break
            except OSError:
                continue
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks
            os.close(fd)
            fd = None
        except BaseException:  # Ctrl-C while waiting
            os.close(fd)
            raise
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)  # drops the flock


def output_path(path: str | Path) -> Path:
    """The file an output path names: a symbolic link is written through, as the shell's ``>``
    does (the file it names, through every link; a dangling one: where it points)."""
    path = Path(path)
    return path.resolve() if path.is_symlink() else path


def replace_keeping_mode(new: str | Path, path: Path) -> None:
    """Rename the finished file ``new`` over ``path`` with the permissions ``path`` had (a new
    file: 0644, readable by all, as an ordinary file; mkstemp creates 0600)."""
    try:
        perms = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # a new file (or one we may not stat: the rename decides)
        perms = 0o644
    os.chmod(new, perms)
    os.replace(new, path)


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` (``mode`` "w": UTF-8 text, "wb": bytes; parent
    folders created). On a normal exit it replaces ``path`` with the permissions ``path`` had
    (a new file: readable by all, 0644, as an ordinary file); on an exception it is removed and
    ``path`` is left as it was. A symbolic link is written through, as the shell's ``>`` does: the
    file it points to gets the new content and the link stays. (The rename replaced the link itself
    with a new file, the link's target left with its old content, and reset a private file's 0600
    to 0644, readable by all: ``translate -o`` onto a link or a private file.)"""
    path = output_path(path)
    make_folder(path.parent)
    tmp = held = None
    try:
        # Ctrl-C/SIGTERM waits until the temporary file is made and its name known: raised inside
        # mkstemp, just after the file was created, it left that file behind
        with deferred():
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            held = _hold(fd)  # until the rename: remove_stale_temporaries leaves it alone
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace_keeping_mode(tmp, path)
        tmp = None  # renamed: nothing of ours to remove
        _fsync_folder(path.parent)
    except BaseException:
        if tmp is not None:
            # os.unlink first, a C call: a second signal already pending (SIGINT and SIGTERM together)
            # is raised after it; a Python call first (Path(tmp)) raised it there, the file left behind
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    finally:
        if held is not None:
            os.close(held)


def _hold(fd: int) -> int | None:
    """Lock a temporary file while it is written and renamed: ``flock`` on a duplicate of its
    descriptor, which outlives the file object's close; the duplicate, or None where there is no
    flock (Windows) or the file system takes no lock. The kernel drops the lock when the process
    ends, however (kill -9 too), so a temporary file no process holds was left by a dead one."""
    if fcntl is None:
        return None
    dup = os.dup(fd)
    try:
        fcntl.flock(dup, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(dup)
        return None
    return dup


# atomic_write's temporary file of NAME: mkstemp's prefix and suffix around 8 of its letters
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")
# a temporary file younger than this may be one just made, not yet locked (or one of a clock ahead, over NFS)
STALE_AFTER_S = 60.0


def remove_stale_temporaries(folder: str | Path, names: Callable[[str], bool]) -> dict[str, list[Path]]:
    """Remove from ``folder`` the temporary files of :func:`atomic_write` for the file names that
    ``names`` accepts whose writer is gone. A process killed inside a write (kill -9, an out-of-
    memory kill, a lost machine) leaves one each time, as large as the file (a checkpoint), and
    nothing removed them: they added up over a long run's kills. One is removed only when no
    process holds its lock (a live writer does until its rename: another process writing in this
    folder, on this host or over NFS) and it is older than ``STALE_AFTER_S``. Returns the paths
    "removed", "in_use" (held by a live process) and "unknown" (no lock to ask: kept)."""
    found: dict[str, list[Path]] = {"removed": [], "in_use": [], "unknown": []}
    if fcntl is None:
        return found
    for path in sorted(Path(folder).iterdir()):
        m = _TEMPORARY.fullmatch(path.name)
        if not m or not names(m.group("name")):
            continue
        try:
            if time.time() - path.stat().st_mtime < STALE_AFTER_S:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # renamed or removed meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found["in_use"].append(path)
            continue
        except OSError:
            found["unknown"].append(path)
            continue
        else:
            try:
                os.unlink(path)  # by its name: a writer that renamed it meanwhile keeps its file
            except FileNotFoundError:
                continue
            found["removed"].append(path)
        finally:
            os.close(fd)
    return found


def make_folder(folder: str | Path) -> None:
    """``mkdir -p`` whose new folders survive a power loss: each folder made here is fsync'd into
    its parent, as atomic_write's rename is into its folder (a file fsync'd inside a folder whose
    own entry was never synced could be lost with the folder: a new run's checkpoints)."""
    folder = Path(folder)
    missing = [f for f in (folder, *folder.parents) if not f.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for made in reversed(missing):  # outermost first
        _fsync_folder(made.parent)


def _fsync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a power loss: the file's own fsync keeps its
    bytes, not the folder entry naming them, and after a crash the path could still name the old
    file (or none). Where a folder cannot be opened or synced (Windows) the rename stands unsynced."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: ``os.path.samefile`` when both exist (a symlink, a hard
    link, ``./a.txt`` and ``a.txt``), else the resolved paths compared."""
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        try:
            return os.path.samefile(a, b)
        except OSError:
            pass
    return a.resolve() == b.resolve()


def refuse_overwrite(outputs: Iterable[tuple[str, str | Path | None]], inputs: Iterable[tuple[str, str | Path | None]] = (),
                     *, flags: bool = True, error: type | None = None) -> None:
    """Before anything is read or written: a :class:`~cometnmt.errors.CometNMTError` when an output
    path is one of the command's inputs (writing would destroy it) or another of its outputs (one
    would replace the other). ``outputs`` and ``inputs`` are (name, path) pairs: the name is the
    flag (``-o``), or without ``flags`` the keyword (``output``); the message names both settings
    and the path; ``error`` is the exception's class (default ``CometNMTError``). A path not given
    (None: standard input or output) never clashes."""
    error = error or CometNMTError

    def given(pairs):
        return [(name, path) for name, path in pairs if path is not None]

    def named(name, path):  # a description ("the test split's reference") is followed by the path
        return f"{name} {path}" if " " in name else setting(name, path, flags, flag=name if flags else None)

    outputs, inputs = given(outputs), given(inputs)
    for i, (out_name, out) in enumerate(outputs):
        for in_name, path in inputs:
            if same_file(out, path):
                raise error(f"{named(out_name, out)} and {named(in_name, path)}: the same file; writing the output "
                            "would destroy the input (give the output another name)")
        for other_name, other in outputs[:i]:
            if same_file(out, other):
                raise error(f"{named(other_name, other)} and {named(out_name, out)}: the same file; one output "
                            "would replace the other (give each its own name)")
