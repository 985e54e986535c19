"""``cometnmt translate`` in chunks: the input read, translated and written ``buffer_size`` lines at a
time, so that output comes as soon as a chunk is done (``translate | head`` does not wait for the
whole file), memory does not grow with the input, and an interrupted translation into ``-o FILE``
keeps what it finished.

Into ``-o FILE`` each chunk is appended to ``FILE.partial`` (beside the file ``FILE`` names,
through a symbolic link), and ``FILE.partial.json`` records what it belongs to: the input (its path
and the SHA-256 of the lines translated so far), the checkpoints (path, size, modification time, SHA-256),
the search settings (``decode.*``, a drawn sampling seed included), the lines done and the bytes of
output they gave. At the end ``FILE.partial`` is renamed to ``FILE`` (never half-written) and the
record removed. ``translate --resume`` continues an interrupted run from its first unfinished line:
the output is cut back to the recorded bytes (a kill -9 inside an append), the input's first lines
are checked against the recorded hash, and anything else recorded must be as now, or the run is
refused naming what differs. A chunk's output is a function of its lines and their places in the
whole input only (sampling keys each line's stream by its place, ``Translator.translate``'s
``start``), so any chunk size, resumed or not, writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Iterator

from cometnmt.atomic import _fsync_folder, atomic_write, make_folder, output_path, replace_keeping_mode
from cometnmt.data.corpus import (GZIP_MAGIC, decode_lines, gzip_errors, later_wide_encoding, misread_wide_error,
                                  not_nfc_lines, open_bytes, ready_bytes, warn_not_nfc_count, wide_encoding)
from cometnmt.data.multi30k import sha256_file
from cometnmt.errors import CometNMTError, DataError
from cometnmt.interrupts import deferred

DEFAULT_BUFFER_SIZE = 10000  # lines read and translated at a time (fairseq-interactive's --buffer-size)
FORMAT = 1  # of the .partial.json record


def count_lines(path: str) -> int | None:
    """The number of lines of a file (plain or gzip) as read_lines splits them, for the progress
    bar's total; None where it cannot be read (the reader then says why) or is no regular file (a
    pipe, `-i <(zcat a.gz)`, can be read once only: counting it left the translation nothing)."""
    if not os.path.isfile(path):
        return None
    try:
        with open_bytes(path) as f, gzip_errors(path):
            count, last = 0, b"\n"
            while block := f.read(1 << 20):
                count += block.count(b"\n")
                last = block[-1:]
    except (DataError, OSError):
        return None
    return count + (last != b"\n")


class ChunkedInput:
    """An input file (plain or gzip) or standard input (``path`` None), read ``size`` lines at a
    time; a chunk's lines are decoded and checked as read_lines checks a file's (errors and
    warnings name the line of the whole input). A running SHA-256 of the bytes read identifies the
    lines done for a resumed run. Lines not in Unicode NFC are warned of once, as read_lines warns
    of a file's, when the input is closed: how many of the lines read, and the first (a warning per
    chunk was one per 10,000 lines of a large file). UTF-16 or UTF-32 input is judged from the
    first chunk and the bytes after it (wide_encoding), and that chunk is refused naming it: split
    at b"\\n", its characters holding a 0x0a byte (U+4E0A) are cut, and a chunk alone may show
    another byte order, or none. So no chunk of such an input is translated, nor kept for --resume
    to skip: its errors need no place in its own lines (corpus.WidePlace, --interactive's). An
    input whose start did not show it (a pipe whose first line came alone) is refused at the later
    chunk that does, judged from the byte where that chunk starts (later_wide_encoding), as misread
    from the start: what the chunks before made of it is not kept either (MisreadInputError)."""

    def __init__(self, path: str | None, size: int) -> None:
        self.path, self.size = path, size
        self.name = path or "<stdin>"
        self.stream: BinaryIO = open_bytes(path) if path else sys.stdin.buffer
        self.lines_read = 0
        self.at_end = False  # the last read reached the end of the input
        self._ahead: list[bytes] | None = None  # a chunk read by total(), for chunks() to yield first
        self.sha256 = hashlib.sha256()
        self.not_nfc, self.first_not_nfc = 0, 0  # lines read not in NFC: how many, the first (1-based)
        self.encoding: str | None = None  # UTF-16/32, as the input's start shows (wide_encoding)
        self.bytes_read = 0  # of the input, through the last line read

    def close(self) -> None:
        """Close the file, and warn of the lines read that are not in NFC (at the end of the input,
        or where an interrupt or error stopped the reading)."""
        if self.path:
            self.stream.close()
        if self.not_nfc:
            warn_not_nfc_count(self.name, self.not_nfc, self.first_not_nfc)
            self.not_nfc = 0

    def _raw(self, count: int) -> list[bytes]:
        """The next ``count`` lines as bytes (fewer at the end), newlines kept, hashed."""
        lines = []
        with gzip_errors(self.name):
            while len(lines) < count and (line := self.stream.readline()):
                lines.append(line)
        if not self.lines_read and lines and lines[0].startswith(GZIP_MAGIC):  # only standard input: files are gunzipped
            raise DataError("<stdin>: gzip-compressed data; standard input is read as plain UTF-8 text: give a gzip file "
                            "by name (translate -i FILE) or through zcat")
        if not self.lines_read and lines:  # judged before the first chunk is decoded, or skipped by --resume
            with gzip_errors(self.name):
                self.encoding = wide_encoding(b"".join(lines) + ready_bytes(self.stream))
        for line in lines:
            self.sha256.update(line)
            self.bytes_read += len(line)
        self.lines_read += len(lines)
        self.at_end = len(lines) < count
        return lines

    def total(self) -> int | None:
        """The number of lines of the input, for the progress bar. The next chunk is read ahead
        (:meth:`chunks` yields it first): where the input ends within it, as an input of at most
        ``size`` lines does (every input under 10,000 lines by default), the lines read are all,
        and the file is not read a second time to count them; else :func:`count_lines` of the file
        (None for standard input: the bar counts up)."""
        if self._ahead is None and not self.at_end:
            self._ahead = self._raw(self.size)
        if self.at_end:
            return self.lines_read
        return count_lines(self.path) if self.path else None

    def skip(self, count: int) -> None:
        """Pass over the first ``count`` lines (those a resumed run has done), hashing them."""
        while self.lines_read < count and self._raw(min(self.size, count - self.lines_read)):
            pass

    def chunks(self) -> Iterator[tuple[int, list[str], str]]:
        """(the 0-based place of the chunk's first line, its lines, the SHA-256 of every line up to
        its last) for each chunk of ``size`` lines."""
        while raw := (self._ahead if self._ahead is not None else self._raw(self.size)):
            self._ahead = None
            start, data = self.lines_read - len(raw), b"".join(raw)
            try:
                lines = decode_lines(data, self.name, first_line=start + 1, check_nfc=False,  # close() warns
                                     encoding=self.encoding)  # refused where wide
            except DataError:
                offset = self.bytes_read - len(data)
                if start and self.encoding is None and (shown := later_wide_encoding(data, offset)):
                    raise misread_wide_error(self.name, shown, offset, start + 1) from None
                raise
            if bad := not_nfc_lines(lines, start + 1):
                self.first_not_nfc = self.first_not_nfc or bad[0]
                self.not_nfc += len(bad)
            yield start, lines, self.sha256.hexdigest()


def checkpoint_identity(paths) -> list[dict]:
    """What a record says of each checkpoint: its path, size, modification time and SHA-256 (a
    retrained ``best.pt`` at the same path is another model; the same file copied, unpacked or
    cloned again has another modification time only)."""
    out = []
    for path in paths:
        info = os.stat(path)
        out.append({"path": str(Path(path).resolve()), "bytes": info.st_size, "modified_ns": info.st_mtime_ns,
                    "sha256": sha256_file(Path(path))})
    return out


def checkpoint_differences(recorded: list, now: list) -> list[str]:
    """What differs between the checkpoints a record names and those given now: the list (paths,
    their number), or a checkpoint's size or content, each naming the file. A modification time
    alone is no difference where both sides have the file's SHA-256 and it is the same (``cp``,
    an unpacked archive or a fresh clone give the same bytes a new time); a record written before
    digests were kept is compared by its time, as it was."""
    if [c.get("path") for c in recorded] != [c.get("path") for c in now]:
        return differences({"checkpoints": recorded}, {"checkpoints": now})
    out = []
    for old, new in zip(recorded, now):
        if old.get("bytes") != new.get("bytes"):
            out.append(f"checkpoint {new['path']}: {old.get('bytes')} bytes there, {new['bytes']} now")
        elif old.get("sha256") and old["sha256"] != new["sha256"]:
            out.append(f"checkpoint {new['path']}: its content differs (SHA-256 {old['sha256'][:12]}... there, "
                       f"{new['sha256'][:12]}... now; modified {_when(old.get('modified_ns'))} there, "
                       f"{_when(new['modified_ns'])} now)")
        elif not old.get("sha256") and old.get("modified_ns") != new["modified_ns"]:
            out.append(f"checkpoint {new['path']}: modified {_when(old.get('modified_ns'))} there, "
                       f"{_when(new['modified_ns'])} now (the record, of an older cometnmt, keeps no SHA-256 to "
                       "compare its content by)")
    return out


def _when(modified_ns) -> str:
    """A modification time in nanoseconds as local ISO time, to the microsecond."""
    if not isinstance(modified_ns, int):
        return json.dumps(modified_ns)
    return datetime.fromtimestamp(modified_ns / 1e9).isoformat(sep=" ")


def differences(recorded: dict, now: dict, prefix: str = "") -> list[str]:
    """The keys whose values differ between two records, dotted (``decode.beam_size``), each with
    both values."""
    out = []
    for key in sorted(set(recorded) | set(now)):
        old, new = recorded.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += differences(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {json.dumps(old, ensure_ascii=False)} there, {json.dumps(new, ensure_ascii=False)} now")
    return out


class PartialOutput:
    """``-o FILE`` written chunk by chunk through ``FILE.partial`` and its record ``FILE.partial.json``
    (see the module's notes). ``identity``: what the output belongs to (input, checkpoints, decode
    settings), compared with the record on ``resume``."""

    def __init__(self, path: str, identity: dict) -> None:
        self.given = path
        self.target = output_path(path)  # written through a link
        self.partial = self.target.with_name(self.target.name + ".partial")
        self.record = self.target.with_name(self.target.name + ".partial.json")
        self.identity = identity
        self.lines_done = self.resumed_from = self.bytes_done = 0
        self.sha256 = hashlib.sha256().hexdigest()
        self.file = None

    def open(self, resume: bool) -> None:
        """Start a new partial output, or with ``resume`` continue the one recorded (none: start)."""
        found = self.partial.exists() or self.record.exists()
        if found and not resume and self._empty():  # a run stopped inside its first chunk: nothing to keep
            found = False
        if found and not resume:
            raise CometNMTError(f"{self.partial} holds the translations of an interrupted run into {self.given}: continue "
                                f"it with --resume, or remove {self.partial} and {self.record} to start over")
        if found:
            self._load()
        make_folder(self.target.parent)
        try:
            self.file = open(self.partial, "ab")
        except OSError as exc:
            raise DataError(f"{self.partial}: cannot write file ({exc.strerror or exc})") from None
        if not _lock(self.file):
            self.file.close()
            self.file = None
            raise CometNMTError(f"{self.partial}: another cometnmt translate is writing it (into {self.given})")
        self.file.truncate(self.bytes_done)  # a kill -9 inside an append left more than was recorded
        self._write_record()

    def _empty(self) -> bool:
        """Whether the partial output there holds no line (a record of none, an empty file)."""
        try:
            state = json.loads(self.record.read_text(encoding="utf-8"))
            return state["lines_done"] == 0 and (not self.partial.exists() or self.partial.stat().st_size == 0)
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _load(self) -> None:
        try:
            state = json.loads(self.record.read_text(encoding="utf-8"))
            assert state.get("format") == FORMAT
            lines, size, sha = int(state["lines_done"]), int(state["output_bytes"]), str(state["input_sha256"])
        except FileNotFoundError:
            raise CometNMTError(f"{self.partial}: no record of what it belongs to ({self.record} is missing); remove "
                                f"{self.partial} to start over") from None
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            raise CometNMTError(f"{self.record}: not a record of cometnmt translate's partial output (format {FORMAT}); "
                                f"remove it and {self.partial} to start over") from None
        belongs_to = dict(state.get("belongs_to", {}))
        if isinstance(belongs_to.get("decode"), dict):
            # a record older than a decode key (decode.precision) lacks it: the key's default is the search
            # every run made before the key existed, so the partial output resumes with the same settings
            from cometnmt.config import DecodeConfig, to_dict

            belongs_to["decode"] = {**to_dict(DecodeConfig()), **belongs_to["decode"]}
        differ = checkpoint_differences(belongs_to.pop("checkpoints", []), self.identity["checkpoints"])
        differ += differences(belongs_to, {k: v for k, v in self.identity.items() if k != "checkpoints"})
        if differ:
            raise CometNMTError(f"{self.record}: the partial output in {self.partial} belongs to another translation ("
                                f"{'; '.join(differ)}); continue it with the same input, checkpoints and search settings, "
                                f"or remove {self.partial} and {self.record} to start over")
        actual = self.partial.stat().st_size if self.partial.exists() else 0
        if actual < size:
            raise CometNMTError(f"{self.partial}: {actual} bytes, but {self.record} records {size} bytes of "
                                f"{lines} lines' translations; remove both to start over")
        self.lines_done = self.resumed_from = lines
        self.bytes_done, self.sha256 = size, sha

    def check_input(self, source: ChunkedInput) -> None:
        """Skip the lines a resumed run has done, which must be those translated before."""
        source.skip(self.lines_done)
        if source.lines_read < self.lines_done:
            raise DataError(f"{source.name}: {source.lines_read} lines, fewer than the {self.lines_done} whose "
                            f"translations {self.partial} holds; remove {self.partial} and {self.record} to start over")
        if source.sha256.hexdigest() != self.sha256:
            raise DataError(f"{source.name}: its first {self.lines_done} lines are not those whose translations "
                            f"{self.partial} holds (their SHA-256 differs: the input changed); give the same input, or "
                            f"remove {self.partial} and {self.record} to start over")

    def append(self, text: str, lines_done: int, sha256: str) -> None:
        """Add a finished chunk's output; the record follows it. Ctrl-C or SIGTERM waits until both
        are written."""
        data = text.encode("utf-8")
        with deferred():
            self.file.write(data)
            self.file.flush()
            os.fsync(self.file.fileno())
            self.lines_done, self.bytes_done, self.sha256 = lines_done, self.bytes_done + len(data), sha256
            self._write_record()

    def _write_record(self) -> None:
        state = {"format": FORMAT, "output": str(self.target), "lines_done": self.lines_done,
                 "output_bytes": self.bytes_done, "input_sha256": self.sha256, "belongs_to": self.identity}
        with atomic_write(self.record) as f:
            f.write(json.dumps(state, indent=1, ensure_ascii=False) + "\n")

    def finish(self) -> None:
        """Rename the finished output to FILE, with the permissions FILE had (a new one: 0644, as
        atomic_write gives), and remove the record."""
        self.file.close()
        try:
            with deferred():
                replace_keeping_mode(self.partial, self.target)
                self.record.unlink()
        except OSError as exc:
            raise DataError(f"{self.target}: cannot write file ({exc.strerror or exc}); the translations are in "
                            f"{self.partial}") from None
        _fsync_folder(self.target.parent)

    def abandon(self, keep: bool = True) -> bool:
        """After a failure or an interrupt: keep what is done (True), or, where nothing was done or
        it is not to be kept (``keep`` False: the input was misread), remove the partial output and
        its record as if the run had never started (False)."""
        if self.file is None:
            return False
        self.file.close()
        if self.lines_done and keep:
            return True
        for path in (self.partial, self.record):
            path.unlink(missing_ok=True)
        return False


def _lock(file) -> bool:
    """An exclusive lock on the open partial output, held while it is written (two runs into one
    FILE would interleave their chunks); True where there is no lock to take (Windows)."""
    try:
        import fcntl
    except ImportError:
        return True
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # a file system without locks
        return True
    return True
