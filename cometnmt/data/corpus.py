"""Reading line-aligned text files (plain or gzip, strict UTF-8) into parallel corpora."""

from __future__ import annotations

import codecs
import gzip
import logging
import select
import shlex
import sys
import unicodedata
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Literal

from cometnmt.atomic import atomic_write
from cometnmt.errors import DataError, MisreadInputError

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"


@contextmanager
def gzip_errors(name: str | Path) -> Iterator[None]:
    """Errors reading a gzip stream as a DataError naming the file."""
    try:
        yield
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise DataError(f"{name}: corrupt or truncated gzip file ({exc})") from None


def open_bytes(path: str | Path) -> BinaryIO:
    """``path`` opened for reading its bytes, gunzipped as they are read when it starts with the
    gzip magic bytes (read it inside :func:`gzip_errors`); errors opening it name the file."""
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    # peeked, not read and sought back: a pipe (`-i <(zcat a.gz)`, /dev/stdin) cannot seek
    if raw.peek(2)[:2] != GZIP_MAGIC:
        return raw
    return gzip.GzipFile(fileobj=raw, mode="rb")


def _read_bytes(path: Path) -> bytes:
    """Return the file's bytes, gunzipped when it starts with the gzip magic bytes."""
    try:
        with open_bytes(path) as f, gzip_errors(path):
            return f.read()
    except OSError as exc:  # not the gzip stream's errors: gzip_errors made them DataErrors
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from None


def _utf8_error(path: Path, data: bytes, exc: UnicodeDecodeError, first_line: int = 1,
                encoding: str | None = None, place: WidePlace | None = None) -> DataError:
    """Build a DataError naming the 1-based line (``data``'s first is ``first_line``) and character
    column of an undecodable byte, and the encoding ``data`` looks like (``encoding``: the one the
    input's start showed, :func:`wide_encoding`; ``place``: where ``data`` starts in it)."""
    pos = exc.start
    encoding = encoding or _other_encoding(data, pos, first_line)
    line_no, column = _line_and_column(data, pos, first_line, encoding, place)
    hint = "" if encoding is None else f"; it looks like {encoding}: convert it with {_iconv_command(path, encoding)}"
    return DataError(
        f"{path}:{line_no}: not valid UTF-8 (byte 0x{data[pos]:02x} at column {column}); "
        f"the file must be UTF-8 encoded text{hint}"
    )


def _line_and_column(data: bytes, pos: int, first_line: int = 1, encoding: str | None = None,
                     place: WidePlace | None = None) -> tuple[int, int]:
    """The line (``data``'s first is ``first_line``) and 1-based character column of byte ``pos``:
    of ``encoding``'s characters where it is UTF-16 or UTF-32 with its byte order known (in an
    input's first piece, :func:`_wide_line_and_column`, or in any piece of one a splitter follows
    with ``place``, :class:`WidePlace`), else of UTF-8's."""
    if place is not None:
        wide = place.line_and_column(data, pos)
    else:
        wide = _wide_line_and_column(data, pos, encoding) if first_line == 1 and encoding else None
    if wide is not None:
        return wide
    line_start = data.rfind(b"\n", 0, pos) + 1
    line_no = data.count(b"\n", 0, pos) + first_line
    return line_no, len(data[line_start:pos].decode("utf-8", errors="replace")) + 1


def _wide_line_and_column(data: bytes, pos: int, encoding: str) -> tuple[int, int] | None:
    """The 1-based line and character column of byte ``pos`` of ``data``, an input from its start in
    ``encoding`` (iconv's name), counted in its code units: a 0x0a byte of UTF-16 or UTF-32 is not a
    line break where it is half of a character (U+4E0A is b"\\x0a\\x4e" in UTF-16LE), and a CJK
    file of one line was named at its line 2 or 3. None where ``encoding`` is not UTF-16 or UTF-32
    or its byte order is unknown ("UTF-16" without the byte order mark)."""
    if not encoding.startswith(("UTF-16", "UTF-32")):
        return None
    unit, order = _code_unit(encoding), encoding[6:]
    boms = _byte_order_marks(unit)
    skip = 0
    if not order:  # named by its byte order mark: the mark says which
        order = next((name for name, bom in boms.items() if data.startswith(bom)), "")
        skip = unit if order else 0
    if order not in boms:
        return None
    text = data[skip:max(skip, pos - pos % unit)].decode(f"utf-{unit * 8}-{order.lower()}", errors="replace")
    return text.count("\n") + 1, len(text) - (text.rfind("\n") + 1) + 1


def _byte_order_marks(unit: int) -> dict[str, bytes]:
    """UTF-16's (``unit`` 2 bytes) or UTF-32's (4) byte order marks, by the byte order they name."""
    return {"LE": b"\xff\xfe" + b"\0" * (unit - 2), "BE": b"\0" * (unit - 2) + b"\xfe\xff"}


def _nul_error(path: Path, data: bytes, first_line: int = 1, encoding: str | None = None,
               place: WidePlace | None = None) -> DataError:
    """Build a DataError for ``data`` holding a NUL byte, valid UTF-8 all the same: UTF-16 without a
    byte order mark, of ASCII ("a\\0b\\0") or of Cyrillic (U+0410-U+044F are the bytes 0x10-0x4f
    beside 0x04), is valid UTF-8 and was read as lines full of U+0000, which no text holds. It names
    the line and column of the first and, where the bytes from there look like UTF-16
    (:func:`_looks_like_utf16`), the byte order (:func:`_utf16_order`) and the iconv command
    converting the file; a stray NUL in UTF-8 text is named as that, with a command removing it.
    The byte order is judged from a character's start: an offset a multiple of four (UTF-32's and
    UTF-16's characters start there in a file) or, in a later piece of an input (``first_line`` > 1),
    past the rest of the line break before it (:func:`_line_break_rest`). ``encoding``: the input's,
    judged from its start by a reader that splits it (:func:`wide_encoding`), named as it is; ``place``:
    where ``data`` starts in it (:class:`WidePlace`), whose first NUL byte is named past the rest of
    a character begun in the piece before (b"\\0Two" after UTF-16LE's b"\\n": the "T"'s, not the
    line break's that ends the line before)."""
    pos = data.index(b"\0")
    if place is not None:
        pos = max(pos, data.find(b"\0", place.rest()))  # -1 where only the rest holds one

    def where(wide: str | None) -> str:  # the line and column counted in ``wide``'s characters where it is decided
        line_no, column = _line_and_column(data, pos, first_line, wide, place)
        return f"{path}:{line_no}: a NUL character (byte 0x00 at column {column}), which never belongs in text"

    if encoding is not None:
        return DataError(f"{where(encoding)}: the file is probably {_without_bom(encoding)}, read as UTF-8; "
                         f"convert it with {_iconv_command(path, encoding)}")
    start = pos - pos % 2  # from an even offset, as the file's UTF-16 characters start
    sample = data[start:start + 4096]
    shaped = _utf16_shape(data) if first_line == 1 else None
    encoding = shaped or _byte_order(data, pos - pos % 4, first_line)
    if not _looks_like_utf16(sample) and not shaped:
        target = "FILE" if str(path).startswith("<") else shlex.quote(str(path))
        return DataError(f"{where(None)}: one NUL byte alone is a stray byte in UTF-8 text (remove it, e.g. tr -d '\\000' "
                         f"< {target} > {target}.clean) or, if the file is {encoding} without a byte order mark "
                         f"(check with: file {target}), convert it with {_iconv_command(path, encoding)}")
    return DataError(f"{where(encoding)}: the file is probably {encoding} without a byte order mark, read as UTF-8; "
                     f"convert it with {_iconv_command(path, encoding)}")


def _without_bom(encoding: str) -> str:
    """``encoding`` as an error names it: "UTF-16LE without a byte order mark"; "UTF-16" (a byte
    order mark names the order) alone."""
    return f"{encoding} without a byte order mark" if encoding.endswith(("LE", "BE")) else encoding


WIDE_SAMPLE = 4096  # bytes of an input's start that wide_encoding judges


def wide_encoding(head: bytes) -> str | None:
    """The UTF-16 or UTF-32 encoding (iconv's name) of an input whose first bytes are ``head``, or
    None: UTF-8 as far as ``head`` goes, another encoding, stray NUL bytes, or too little to tell
    (each piece's own error says which). A reader that splits its input after each b"\\n" before decoding
    (``translate --interactive``'s lines, ``translate``'s chunks) judges it once from the input's
    start and names it for every piece: split there, UTF-16 and UTF-32 are cut inside characters
    (U+4E0A in UTF-16LE is b"\\x0a\\x4e"; b"\\0Two" after UTF-16LE's b"\\n\\0" is also
    UTF-16BE's ASCII), so a piece alone may show another byte order, or none."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    sample = head[:WIDE_SAMPLE]
    nul = sample.find(b"\0")
    if nul >= 0 and not _looks_like_utf16(sample[nul - nul % 2:]):
        return None  # one NUL byte alone: perhaps a stray byte in UTF-8 text
    if nul < 0 and _decodes(sample, "utf-8"):
        return None
    return _clear_utf16_order(sample)  # not by where a few NULs stand: every piece is refused by it


def later_wide_encoding(piece: bytes, offset: int) -> str | None:
    """The UTF-16 or UTF-32 encoding (iconv's name) that ``piece``, bytes ``offset`` on of an input
    split after each 0x0a byte, shows where the input's start did not (:func:`wide_encoding` gave
    None: a pipe whose first line came alone, CJK text whose first piece is b"\\x0a", the first half
    of U+4E0A in UTF-16LE), or None. It is judged as an input's start is, from the piece's first
    whole code unit: cut after such a 0x0a, the piece opens with the character's other byte
    (b"\\x4e..."), and read from there UTF-16LE looked like UTF-16BE. A piece that is not UTF-8
    needs no more than to be clearly UTF-16 or UTF-32 (:func:`_clear_utf16_order`), as its own
    error would name it anyway: a single NUL byte in it (U+4E00 is b"\\0\\x4e") is no stray byte."""
    sample = piece[-offset % 4:][:WIDE_SAMPLE]  # UTF-32's units start there, and UTF-16's (the same parity)
    return wide_encoding(sample) if _decodes(sample, "utf-8") else _clear_utf16_order(sample)


def misread_wide_error(name: str | Path, encoding: str, offset: int, line: int) -> MisreadInputError:
    """The error for an input split after each 0x0a byte and read as UTF-8 up to byte ``offset``,
    where a later piece, its line ``line`` as split, showed ``encoding`` (:func:`later_wide_encoding`):
    the lines before were cut inside its characters too and may have been translated as misread
    text, and its line numbers count 0x0a bytes, not its lines."""
    first = "byte" if offset == 1 else f"{offset} bytes"
    return MisreadInputError(f"{name}:{line}: the input is probably {_without_bom(encoding)}, which its first "
                             f"{first} did not show: read as UTF-8, it was split into lines at its 0x0a bytes, inside "
                             f"its characters, so this line's number counts those and the lines before it may have "
                             f"been translated from misread text; convert it with {_iconv_command(name, encoding)}")


def unit_rest(encoding: str, offset: int) -> int:
    """How many bytes from ``offset`` of an input in ``encoding`` (UTF-16 or UTF-32, iconv's name)
    finish a code unit begun before it: the rest of a line break cut after its 0x0a byte (one NUL
    of UTF-16LE's b"\\n\\0", three of UTF-32LE's), or of a character holding a 0x0a byte."""
    return -offset % _code_unit(encoding)


def _code_unit(encoding: str) -> int:
    """The bytes of a code unit of ``encoding``, UTF-16 or UTF-32 (iconv's name): 2 or 4."""
    return int(encoding[4:6]) // 8


def ready_bytes(stream: BinaryIO) -> bytes:
    """Up to WIDE_SAMPLE bytes that ``stream`` will read next, neither consumed nor waited for: a
    file's (plain or gzip) next bytes, what a pipe already holds; b"" where more must be waited
    for (a terminal, a pipe whose writer waits for an answer, as --interactive's may) or the stream
    cannot tell (no peek, no file descriptor, select on Windows)."""
    try:
        if not select.select([stream], [], [], 0)[0]:
            return b""
        return stream.peek(WIDE_SAMPLE)[:WIDE_SAMPLE]
    except (AttributeError, OSError, ValueError):
        return b""


class WidePlace:
    """Where the next piece of a UTF-16 or UTF-32 input split after each 0x0a byte starts (as
    ``--interactive``'s lines split theirs before decoding, refusing each; ``translate``'s chunks
    refuse such an input at the first, where no place is needed), in the input's own lines and
    characters. The splitter's count of pieces is one of 0x0a bytes, which
    stand inside characters too (U+0A0A is b"\\x0a\\x0a" in UTF-16, U+010A b"\\x0a\\x01" in
    UTF-16LE) and are one byte of a 2- or 4-byte line break: an error in a later piece named a
    line far past the file's end, and a column of UTF-8's characters. The splitter passes each
    piece it is done with to :meth:`advance`, which decodes it in ``encoding`` (iconv's name, as
    :func:`wide_encoding` judged it from the input's start), and gives the place to the next
    piece's reader (decode_lines' ``place``). UTF-8 input is split without one: nothing is decoded
    twice."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.unit = _code_unit(encoding)
        self.order = encoding[6:]  # "" until the byte order mark opening the input names it
        self.decoder: codecs.IncrementalDecoder | None = None  # made at the first piece, the order known
        self.offset = 0  # bytes of the input before the next piece
        self.line, self.column = 1, 1  # of the next character not yet decoded
        self.pending = b""  # the start of a character the next piece finishes (the decoder's buffer)

    def advance(self, piece: bytes) -> None:
        """Move past ``piece``, the input's next bytes."""
        data = piece
        if self.decoder is None:
            if not self.order:  # "UTF-16": the mark opens the input (wide_encoding) and is no character
                marks = _byte_order_marks(self.unit).items()
                self.order = next((order for order, mark in marks if piece.startswith(mark)), "")
                data = piece[self.unit:] if self.order else piece
                self.order = self.order or "LE"  # no mark after all: the order Windows writes
            self.decoder = codecs.getincrementaldecoder(f"utf-{self.unit * 8}-{self.order.lower()}")(errors="replace")
        text = self.decoder.decode(data)
        self.pending = self.decoder.getstate()[0]
        self.offset += len(piece)
        breaks = text.count("\n")
        self.line += breaks
        self.column = len(text) - text.rfind("\n") if breaks else self.column + len(text)

    def rest(self) -> int:
        """How many of the next piece's first bytes finish a code unit the piece before began
        (:func:`unit_rest`)."""
        return unit_rest(self.encoding, self.offset)

    def line_and_column(self, data: bytes, pos: int) -> tuple[int, int] | None:
        """The line and 1-based character column of byte ``pos`` of ``data``, the next piece (as
        :func:`_wide_line_and_column` counts an input's first piece, which this is at offset 0);
        None where the byte order is not known (:func:`_wide_line_and_column`)."""
        if not self.offset:
            return _wide_line_and_column(data, pos, self.encoding)
        # the pending bytes start a character: from there the code units are aligned as in the input
        found = _wide_line_and_column(self.pending + data, len(self.pending) + pos, f"UTF-{self.unit * 8}{self.order}")
        if found is None:
            return None
        lines, column = found
        return self.line + lines - 1, column if lines > 1 else self.column + column - 1

    def piece_line(self, data: bytes) -> int:
        """The line the next piece, ``data``, starts on, as an error about the whole piece names it:
        that of its first byte past the :meth:`rest` (the rest of a line break belongs to the line
        before), or of its last where it is no more than the rest."""
        found = self.line_and_column(data, min(self.rest(), len(data) - 1)) if data else None
        return found[0] if found else self.line


def _line_break_rest(data: bytes, first_line: int) -> int:
    """How many of ``data``'s first bytes are the rest of the line break before it: in a later
    piece of an input split after each b"\\n" (``first_line`` > 1: ``translate --interactive``'s
    lines, ``translate``'s chunks) one NUL byte left by UTF-16LE's b"\\n\\0" or three by UTF-32LE's
    b"\\n\\0\\0\\0"; 0 otherwise (the first piece, or no such NULs). Read from its first byte such
    a piece of UTF-16LE looked like UTF-16BE. Big-endian text whose line opens with a character
    below U+0100 starts with such NULs too, in the very same bytes (b"\\0T\\0w\\0o\\0\\n" is either):
    those are taken as little-endian, the order Windows writes."""
    if first_line <= 1:
        return 0
    lead = len(data) - len(data.lstrip(b"\0"))
    return lead if lead in (1, 3) else 0


def _byte_order(data: bytes, start: int, first_line: int = 1) -> str:
    """The UTF-16 or UTF-32 byte order (:func:`_utf16_order`) of ``data`` (holding a NUL byte) read
    from ``start`` or, in a piece that opens with the rest of a line break (:func:`_line_break_rest`),
    from past it: the little-endian order that left it when the rest tells nothing (a piece of the
    NULs alone, an empty line)."""
    rest = _line_break_rest(data, first_line)
    if rest:
        return _utf16_order(data[rest:rest + 4096]) or ("UTF-16LE" if rest == 1 else "UTF-32LE")
    return _utf16_order(data[start:start + 4096]) or "UTF-16LE"  # None only without a NUL byte from start


def _looks_like_utf16(sample: bytes | str) -> bool:
    """Whether ``sample`` (from a NUL byte or character on) holds NUL bytes as UTF-16 text does: its
    line breaks carry one (b"\\n\\0" in UTF-16LE, b"\\0\\n" in UTF-16BE), and of Latin, Greek or
    Cyrillic text every space does, so a sentence of three words has two; a single NUL and no such
    line break may be a stray byte in UTF-8 text as well."""
    nul, newline = ("\0", "\n") if isinstance(sample, str) else (b"\0", b"\n")
    return nul + newline in sample or newline + nul in sample or sample.count(nul) >= 2


def _utf16_shape(data: bytes) -> str | None:
    """"UTF-16LE" or "UTF-16BE" where ``data``, an input's first piece (all of a file too small for
    :func:`_looks_like_utf16` to judge: one character, one space " \\0"), is shaped as UTF-16 of
    characters below U+0100: an even number of bytes, NUL every other byte (the second: LE) and no
    other; None otherwise. A stray NUL in UTF-8 text stands beside text, not every other byte of it."""
    even, odd = data[0::2], data[1::2]
    if not data or len(data) % 2:
        return None
    if odd.count(0) == len(odd) and 0 not in even:
        return "UTF-16LE"
    if even.count(0) == len(even) and 0 not in odd:
        return "UTF-16BE"
    return None


def nul_note(text: str) -> str:
    """"" for ``text`` without a NUL character (U+0000); else what an error naming a sentence given
    as a string (the Translator's, a served request's) says of the first: where it is and what it
    most likely means, UTF-16 or UTF-32 decoded as UTF-8 where NULs are as common as they make them
    (:func:`_looks_like_utf16`, or the whole string NUL every other byte: :func:`_utf16_shape`), as
    :func:`decode_lines` refuses it in a file, with the byte order its bytes show (the codec and
    iconv command: UTF-16BE's "\\0A\\0 \\0d" was told to decode as 'utf-16-le')."""
    pos = text.find("\0")
    if pos < 0:
        return ""
    where = f"holds a NUL character (U+0000) at column {pos + 1}, which never belongs in text"
    data = text.encode("utf-8", errors="surrogatepass")  # the bytes that were decoded as UTF-8
    shaped = _utf16_shape(data)
    if not _looks_like_utf16(text) and not shaped:  # one NUL tells no byte order: Windows' is named
        return (f"{where}: a stray byte, or UTF-16 decoded as UTF-8 (remove it, or decode the text as UTF-16, "
                "e.g. open(path, encoding='utf-16-le'))")
    byte = data.index(b"\0")
    encoding = shaped or _byte_order(data, byte - byte % 4)
    family, codec = encoding[:6], f"{encoding[:6].lower()}-{encoding[6:].lower()}"
    return (f"{where}: {family} decoded as UTF-8? (decode it as {family}, e.g. open(path, encoding='{codec}'), "
            f"or convert the file with iconv -f {encoding} -t UTF-8)")


def _iconv_command(path: Path, encoding: str) -> str:
    """The shell command converting ``path`` from ``encoding`` to UTF-8 beside it (FILE for standard
    input): a gzip file through gzip -dc and back into gzip, as iconv alone converted the compressed
    bytes (into mojibake, without an error, from WINDOWS-1252); gzip -dc, not zcat (macOS's reads .Z).
    Paths are quoted for the shell."""
    if str(path).startswith("<"):  # <stdin>
        return f"iconv -f {encoding} -t UTF-8 FILE > FILE.utf8"
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == GZIP_MAGIC
    except OSError:
        gzipped = False
    quoted = shlex.quote(str(path))  # a name with spaces (Windows' "My Documents") stays one argument
    if not gzipped:
        return f"iconv -f {encoding} -t UTF-8 {quoted} > {shlex.quote(f'{path}.utf8')}"
    out = str(path)[:-3] if str(path).endswith(".gz") else str(path)
    return f"gzip -dc {quoted} | iconv -f {encoding} -t UTF-8 | gzip > {shlex.quote(f'{out}.utf8.gz')}"


def _other_encoding(data: bytes, pos: int, first_line: int = 1) -> str | None:
    """The iconv name of the encoding undecodable ``data`` (bad byte at ``pos``) looks like, or
    None: UTF-32 or UTF-16 by their byte order mark, UTF-32LE/BE by NUL bytes three of every four
    (:func:`_utf32_order`), UTF-16BE/LE by NUL bytes every other byte (ASCII text in UTF-16), by
    decoding into text (:func:`_utf16_without_bom`) or, failing those, by where its NUL bytes
    stand (:func:`_utf16_by_nul_offsets`: a NUL byte is no text), and WINDOWS-1252
    (Latin-1 and its superset) by a lone high byte between ASCII bytes ("M\\xe4dchen"), where UTF-8
    puts a high byte before other high bytes (and most high bytes lone, not CJK text). A later
    piece of an input (``first_line`` > 1) is judged past the rest of the line break before it
    (:func:`_line_break_rest`)."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    rest = _line_break_rest(data, first_line)
    sample = data[rest:rest + 4096]
    utf16 = _utf16_order(sample)
    if utf16 is not None:
        return utf16
    if 0 not in sample and _latin_run(data, pos) and _mostly_lone_high_bytes(sample):
        return "WINDOWS-1252"
    return None


def other_encoding(data: bytes, pos: int) -> str | None:
    """The iconv name of the encoding ``data``, not valid UTF-8 at byte ``pos``, looks like, or None
    (:func:`_other_encoding`): for bytes that are no file, a request's body in serve."""
    return _other_encoding(data, pos)


def _utf16_order(sample: bytes) -> str | None:
    """"UTF-16LE" or "UTF-16BE" where ``sample`` (from an even offset) looks like UTF-16 without a
    byte order mark, None where not: by NUL bytes every other byte (ASCII text), by decoding into
    text (:func:`_utf16_without_bom`) or, failing those, by where its NUL bytes stand. UTF-32 without
    one ("A\\0\\0\\0": NULs in UTF-16's places too) is told first: "UTF-32LE" or "UTF-32BE" where
    ``sample`` (from an offset a multiple of four) looks like it (:func:`_utf32_order`)."""
    return _clear_utf16_order(sample) or _utf16_by_nul_offsets(sample)


def _clear_utf16_order(sample: bytes) -> str | None:
    """:func:`_utf16_order` but for its last guess (where the NUL bytes stand): the byte order
    where ``sample`` is clearly UTF-32 or UTF-16, else None."""
    utf32 = _utf32_order(sample)
    if utf32 is not None:
        return utf32
    even, odd = sample[0::2], sample[1::2]  # ASCII in UTF-16BE: NUL first; in UTF-16LE: NUL second
    if len(sample) >= 4 and even.count(0) >= 0.9 * len(even) and odd.count(0) <= 0.1 * len(odd):
        return "UTF-16BE"
    if len(sample) >= 4 and odd.count(0) >= 0.9 * len(odd) and even.count(0) <= 0.1 * len(even):
        return "UTF-16LE"
    return _utf16_without_bom(sample)


def _utf32_order(sample: bytes) -> str | None:
    """"UTF-32LE" or "UTF-32BE" where at least 90% of ``sample``'s 4-byte characters (from its
    start) hold NUL in their two high bytes and at most 10% in their two low ones, None where not:
    of every four bytes of ASCII text three are NUL ("A\\0\\0\\0" little-endian, "\\0\\0\\0A" big),
    of any text below U+10000 (Cyrillic, Greek, CJK) two, the high ones. UTF-16 never has two NULs
    as one character (U+0000, no text), so it is not taken for UTF-32."""
    chars = [sample[i:i + 4] for i in range(0, len(sample) - 3, 4)]
    if not chars:
        return None
    low_first = sum(c[2:] == b"\0\0" for c in chars)  # little-endian: the low bytes first, NULs last
    high_first = sum(c[:2] == b"\0\0" for c in chars)
    if low_first >= 0.9 * len(chars) and high_first <= 0.1 * len(chars):
        return "UTF-32LE"
    if high_first >= 0.9 * len(chars) and low_first <= 0.1 * len(chars):
        return "UTF-32BE"
    return None


def _utf16_by_nul_offsets(sample: bytes) -> str | None:
    """"UTF-16LE" where most of ``sample``'s NUL bytes stand at odd offsets (the high byte of a
    character below U+0100 comes second), "UTF-16BE" where most stand at even ones, None without
    NUL bytes: the guess for text the other tests miss (Greek or Cyrillic with a few spaces, say)."""
    odd, even = sample[1::2].count(0), sample[0::2].count(0)
    if not odd and not even:
        return None
    return "UTF-16LE" if odd >= even else "UTF-16BE"


def _high_runs(data: bytes) -> list[bytes]:
    """``data``'s runs of high bytes (0x80 and up), each between ASCII bytes or an end."""
    return [run for run in bytes(byte if byte >= 0x80 else 0x20 for byte in data).split(b" ") if run]


def _latin_run(data: bytes, pos: int) -> bool:
    """True when the high bytes from ``pos`` on read as WINDOWS-1252 letters and an ASCII byte
    follows them: one high byte, or two letters (0xc0-0xff but × and ÷) as "Gr\\xf6\\xdfe" (Größe);
    a UTF-8 file cut inside a character ends on its high bytes, followed by nothing."""
    end = pos
    while end < len(data) and data[end] >= 0x80:
        end += 1
    return end < len(data) and _is_latin_run(data[pos:end])


def _is_latin_run(run: bytes) -> bool:
    """One high byte, or two WINDOWS-1252 letters (0xc0-0xff but × and ÷: "\\xf6\\xdf", öß)."""
    return len(run) == 1 or (len(run) == 2 and all(byte >= 0xc0 and byte not in (0xd7, 0xf7) for byte in run))


def _mostly_lone_high_bytes(sample: bytes) -> bool:
    """True when at least 3/4 of ``sample``'s high bytes stand between ASCII bytes alone or two
    letters together (:func:`_is_latin_run`: "Größe"), as the accented letters of Latin text do in
    WINDOWS-1252; CJK text, in UTF-16 or a legacy encoding, puts most in longer runs of high bytes,
    or pairs that are no two Latin letters."""
    runs = _high_runs(sample)
    latin = sum(len(run) for run in runs if _is_latin_run(run))
    return latin >= 0.75 * sum(len(run) for run in runs)


def _utf16_without_bom(sample: bytes) -> str | None:
    """"UTF-16LE" or "UTF-16BE" for UTF-16 text without a byte order mark that is not mostly ASCII
    (Chinese, Japanese: few NUL bytes, so :func:`_other_encoding`'s NUL count missed it): the one
    byte order that decodes ``sample`` into lines ("\\n": a NUL byte beside 0x0a) of at least 90%
    printable characters, or, in one line, into at least 90% CJK characters. Without NUL bytes
    (UTF-16 text with no line break and no ASCII) the bytes must not read as a legacy CJK
    encoding too: one line of GBK or Shift-JIS reads as CJK UTF-16 as well. None otherwise."""
    with_nul = 0 in sample
    if not with_nul and (b"\n" in sample or any(_decodes(sample, legacy) for legacy in LEGACY_CJK)):
        return None
    found = []
    for order in ("LE", "BE"):
        try:  # incremental: a character cut at the sample's end is no error
            text = codecs.getincrementaldecoder(f"utf-16-{order.lower()}")().decode(sample, final=False)
        except UnicodeDecodeError:
            continue
        if with_nul and "\n" in text:
            good = sum(c.isprintable() or c.isspace() for c in text)
        else:
            good = sum(_is_cjk(c) for c in text)
        if text and good >= 0.9 * len(text):
            found.append(f"UTF-16{order}")
    return found[0] if len(found) == 1 else None


LEGACY_CJK = ("gbk", "big5", "shift_jis", "euc-kr")


def _decodes(data: bytes, encoding: str) -> bool:
    """True when ``data`` decodes in ``encoding`` (a character cut at its end is no error)."""
    try:
        codecs.getincrementaldecoder(encoding)().decode(data, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _is_cjk(char: str) -> bool:
    """True for a CJK ideograph, kana, CJK punctuation or a fullwidth form."""
    return "\u3000" <= char <= "\u9fff" or "\uf900" <= char <= "\ufaff" or "\uff00" <= char <= "\uffef"


def _split_lines(text: str) -> list[str]:
    """Split on "\\n" only (not str.splitlines, which also splits on U+2028, \\x1c, ...) and drop "\\r"."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """Read a plain or gzip (detected by magic bytes) strict-UTF-8 file into lines.

    Only the line terminator ("\\n" or "\\r\\n") is removed; other whitespace is kept.
    Raises DataError naming the file (and line for decoding errors).
    """
    path = Path(path)
    return decode_lines(_read_bytes(path), path)


def decode_lines(data: bytes, name: str | Path, first_line: int = 1, check_nfc: bool = True,
                 encoding: str | None = None, place: WidePlace | None = None) -> list[str]:
    """Strict-UTF-8 ``data`` (a file's bytes, or standard input's) into lines as ``read_lines``;
    an undecodable byte, or a NUL character (UTF-16 read as UTF-8: :func:`_nul_error`), is a
    DataError naming ``name``, the line and the column, and the warning
    about text not in NFC names its first such line: lines counted from ``first_line`` (a later
    piece of an input read piece by piece, as ``translate --interactive`` reads each line). Byte order marks
    (U+FEFF, as Windows editors write) are not text: those that open a line are dropped, however
    many, which covers a file saved twice with one and files concatenated with theirs. Unicode
    deprecates U+FEFF as a zero-width no-break space (U+2060 is that), so no text is lost.
    ``check_nfc`` False: no warning of text not in NFC (a reader of pieces warning once, for all).
    ``encoding``: UTF-16 or UTF-32, as a reader that splits its input judged it from the input's
    start (:func:`wide_encoding`) or a later piece (:func:`later_wide_encoding`): every piece of such an input is refused naming it, one that
    decodes as UTF-8 (a character cut at its 0x0a byte) too. ``place``: where ``data`` starts in
    such an input (:class:`WidePlace`), whose lines and columns the errors count, not
    ``first_line`` (the splitter's count of 0x0a bytes)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _utf8_error(name, data, exc, first_line, encoding, place) from None
    if "\0" in text:  # UTF-8 encodes nothing else with a 0x00 byte
        raise _nul_error(name, data, first_line, encoding, place)
    if encoding is not None:
        line = first_line if place is None else place.piece_line(data)
        raise DataError(f"{name}:{line}: the input is probably {_without_bom(encoding)} (judged from its "
                        f"bytes), read as UTF-8 and split inside its characters; convert it with "
                        f"{_iconv_command(name, encoding)}")
    lines = _split_lines(text)
    if "\ufeff" in text:
        lines = drop_byte_order_marks(lines)
    if check_nfc and not unicodedata.is_normalized("NFC", text):
        warn_not_nfc(lines, name, first_line)
    return lines


def drop_byte_order_marks(lines: list[str]) -> list[str]:
    """``lines`` without the byte order marks (U+FEFF) that open one, however many: not text (see
    :func:`decode_lines`), for the file readers, Translator's sentences and ``score``'s lines alike."""
    return [line.lstrip("\ufeff") for line in lines]


def warn_not_nfc(lines: list[str], name: str | Path, first_line: int = 1, unit: str = "line") -> None:
    """Text with decomposed accents (NFD: "e" + U+0301 where Multi30k and most text write "é"),
    as macOS and some tools write it, was read without a word: its words are not the precomposed
    words a vocabulary knows (validation <unk> 30.8% -> 34.0% in a run on NFD training text),
    spaCy splits them otherwise, and BLEU counts them as different. Warn once per read, naming
    the first such line; the text is kept as it is (sacreBLEU scores it as written too). ``unit``
    "sentence": ``lines`` are sentences given to the Python API (Translator), ``name`` its argument."""
    bad = not_nfc_lines(lines, first_line)
    if bad:
        warn_not_nfc_count(name, len(bad), bad[0], unit)


def not_nfc_lines(lines: list[str], first_line: int = 1) -> list[int]:
    """The numbers of the ``lines`` not in Unicode NFC, counted from ``first_line``."""
    return [i for i, line in enumerate(lines, first_line) if not unicodedata.is_normalized("NFC", line)]


def warn_not_nfc_count(name: str | Path, count: int, first: int, unit: str = "line") -> None:
    """:func:`warn_not_nfc`'s warning of ``count`` lines (``unit``s) not in NFC, the first ``first``."""
    remedy = ("unicodedata.normalize('NFC', text)" if unit == "sentence" else
              "python -c \"import sys, unicodedata; sys.stdout.write(unicodedata.normalize('NFC', "
              "sys.stdin.read()))\" < IN > OUT")
    logger.warning("%s: %d %s%s not in Unicode NFC (first: %s %d), e.g. accents as separate combining "
                   "characters; they do not match the same words written precomposed: normalise the text, e.g. %s",
                   name, count, unit, " is" if count == 1 else "s are", unit, first, remedy)


def read_stdin_lines() -> list[str]:
    """Standard input's lines, read and checked as ``read_lines`` reads a file, but not gunzipped:
    gzip data there (``translate < src.de.gz``) is named as such, where its second byte was
    "not valid UTF-8 (byte 0x8b at column 2)", as if the text were in another encoding."""
    data = sys.stdin.buffer.read()
    if data.startswith(GZIP_MAGIC):  # 0x8b cannot follow 0x1f in UTF-8: never text
        raise DataError("<stdin>: gzip-compressed data; standard input is read as plain UTF-8 text: give a gzip file "
                        "by name (translate -i FILE) or through zcat")
    return decode_lines(data, "<stdin>")


def write_text_file(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (``atomic_write``); missing parent
    folders are created. A DataError names the path when it cannot be written (a folder, no
    permission, a full disk)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a file name to write")
    try:
        with atomic_write(path) as f:
            f.write(text)
    except OSError as exc:
        raise DataError(f"{path}: cannot write file ({exc.strerror or exc})") from None


@dataclass
class ParallelCorpus:
    """Aligned source/target sentences read from two files."""

    src: list[str]
    tgt: list[str]
    src_path: str
    tgt_path: str
    skipped: int  # line pairs skipped because a side was empty or whitespace-only
    not_read: int = 0  # line pairs past ``max_pairs``, left unread

    def __len__(self) -> int:
        return len(self.src)


def _is_blank(line: str) -> bool:
    """True for an empty or whitespace-only line."""
    return not line.strip()


def blank_tail(lines: list[str], line_no: int | None = None) -> str:
    """A note for an error about ``lines``: how many empty lines end the file (an editor's or a
    script's blank line after the last sentence, which made a count mismatch of "400 lines but
    401" or an "empty line" at its end look like misaligned text), "" where none do or where
    ``line_no`` (1-based) is an empty line before them."""
    n = next((i for i, line in enumerate(reversed(lines)) if not _is_blank(line)), len(lines))
    if not n or n == len(lines) or (line_no is not None and line_no <= len(lines) - n):  # none, or no sentence
        return ""
    last = "its last line is empty" if n == 1 else f"its last {n} lines are empty"
    return f"{last}, after the last sentence: remove {'it' if n == 1 else 'them'}"


def _paren(note: str) -> str:
    return f" ({note})" if note else ""


def read_parallel(
    src_path: str | Path,
    tgt_path: str | Path,
    *,
    empty: Literal["skip", "error"],
    max_pairs: int | None = None,
) -> ParallelCorpus:
    """Read two line-aligned files into a ParallelCorpus.

    ``empty="skip"`` drops a pair whose source or target line is empty/whitespace-only (counted in
    ``.skipped`` and logged once); ``empty="error"`` raises DataError naming file and line.
    ``max_pairs`` keeps only the first N pairs (after skipping); the line pairs after them are
    counted in ``.not_read``.
    """
    if empty not in ("skip", "error"):
        raise ValueError(f"empty must be 'skip' or 'error', not {empty!r}")
    if max_pairs is not None and max_pairs < 0:
        raise ValueError(f"max_pairs must be >= 0, not {max_pairs}")
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src_path} has {len(src_lines)} lines{_paren(blank_tail(src_lines))} but {tgt_path} has {len(tgt_lines)} "
            f"lines{_paren(blank_tail(tgt_lines))}; "
            "parallel files must have the same number of lines"
        )
    src, tgt, skipped, first_skipped, not_read = [], [], 0, 0, 0
    for line_no, (s, t) in enumerate(zip(src_lines, tgt_lines), start=1):
        if max_pairs is not None and len(src) >= max_pairs:
            not_read = len(src_lines) - line_no + 1
            break
        if _is_blank(s) or _is_blank(t):
            if empty == "error":
                bad_path, bad_lines = (src_path, src_lines) if _is_blank(s) else (tgt_path, tgt_lines)
                tail = blank_tail(bad_lines, line_no)
                raise DataError(f"{bad_path}:{line_no}: empty line (empty or whitespace-only{'; ' + tail if tail else ''})")
            skipped += 1
            first_skipped = first_skipped or line_no
            continue
        src.append(s)
        tgt.append(t)
    if skipped:
        logger.warning(
            "%s / %s: skipped %d line pair(s) empty or whitespace-only on either side (first at line %d)",
            src_path, tgt_path, skipped, first_skipped,
        )
    return ParallelCorpus(src, tgt, str(src_path), str(tgt_path), skipped, not_read)
