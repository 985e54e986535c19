"""Tests of the data pipeline: reading, tokenizers, vocabulary, batching (uses the shared Multi30k copy)."""

from __future__ import annotations

import gzip
import logging
import os
import re
import statistics
import sys
from pathlib import Path

import pytest
import torch

from cometnmt.data.corpus import nul_note
from cometnmt.data import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    SentencePieceTokenizer,
    SpacyTokenizer,
    Vocab,
    build_tokenizer,
    collate,
    make_batches,
    padding_fraction,
    read_lines,
    read_parallel,
    tokenizer_from_state,
)
from cometnmt.data.tokenizers import OTHER_SPACES, metric_tokenizer
from cometnmt.errors import DataError

logger = logging.getLogger(__name__)


def multi30k_dir() -> Path:
    """The shared Multi30k copy: $COMETNMT_MULTI30K_DIR, else ../shared/data/multi30k beside the repo."""
    env = os.environ.get("COMETNMT_MULTI30K_DIR")
    root = Path(env) if env else Path(__file__).parents[1] / ".." / "shared" / "data" / "multi30k"
    if not root.is_dir():
        pytest.skip(f"shared Multi30k copy not found at {root} (set COMETNMT_MULTI30K_DIR)")
    return root


@pytest.fixture(scope="module")
def train_pairs() -> tuple[list[str], list[str]]:
    root = multi30k_dir()
    corpus = read_parallel(root / "train.de.gz", root / "train.en.gz", empty="skip")
    return corpus.src, corpus.tgt


# --- reading -------------------------------------------------------------------------------------


def test_gzip_and_plain_read_the_same(tmp_path: Path) -> None:
    text = "Ein Hund läuft.\r\nZwei  Katzen \n\nLetzte Zeile ohne Umbruch"
    plain = tmp_path / "a.txt.gz"  # misleading extension: detection is by magic bytes
    plain.write_bytes(text.encode("utf-8"))
    zipped = tmp_path / "b.txt"
    zipped.write_bytes(gzip.compress(text.encode("utf-8")))
    expected = ["Ein Hund läuft.", "Zwei  Katzen ", "", "Letzte Zeile ohne Umbruch"]
    assert read_lines(plain) == expected
    assert read_lines(zipped) == expected


def test_only_newline_splits_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_bytes("a\u2028b\x1cc\n".encode("utf-8"))
    assert read_lines(path) == ["a\u2028b\x1cc"]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert read_lines(empty) == []


def test_text_not_in_nfc_is_read_as_it_is_with_a_warning(tmp_path: Path, caplog) -> None:
    """Decomposed accents (NFD) were read without a word, while their words do not match the
    precomposed ones a vocabulary knows. Now a warning names the file, how many lines and the first."""
    import unicodedata

    lines = ["Ein Hund läuft.", "Ein Café.", "Zwei Männer."]
    nfd = tmp_path / "nfd.de"
    nfd.write_text("\n".join([lines[0]] + [unicodedata.normalize("NFD", t) for t in lines[1:]]) + "\n", encoding="utf-8")
    nfc = tmp_path / "nfc.de"
    nfc.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cometnmt.data.corpus"):
        assert read_lines(nfc) == lines
        assert not caplog.records
        got = read_lines(nfd)
    assert got[1] == unicodedata.normalize("NFD", lines[1]) and got != lines  # kept as written
    (record,) = caplog.records
    assert f"{nfd}: 2 lines are not in Unicode NFC (first: line 2)" in record.getMessage()


def test_undecodable_byte_names_file_line_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nnoch gut\n\xc3\xbcb\xffer\n")
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert f"{path}:3: not valid UTF-8 (byte 0xff at column 3)" in str(info.value)
    zipped = tmp_path / "bad.gz"
    zipped.write_bytes(gzip.compress(b"ok\n\xe9t\xe9\n"))
    with pytest.raises(DataError, match=rf"{zipped}:2: not valid UTF-8 \(byte 0xe9 at column 1\)"):
        read_lines(zipped)


def test_an_undecodable_file_in_another_encoding_says_which_and_how_to_convert_it(tmp_path: Path) -> None:
    """A UTF-16 file (as Windows' Notepad and PowerShell write) was 'not valid UTF-8 (byte 0xff at
    column 1)' without a hint; so was a Latin-1 one. The error now names the encoding it looks like
    and the iconv command converting the file."""
    import shutil
    import subprocess

    text = "Ein Mädchen läuft.\nZwei Hunde.\n"
    cases = {
        "bom16.txt": (text.encode("utf-16"), "UTF-16"),  # with its byte order mark
        "be16.txt": (text.encode("utf-16-be"), "UTF-16BE"),  # without: NUL bytes every other byte
        "le16.txt": (text.encode("utf-16-le"), "UTF-16LE"),
        "bom32.txt": (text.encode("utf-32"), "UTF-32"),
        "latin1.txt": (text.encode("latin-1"), "WINDOWS-1252"),
    }
    for name, (data, encoding) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DataError, match=r"not valid UTF-8") as info:
            read_lines(path)
        assert f"iconv -f {encoding} -t UTF-8 {path} > {path}.utf8" in str(info.value), (name, str(info.value))
    spaced = tmp_path / "my corpus.de"  # the command names it as one shell word: it was two, and iconv found no 'my'
    spaced.write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError) as info:
        read_lines(spaced)
    command = str(info.value).split("convert it with ", 1)[1]
    assert command == f"iconv -f WINDOWS-1252 -t UTF-8 '{spaced}' > '{spaced}.utf8'", command
    if shutil.which("iconv"):
        subprocess.run(command, shell=True, check=True)
        assert read_lines(f"{spaced}.utf8") == ["Ein Mädchen läuft.", "Zwei Hunde."]
    path = tmp_path / "cut.txt"  # a UTF-8 file cut inside a character: no other encoding blamed
    path.write_bytes("Ein Mädchen".encode("utf-8")[:6])
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert "iconv" not in str(info.value)


def test_cjk_text_in_utf16_without_a_byte_order_mark_is_named_utf16(tmp_path: Path) -> None:
    """Chinese or Japanese text in UTF-16 without a byte order mark has few NUL bytes (its newlines,
    U+4E00): the hint counted them and named no encoding, and a file of one line without a NUL byte
    got 'it looks like WINDOWS-1252'. Such files are now named UTF-16LE/BE, and the iconv command
    converts them; legacy CJK encodings (GBK, Shift-JIS) are named neither UTF-16 nor WINDOWS-1252."""
    import shutil
    import subprocess

    zh = "一只狗在草地上奔跑。\n两个男人在街上说话。\n"
    ja = "日本語のテキストです。\u3000犬が走っている。\n一人の男性が歩いている。\n"
    mixed = "A dog 在草地上奔跑.\nZwei Hunde.\n"
    up = "上上狗在草地上奔跑。\n"  # U+4E0A is b"\x0a\x4e" in UTF-16LE, b"\x4e\x0a" in BE: no line break
    cases = [(text, order) for text in (zh, ja, mixed, up) for order in ("LE", "BE")] + [("一只狗", "LE")]  # no line break
    for i, (text, order) in enumerate(cases):
        path = tmp_path / f"{i}.txt"
        path.write_bytes(text.encode(f"utf-16-{order.lower()}"))
        with pytest.raises(DataError) as info:
            read_lines(path)
        assert str(info.value).startswith(f"{path}:1: "), (text, order, str(info.value))  # each fails in its line 1
        if text == up:  # was "PATH:3: ... at column 2": the 0x0a bytes counted as lines, the bytes as characters
            assert str(info.value).startswith(f"{path}:1: not valid UTF-8 (byte 0xd7 at column 3)"), str(info.value)
        assert f"it looks like UTF-16{order}: convert it with iconv -f UTF-16{order} -t UTF-8 {path}" in str(info.value), (
            text, order, str(info.value))
        if shutil.which("iconv"):
            subprocess.run(f"iconv -f UTF-16{order} -t UTF-8 {path} > {path}.utf8", shell=True, check=True)
            assert read_lines(f"{path}.utf8") == text.splitlines()
    for text, encoding in ((zh, "gbk"), (ja, "shift_jis"), ("日本語のテキストです", "shift_jis"), ("日本語", "utf-16-le")):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes(text.encode(encoding))
        with pytest.raises(DataError) as info:
            read_lines(path)
        assert "UTF-16" not in str(info.value) and "WINDOWS-1252" not in str(info.value), (text, encoding, str(info.value))


def test_a_utf16_or_utf32_file_s_line_and_column_count_its_characters(tmp_path: Path) -> None:
    """Where the error has decided the input is UTF-16 or UTF-32 (its byte order known), the line and
    column it names are counted in that encoding's characters, not in 0x0a bytes and UTF-8's: a CJK
    line of U+4E0A (a 0x0a byte in UTF-16 and UTF-32) was named at line 3 of a file of one line."""
    for i, encoding in enumerate(("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")):
        path = tmp_path / f"{encoding}.txt"
        path.write_bytes("上上狗\n".encode(encoding))
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: not valid UTF-8 \(byte 0xd7 at column 3\); "):
            read_lines(path)
        if encoding.startswith("utf-16"):  # U+4E00 is b"\0\x4e" in UTF-16LE: a NUL byte in valid UTF-8
            path.write_bytes("上上一\nab\n".encode(encoding))
            with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: a NUL character \(byte 0x00 at column 3\), "
                                                r".* probably UTF-16(LE|BE) without a byte order mark"):
                read_lines(path)
    path = tmp_path / "bom.txt"
    path.write_bytes("上上狗\n".encode("utf-16"))  # the byte order mark: its first byte, line 1 as before
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: not valid UTF-8 \(byte 0x(ff|fe) at column 1\)"):
        read_lines(path)


def test_utf16_without_a_byte_order_mark_is_refused_by_every_reader_naming_its_byte_order(tmp_path: Path, monkeypatch) -> None:
    """UTF-16 without a byte order mark of ASCII ("a\\0b\\0") or Cyrillic text (U+0410-U+044F:
    the bytes 0x10-0x4f beside 0x04) is valid UTF-8: it was read without a word as lines full of
    NUL characters, trained on and translated. A NUL character never belongs in text: every reader
    (files, gzip or not, training pairs, standard input, translate's chunks and its interactive
    lines) refuses it, naming the file and line, the byte order (LE: NUL bytes at odd offsets) and
    the iconv command. Greek (high bytes, not UTF-8) is named UTF-16 by the UTF-8 error alike."""
    import io
    import shutil
    import subprocess
    import types

    from cometnmt.data.corpus import decode_lines, read_stdin_lines
    from cometnmt.streaming import ChunkedInput

    texts = {"ascii": "A dog runs.\nTwo men talk.\n", "cyrillic": "Собака бежит по траве.\nДва мужчины.\n",
             "greek": "Ένας σκύλος τρέχει.\nΔύο άντρες μιλούν.\n"}
    for (kind, text), order in [(item, order) for item in texts.items() for order in ("LE", "BE")]:
        data = text.encode(f"utf-16-{order.lower()}")
        nul = "not valid UTF-8" if kind == "greek" else "a NUL character"
        path = tmp_path / f"{kind}.{order}.txt"
        path.write_bytes(data)
        with pytest.raises(DataError, match=rf"^{path}:1: {nul}") as info:
            read_lines(path)
        assert f"UTF-16{order}" in str(info.value) and str(info.value).endswith(
            f"convert it with iconv -f UTF-16{order} -t UTF-8 {path} > {path}.utf8"), str(info.value)
        if shutil.which("iconv"):
            subprocess.run(f"iconv -f UTF-16{order} -t UTF-8 {path} > {path}.utf8", shell=True, check=True)
            assert read_lines(f"{path}.utf8") == text.splitlines()
        zipped = tmp_path / f"{kind}.{order}.gz"
        zipped.write_bytes(gzip.compress(data))
        with pytest.raises(DataError, match=rf"^{zipped}:1: {nul}.*UTF-16{order}"):
            read_lines(zipped)
        good = tmp_path / "good.txt"
        good.write_text("Ein Hund läuft.\nZwei Männer reden.\n", encoding="utf-8")
        with pytest.raises(DataError, match=rf"^{path}:1: {nul}.*UTF-16{order}"):
            read_parallel(path, good, empty="skip")  # training and evaluation pairs
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
        with pytest.raises(DataError, match=rf"^<stdin>:1: {nul}.*UTF-16{order}.*iconv -f UTF-16{order} -t UTF-8 FILE"):
            read_stdin_lines()
        chunked = ChunkedInput(str(path), 1)  # translate's chunks (a file, or standard input)
        try:
            with pytest.raises(DataError, match=rf"^{path}:1: {nul}.*UTF-16{order}"):
                list(chunked.chunks())
        finally:
            chunked.close()
        first = io.BytesIO(data).readline()  # translate --interactive: its first line (later ones: the test below)
        with pytest.raises(DataError, match=rf"^<stdin>:1: {nul}.*UTF-16{order}"):
            decode_lines(first, "<stdin>", first_line=1)
    stray = tmp_path / "stray.txt"  # UTF-8 text with one NUL: refused too, its line and column named
    stray.write_bytes("Ein Hund.\nZwei\0 Männer.\n".encode("utf-8"))
    with pytest.raises(DataError, match=rf"^{stray}:2: a NUL character \(byte 0x00 at column 5\)") as caught:
        read_lines(stray)
    assert "stray byte in UTF-8 text" in str(caught.value) and "tr -d" in str(caught.value)  # not "probably UTF-16"
    assert "probably" not in str(caught.value)
    assert "a stray byte" in nul_note("Zwei\0 Männer.") and "a stray byte" not in nul_note("a\0b\0c\0")


def test_utf32_without_a_byte_order_mark_is_named_utf32_not_utf16(tmp_path: Path) -> None:
    """UTF-32 without a byte order mark ("A\\0\\0\\0": NUL bytes at UTF-16LE's odd offsets as well)
    was named UTF-16LE, and the iconv command given turned it into text with a NUL after every
    letter. Three NULs of every four bytes (two, the high ones, for Cyrillic or Greek) are UTF-32:
    the error names UTF-32LE or UTF-32BE and its iconv command converts the file."""
    import shutil
    import subprocess

    from cometnmt.data.corpus import decode_lines

    texts = {"ascii": "A dog runs.\nTwo men talk.\n", "cyrillic": "Собака бежит по траве.\nДва мужчины.\n",
             "greek": "Ένας σκύλος τρέχει.\nΔύο άντρες μιλούν.\n"}  # Greek: not valid UTF-8 (byte 0x88), that error
    for (kind, text), order in [(item, order) for item in texts.items() for order in ("LE", "BE")]:
        path = tmp_path / f"{kind}.{order}.txt"
        path.write_bytes(text.encode(f"utf-32-{order.lower()}"))
        with pytest.raises(DataError, match=rf"^{path}:1: ") as info:
            read_lines(path)
        assert "UTF-16" not in str(info.value), str(info.value)
        assert f"convert it with iconv -f UTF-32{order} -t UTF-8 {path} > {path}.utf8" in str(info.value), str(info.value)
        if shutil.which("iconv"):
            subprocess.run(f"iconv -f UTF-32{order} -t UTF-8 {path} > {path}.utf8", shell=True, check=True)
            assert read_lines(f"{path}.utf8") == text.splitlines()
    for data, order in ((b"A\0\0\0", "LE"), (b"\0\0\0A", "BE")):  # one character
        with pytest.raises(DataError, match=rf"UTF-32{order} without a byte order mark"):
            decode_lines(data, "<stdin>")
    for text in ("A dog runs.\n", "Собака.\n"):  # UTF-16 stays UTF-16
        with pytest.raises(DataError, match=r"UTF-16LE without a byte order mark"):
            decode_lines(text.encode("utf-16-le"), "<stdin>")


def test_translate_interactive_names_the_byte_order_of_every_line_not_the_first_alone() -> None:
    """translate --interactive reads a line at a time, up to b"\\n": of UTF-16LE text without a byte
    order mark each line after the first starts with the NUL left by the line break before it
    (b"\\n\\0" splits as b"\\n" | b"\\0Two..."), so its NULs stood at even offsets and lines 2, 3...
    were named UTF-16BE (line 1 UTF-16LE), with an iconv command that garbles the file; UTF-32LE's
    leave three NULs. A later piece (first_line > 1) is judged past them: every line is named
    LE; big-endian lines that do not open with such a NUL (Cyrillic, Greek) stay BE."""
    import io

    from cometnmt.data.corpus import decode_lines

    texts = {"ascii": "A dog runs.\n\nTwo men talk.\n", "cyrillic": "Собака бежит по траве.\nДва мужчины.\n",
             "greek": "Ένας σκύλος τρέχει.\nΔύο άντρες μιλούν.\n"}  # Greek: not valid UTF-8 (byte 0x88), that error
    for kind, text in texts.items():
        for encoding in ("UTF-16LE", "UTF-32LE", "UTF-16BE", "UTF-32BE"):
            if kind == "ascii" and encoding.endswith("BE"):
                continue  # b"\0T\0w\0o\0\n" is line 2 of both orders: taken as LE, which Windows writes
            pieces = io.BytesIO(text.encode(encoding)).readlines()  # as translate --interactive reads them
            assert len(pieces) >= 3 if encoding.endswith("LE") else len(pieces) >= 2  # LE: a last piece of NULs
            for number, piece in enumerate(pieces, 1):
                with pytest.raises(DataError, match=rf"^<stdin>:{number}: ") as info:
                    decode_lines(piece, "<stdin>", first_line=number)
                assert f"iconv -f {encoding} -t UTF-8 FILE" in str(info.value), (kind, encoding, number, piece,
                                                                               str(info.value))


WIDE = [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"), ("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE"),
        ("utf-16", "UTF-16"), ("utf-32", "UTF-32")]  # Python's codec (the last two: with a mark), iconv's name


def test_a_later_piece_of_a_utf16_or_utf32_input_counts_its_lines_and_columns_in_its_characters() -> None:
    """A reader that splits its input after each 0x0a byte (--interactive's lines) counted a later piece's first line in 0x0a bytes, which stand inside characters (U+0A0A
    is b"\\x0a\\x0a", U+010A b"\\x0a\\x01" in UTF-16LE, a surrogate of U+1280A b"\\x0a\\xd8") and are one
    byte of a 2- or 4-byte line break, and its columns in UTF-8's characters. WidePlace follows the
    pieces in the input's own encoding: every byte of every piece gets the line and column it has
    in the whole input, as the first piece's are counted (_wide_line_and_column), byte order mark
    or none, a character or a code unit cut between pieces or not."""
    import io

    from cometnmt.data.corpus import WidePlace, _wide_line_and_column

    text = "ਊĊ上\n\nਊ😀\U0001280a a\nĊĊ\n\n\u0a00狗 Ċ\n上"
    for codec, encoding in WIDE:
        data = text.encode(codec) + b"\xff"  # a cut code unit at the end
        pieces = io.BytesIO(data).readlines()
        assert len(pieces) > 2 * text.count("\n"), (codec, len(pieces))  # far more 0x0a bytes than lines
        place, offset = WidePlace(encoding), 0
        for piece in pieces:
            for pos in range(len(piece)):
                whole = _wide_line_and_column(data, offset + pos, encoding)
                assert place.line_and_column(piece, pos) == whole, (codec, offset, pos)
            place.advance(piece)
            offset += len(piece)
        assert (place.line, place.column) == (text.count("\n") + 1, 2)  # before the last character's cut unit


def test_a_tiny_utf16_file_is_named_utf16_not_a_stray_byte(tmp_path: Path, monkeypatch) -> None:
    """A one-line UTF-16 file of one space (b" \\0") or one letter holds a single NUL byte and no
    line break, too little for the NUL count to judge: it got the two-sided 'a stray byte in UTF-8
    text (remove it, e.g. tr -d ...) or, if the file is UTF-16LE ...' message. Where the whole input
    is there (a file, standard input, the first chunk or line) and it is NUL every other byte and
    nowhere else, it is named UTF-16LE/BE alone; a NUL beside UTF-8 text is still a stray byte."""
    import io
    import types

    from cometnmt.data.corpus import decode_lines, read_stdin_lines
    from cometnmt.streaming import ChunkedInput

    for text, order in ((" ", "LE"), (" ", "BE"), ("a", "LE"), ("a", "BE"), ("a ", "LE")):
        data = text.encode(f"utf-16-{order.lower()}")
        path = tmp_path / f"tiny.{order}.txt"
        path.write_bytes(data)
        zipped = tmp_path / f"tiny.{order}.gz"
        zipped.write_bytes(gzip.compress(data))
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
        readers = [lambda: read_lines(path), lambda: read_lines(zipped), read_stdin_lines,
                   lambda: decode_lines(io.BytesIO(data).readline(), "<stdin>", first_line=1)]  # --interactive
        for name in (path, zipped):
            chunked = ChunkedInput(str(name), 1)
            readers.append(lambda chunked=chunked: next(chunked.chunks()))
        for reader in readers:
            with pytest.raises(DataError, match=rf":1: a NUL character .*: the file is probably UTF-16{order} without a "
                                                rf"byte order mark, read as UTF-8; convert it with .*iconv -f UTF-16{order} -t UTF-8"):
                reader()
    for data in (b"Zwei\0", b"\0Zwei", "Zwei\0 Männer.".encode()):
        with pytest.raises(DataError, match="stray byte in UTF-8 text"):
            decode_lines(data, "<stdin>")


def test_byte_order_marks_and_windows_1252_get_their_reading_through_every_reader(tmp_path: Path, monkeypatch) -> None:
    """Through every reader (a file, gzip, standard input, translate's chunks, --interactive's
    lines): UTF-8 with a byte order mark is read without it, UTF-16 and UTF-32 with one are named
    by it, and WINDOWS-1252 (Latin-1) is named with the iconv command that converts it. Latin text
    whose accented letters stand two together ("Gr\\xf6\\xdfe", Größe; "Füße") got no hint at all:
    the hint wanted each high byte alone between ASCII bytes; two Latin-1 letters together count
    now, where CJK in a legacy encoding or UTF-16 is still named neither (its own test)."""
    import io
    import shutil
    import subprocess
    import types

    from cometnmt.data.corpus import decode_lines, read_stdin_lines
    from cometnmt.streaming import ChunkedInput

    def readers(path: Path, data: bytes) -> list:
        """(name, read) for each reader of ``data`` (in ``path``, and gzipped beside it)."""
        zipped = path.with_suffix(".gz")
        zipped.write_bytes(gzip.compress(data))

        def chunks(name: Path) -> list[str]:
            chunked = ChunkedInput(str(name), 1)
            try:
                return [line for _, lines, _ in chunked.chunks() for line in lines]
            finally:
                chunked.close()

        def stdin() -> list[str]:
            monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data)))
            return read_stdin_lines()

        def interactive() -> list[str]:
            pieces = io.BytesIO(data).readlines()
            return [decode_lines(piece, "<stdin>", first_line=number)[0] for number, piece in enumerate(pieces, 1)]

        return [(path, lambda: read_lines(path)), (zipped, lambda: read_lines(zipped)), (path, lambda: chunks(path)),
                (zipped, lambda: chunks(zipped)), ("<stdin>", stdin), ("<stdin>", interactive)]

    text = "Ein Mädchen läuft.\nZwei Hunde.\n"
    path = tmp_path / "bom8.txt"
    path.write_bytes(text.encode("utf-8-sig"))
    for name, read in readers(path, text.encode("utf-8-sig")):
        assert read() == ["Ein Mädchen läuft.", "Zwei Hunde."], name
    for encoding, codec in (("UTF-16", "utf-16"), ("UTF-32", "utf-32")):
        path = tmp_path / f"bom.{codec}.txt"
        path.write_bytes(text.encode(codec))
        for name, read in readers(path, text.encode(codec)):
            with pytest.raises(DataError, match=rf"^{name}:1: not valid UTF-8.*it looks like {encoding}: convert it with "
                                                rf".*iconv -f {encoding} -t UTF-8"):
                read()
    for text in ("Größe und Füße.\nZwei Hunde.\n", "Ein Mädchen läuft.\nGrüße.\n", "Größe\n"):
        path = tmp_path / "latin1.txt"
        path.write_bytes(text.encode("cp1252"))
        for name, read in readers(path, text.encode("cp1252")):
            with pytest.raises(DataError, match=rf"^{name}:\d: not valid UTF-8.*it looks like WINDOWS-1252: convert it "
                                                r"with .*iconv -f WINDOWS-1252 -t UTF-8") as info:
                read()
        command = str(info.value).split("convert it with ", 1)[1].replace("FILE", str(path))
        if shutil.which("iconv"):
            subprocess.run(command, shell=True, check=True)
            assert read_lines(f"{path}.utf8") == text.splitlines()


def test_a_sentence_of_utf16_or_utf32_decoded_as_utf8_is_told_its_byte_order() -> None:
    """The Translator and serve refuse a sentence holding NUL characters (UTF-16 or UTF-32 decoded
    as UTF-8) with nul_note, which told every such sentence "decode it as UTF-16, e.g.
    open(path, encoding='utf-16-le'), or convert the file with iconv -f UTF-16LE": for UTF-16BE
    and UTF-32 text a codec and command that garble it. It names the byte order the sentence's
    bytes show, as the file readers do; one stray NUL is named as before."""
    for text in ("A dog runs.", "Собака бежит.", " "):
        for encoding in ("UTF-16LE", "UTF-16BE", "UTF-32LE", "UTF-32BE"):
            note = nul_note(text.encode(encoding).decode("utf-8"))
            codec = f"{encoding[:6].lower()}-{encoding[6:].lower()}"
            assert note.endswith(f"{encoding[:6]} decoded as UTF-8? (decode it as {encoding[:6]}, e.g. "
                                 f"open(path, encoding='{codec}'), or convert the file with iconv -f {encoding} -t UTF-8)"), (
                text, encoding, note)
            assert text.encode(encoding).decode(codec) == text
    assert nul_note("b\0c").endswith("a stray byte, or UTF-16 decoded as UTF-8 (remove it, or decode the text as UTF-16, "
                                     "e.g. open(path, encoding='utf-16-le'))")


def test_the_conversion_hint_for_a_gzip_file_decompresses_and_compresses_again(tmp_path: Path) -> None:
    """For a gzip file in another encoding the hint was 'iconv -f WINDOWS-1252 -t UTF-8 FILE.gz >
    FILE.gz.utf8', which fails on the compressed bytes ('illegal input sequence'). It now pipes the
    file through gzip -dc and gzip, and the command it gives converts the file."""
    import shutil
    import subprocess

    text = "Ein Mädchen läuft.\nZwei Hunde.\n"
    for name, data, encoding in (("train.de.gz", text.encode("latin-1"), "WINDOWS-1252"),
                                 ("train.en", text.encode("utf-16"), "UTF-16")):  # gzip found by its bytes
        path = tmp_path / name
        path.write_bytes(gzip.compress(data))
        with pytest.raises(DataError, match=r"not valid UTF-8") as info:
            read_lines(path)
        out = tmp_path / "train.de.utf8.gz" if name.endswith(".gz") else tmp_path / "train.en.utf8.gz"
        command = f"gzip -dc {path} | iconv -f {encoding} -t UTF-8 | gzip > {out}"
        assert str(info.value).endswith(f"it looks like {encoding}: convert it with {command}"), str(info.value)
        if shutil.which("iconv") and shutil.which("gzip"):
            subprocess.run(command, shell=True, check=True)
            assert read_lines(out) == ["Ein Mädchen läuft.", "Zwei Hunde."]


def test_gzip_data_on_standard_input_is_named(monkeypatch) -> None:
    """Files are gunzipped (-i FILE), standard input is not: `translate < src.de.gz` was
    '<stdin>:1: not valid UTF-8 (byte 0x8b at column 2)', as if the text were in another encoding."""
    import io
    import types

    from cometnmt.data.corpus import read_stdin_lines

    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(gzip.compress(b"Ein Hund.\n"))))
    with pytest.raises(DataError, match=r"^<stdin>: gzip-compressed data; standard input is read as plain UTF-8 text: "
                                        r"give a gzip file by name \(translate -i FILE\) or through zcat"):
        read_stdin_lines()


def test_missing_file_and_corrupt_gzip(tmp_path: Path) -> None:
    missing = tmp_path / "nope.de.gz"
    with pytest.raises(DataError, match=rf"^{missing}: file not found$"):
        read_lines(missing)
    corrupt = tmp_path / "corrupt.gz"
    corrupt.write_bytes(gzip.compress(b"hello\n" * 100)[:30])
    with pytest.raises(DataError, match=str(corrupt)):
        read_lines(corrupt)


def test_mismatched_counts_name_both_files_and_counts(tmp_path: Path) -> None:
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt, empty="skip")
    msg = str(info.value)
    assert str(src) in msg and str(tgt) in msg and "3" in msg and "2" in msg


def test_empty_lines_skip_or_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a\nb\n\nd\ne\n", encoding="utf-8")
    tgt.write_text("v\n \t\nx\ny\nz\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        corpus = read_parallel(src, tgt, empty="skip")
    assert (corpus.src, corpus.tgt, corpus.skipped) == (["a", "d", "e"], ["v", "y", "z"], 2)
    assert len([r for r in caplog.records if "skipped 2" in r.getMessage() and "line 2" in r.getMessage()]) == 1
    with pytest.raises(DataError, match=rf"^{tgt}:2: empty line"):
        read_parallel(src, tgt, empty="error")
    first2 = read_parallel(src, tgt, empty="skip", max_pairs=2)
    assert first2.src == ["a", "d"] and first2.tgt == ["v", "y"]


def test_empty_lines_ending_a_file_are_named_as_such(tmp_path: Path) -> None:
    """A blank line after the last sentence (an editor's, or `echo >> file`; CRLF alike) made
    "dev.fr:61: empty line" and "corpus.fr has 400 lines but corpus.en has 401 lines", which read
    as misaligned text (found walking README with one's own corpus). The errors now say that the
    file's last lines are empty and to remove them; an empty line before the last sentence is named
    as before."""
    from cometnmt.data.pipeline import read_text_file

    src, tgt, two = tmp_path / "s.fr", tmp_path / "t.en", tmp_path / "two.en"
    src.write_bytes(b"\xef\xbb\xbfa\r\nb\r\n\r\n")
    tgt.write_text("v\nw\n\n", encoding="utf-8")
    two.write_text("v\nw\n \n\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{src}:3: empty line \(empty or whitespace-only; its last line is empty, "
                                        r"after the last sentence: remove it\)$"):
        read_parallel(src, tgt, empty="error")
    with pytest.raises(DataError, match=rf"^{src} has 3 lines \(its last line is empty, after the last sentence: remove "
                                        rf"it\) but {two} has 4 lines \(its last 2 lines are empty, .*remove them\); "):
        read_parallel(src, two, empty="skip")
    with pytest.raises(DataError, match=rf"^{two}:3: empty line \(its last 2 lines are empty, after the last sentence"):
        read_text_file(two)
    middle = tmp_path / "m.en"
    middle.write_text("v\n\nw\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{middle}:2: empty line$"):
        read_text_file(middle)
    with pytest.raises(DataError, match=rf"^{middle} has 3 lines but {two} has 4 lines \(its last 2 lines are empty"):
        read_parallel(middle, two, empty="skip")


def test_a_tilde_in_data_paths_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """data.train_src: ~/corpus/train.de (YAML and --set do not expand "~"; anchor_paths already took
    it as absolute) reads the file under the home folder (was: file not found); data.multi30k_dir
    and model.transformer_pp.tag_cache_dir likewise."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split
    from cometnmt.data.tagging import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "v.de").write_text("Ein Hund.\n", encoding="utf-8")
    (tmp_path / "corpus" / "v.en").write_text("A dog.\n", encoding="utf-8")
    cfg = DataConfig(corpus="files", valid_src="~/corpus/v.de", valid_tgt="~/corpus/v.en")
    assert read_split(cfg, "valid").tgt == ["A dog."]
    (tmp_path / "m30k").symlink_to(multi30k_dir().resolve())
    assert read_split(DataConfig(multi30k_dir="~/m30k"), "valid").tgt[0].startswith("A group of men")
    assert cache_dir("~/tags") == tmp_path / "tags"


def test_a_split_cut_by_max_pairs_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """data.max_train_pairs / max_valid_pairs (configs/tiny.yaml: 2,000 and 100) cut a user's own
    corpus without a word: a config built on tiny.yaml trained on 2,000 pairs of any corpus, the
    log saying only "data: 2000 training pairs". The cut is a warning naming the key and what was
    left unread; a limit the split does not reach says nothing."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    for name, text in (("t.de", "Ein Hund.\n\nZwei Katzen.\nDrei.\nVier.\n"), ("t.en", "A dog.\n\nTwo cats.\nThree.\nFour.\n"),
                       ("v.de", "Ein Hund.\nZwei.\n"), ("v.en", "A dog.\nTwo.\n")):
        (tmp_path / name).write_text(text, encoding="utf-8")
    paths = {k: str(tmp_path / v) for k, v in (("train_src", "t.de"), ("train_tgt", "t.en"),
                                                  ("valid_src", "v.de"), ("valid_tgt", "v.en"))}
    with caplog.at_level(logging.WARNING, logger="cometnmt.data.pipeline"):
        cfg = DataConfig(corpus="files", max_train_pairs=2, max_valid_pairs=1, **paths)
        assert read_split(cfg, "train").tgt == ["A dog.", "Two cats."]  # the blank pair skipped, not counted
        assert read_split(cfg, "valid").tgt == ["A dog."]
        assert [r.getMessage() for r in caplog.records if r.name == "cometnmt.data.pipeline"] == [
            f"{tmp_path / 't.de'} / {tmp_path / 't.en'}: the first 2 train pairs only (data.max_train_pairs=2); "
            "2 line pairs after them left unread",
            f"{tmp_path / 'v.de'} / {tmp_path / 'v.en'}: the first 1 valid pairs only (data.max_valid_pairs=1); "
            "1 line pairs after them left unread"]
        caplog.clear()
        cfg = DataConfig(corpus="files", max_train_pairs=4, max_valid_pairs=2, **paths)
        assert len(read_split(cfg, "train")) == 4 and len(read_split(cfg, "valid")) == 2
        assert not [r for r in caplog.records if r.name == "cometnmt.data.pipeline"]


def test_a_cut_of_multi30k_is_an_info_line_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Every run on configs/tiny.yaml, or with --set data.max_train_pairs=300 on Multi30k, warned
    'the first 300 train pairs only (...); 28700 line pairs after them left unread' and the same of
    the validation split: a slice of the benchmark is what it asks for, so the warning, meant for a
    config on one's own corpus (data.corpus: files) that inherited tiny.yaml's cut, was noise
    there. On Multi30k the cut is an INFO line naming the key; on one's own files it still warns
    (test_a_split_cut_by_max_pairs_says_so)."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    cfg = DataConfig(multi30k_dir=str(multi30k_dir()), max_train_pairs=5, max_valid_pairs=3)
    with caplog.at_level(logging.INFO, logger="cometnmt.data.pipeline"):
        assert len(read_split(cfg, "train")) == 5 and len(read_split(cfg, "valid")) == 3
    records = [r for r in caplog.records if r.name == "cometnmt.data.pipeline"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert "the first 5 train pairs only (data.max_train_pairs=5)" in records[0].getMessage()
    assert "the first 3 valid pairs only (data.max_valid_pairs=3)" in records[1].getMessage()


def test_a_tab_separated_file_named_as_both_sides_is_refused(tmp_path: Path) -> None:
    """A file of "source<TAB>target" lines (JoeyNMT's and Marian's TSV) given as data.train_src and
    data.train_tgt trained a model to copy those lines, without a word. It is refused naming both
    keys and how to cut it; the same file without tabs (a copy task) is read as before."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    (tmp_path / "pairs.tsv").write_text("Ein Hund.\tA dog.\nZwei Katzen.\tTwo cats.\n", encoding="utf-8")
    (tmp_path / "copy.txt").write_text("Ein Hund.\nZwei\tKatzen.\n", encoding="utf-8")
    tsv, copy = str(tmp_path / "pairs.tsv"), str(tmp_path / "copy.txt")
    for split in ("train", "valid", "test"):
        cfg = DataConfig(corpus="files", **{f"{split}_src": tsv, f"{split}_tgt": tsv})
        with pytest.raises(DataError, match=rf"^config keys 'data.{split}_src' and 'data.{split}_tgt': .*pairs.tsv and "
                                            r".*pairs.tsv hold the same lines, each with a tab: a tab-separated file"):
            read_split(cfg, split)
        cfg = DataConfig(corpus="files", **{f"{split}_src": copy, f"{split}_tgt": copy})
        assert read_split(cfg, split).tgt == ["Ein Hund.", "Zwei\tKatzen."]


def test_a_tab_separated_file_named_as_one_side_is_refused(tmp_path: Path) -> None:
    """A file of "source<TAB>target" lines named as data.train_src beside a target file of as many
    lines trained its whole lines as source sentences, without a word (found walking README with
    one's own corpus). A side whose every line holds a tab is refused naming its key and how to cut
    it; a tab in some lines only is text, read as before."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    (tmp_path / "pairs.tsv").write_text("Ein Hund.\tA dog.\nZwei Katzen.\tTwo cats.\n", encoding="utf-8")
    (tmp_path / "de.txt").write_text("Ein Hund.\nZwei\tKatzen.\n", encoding="utf-8")
    (tmp_path / "en.txt").write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    tsv, de, en = (str(tmp_path / name) for name in ("pairs.tsv", "de.txt", "en.txt"))
    for split in ("train", "valid", "test"):
        for side, paths in (("src", (tsv, en)), ("tgt", (de, tsv))):
            cfg = DataConfig(corpus="files", **{f"{split}_src": paths[0], f"{split}_tgt": paths[1]})
            with pytest.raises(DataError, match=rf"^config key 'data.{split}_{side}': every line of .*pairs.tsv holds a "
                                                r"tab: a tab-separated file of pairs is not read as two columns.*cut -f1"):
                read_split(cfg, split)
        cfg = DataConfig(corpus="files", **{f"{split}_src": de, f"{split}_tgt": en})
        assert read_split(cfg, split).src == ["Ein Hund.", "Zwei\tKatzen."]


def test_text_whose_every_line_holds_a_tab_goes_through_with_tabs_are_text(tmp_path: Path) -> None:
    """The refusal of a side whose every line holds a tab (a tab-separated file of pairs) left no way
    for a corpus whose tabs are text, code or table rows, in every line: it could not be trained on.
    The error now names data.tabs_are_text, and with it true such sides, and the same file as both
    sides, are read as sentences, tabs kept."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    (tmp_path / "code.src").write_text("if x:\treturn 1\nfor i in a:\tprint(i)\n", encoding="utf-8")
    (tmp_path / "code.tgt").write_text("wenn x:\tgib 1 zurück\nfür i in a:\tdrucke(i)\n", encoding="utf-8")
    src, tgt = str(tmp_path / "code.src"), str(tmp_path / "code.tgt")
    for split in ("train", "valid", "test"):
        for paths in ((src, tgt), (src, src)):
            cfg = DataConfig(corpus="files", **{f"{split}_src": paths[0], f"{split}_tgt": paths[1]})
            with pytest.raises(DataError, match=r"if the tabs are part of the text \(code, table rows\), set "
                                                r"data.tabs_are_text: true$"):
                read_split(cfg, split)
            cfg = DataConfig(corpus="files", tabs_are_text=True, **{f"{split}_src": paths[0], f"{split}_tgt": paths[1]})
            corpus = read_split(cfg, split)
            assert corpus.src == ["if x:\treturn 1", "for i in a:\tprint(i)"]
            assert corpus.tgt == (corpus.src if paths[1] == src else ["wenn x:\tgib 1 zurück", "für i in a:\tdrucke(i)"])


def test_the_default_tag_cache_follows_xdg_cache_home_as_the_multi30k_download_does(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the tags went to ~/.cache/cometnmt/tags whatever XDG_CACHE_HOME said, while the
    Multi30k downloads went under it; $COMETNMT_CACHE still comes first."""
    from cometnmt.data.multi30k import default_cache_dir
    from cometnmt.data.tagging import cache_dir

    monkeypatch.delenv("COMETNMT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir(None) == tmp_path / "xdg" / "cometnmt" / "tags"
    assert cache_dir(None).parent == default_cache_dir().parent
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir(None) == tmp_path / "home" / ".cache" / "cometnmt" / "tags"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("COMETNMT_CACHE", str(tmp_path / "mine"))
    assert cache_dir(None) == tmp_path / "mine" / "tags"


# --- vocabulary ----------------------------------------------------------------------------------


def test_vocab_build_encode_decode_roundtrip() -> None:
    vocab = Vocab.build([["b", "a", "c"], ["a", "b"], ["a", "d"]], min_freq=1)
    assert vocab.itos == list(SPECIALS) + ["a", "b", "c", "d"]  # freq desc, then token
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    assert Vocab.build([["b", "a", "c"], ["a", "b"], ["a", "d"]], min_freq=2).itos[4:] == ["a", "b"]
    assert len(Vocab.build([["b", "a", "c"], ["a", "b"]], max_size=5)) == 5
    ids = vocab.encode(["a", "zzz", "d"])
    assert ids == [4, UNK, 7] and vocab["zzz"] == UNK and vocab["c"] == 6
    assert vocab.decode([BOS, 4, PAD, 7, EOS, 5]) == ["a", "d"]
    restored = Vocab.from_dict(vocab.to_dict())
    assert restored.itos == vocab.itos and len(restored) == 8
    assert restored.decode(restored.encode(["d", "c"])) == ["d", "c"]


# --- tokenizers ----------------------------------------------------------------------------------


def test_spacy_tokenizes_german_and_english() -> None:
    de = SpacyTokenizer("de")
    assert de.tokenize("Ein Mann schläft in einem grünen Raum auf einem Sofa.") == [
        "Ein", "Mann", "schläft", "in", "einem", "grünen", "Raum", "auf", "einem", "Sofa", ".",
    ]
    en = SpacyTokenizer("en", lowercase=True)
    assert en.tokenize("A boy wearing headphones sits on a woman's shoulders.") == [
        "a", "boy", "wearing", "headphones", "sits", "on", "a", "woman", "'s", "shoulders", ".",
    ]
    assert en.tokenize_many(["A t-shirt.", "Hi!"]) == [["a", "t", "@-@", "shirt", "."], ["hi", "!"]]
    assert tokenizer_from_state(en.state_dict()).tokenize("Hi there") == ["hi", "there"]


def test_a_lazy_spacy_tokenizer_tokenizes_as_an_eager_one_and_only_detokenizing_imports_moses() -> None:
    """Each half of a SpacyTokenizer is built where it is first used: the paper metric only
    tokenizes, and paid for sacremoses' import (~0.2 s, its tokenizer's regexes); a lazy one
    (a checkpoint's target side) builds no spaCy pipeline until it tokenizes."""
    code = ("import sys; from cometnmt.data.tokenizers import SpacyTokenizer, metric_tokenizer; "
            "print(metric_tokenizer('en').tokenize(\"Don't.\")); print('sacremoses' in sys.modules); "
            "lazy = SpacyTokenizer('de', lazy=True); print(lazy.detokenize(['Ein', 'T', '@-@', 'Shirt', '.'])); "
            "print('sacremoses' in sys.modules); print(lazy.tokenize('Ein T-Shirt.'))")
    import subprocess

    repo = Path(__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["['Do', \"n't\", '.']", "False", "Ein T-Shirt.", "True", "['Ein', 'T-Shirt', '.']"]
    texts = ["Ein Mann im T-Shirt.", "A t-shirt, isn't it?"]
    assert SpacyTokenizer("en", lazy=True).tokenize_many(texts) == SpacyTokenizer("en").tokenize_many(texts)
    with pytest.raises(DataError, match="spaCy has no tokenizer for language 'xx-none'"):
        SpacyTokenizer("xx-none")  # at once, unless lazy: then where it tokenizes
    lazy = SpacyTokenizer("xx-none", lazy=True)
    assert lazy.detokenize(["a", "b"]) == "a b"
    with pytest.raises(DataError, match="spaCy has no tokenizer for language 'xx-none'"):
        lazy.tokenize("a b")


def test_the_paper_metric_builds_its_spacy_pipeline_once_a_thread(monkeypatch) -> None:
    """metric_tokenizer built ``spacy.blank`` at every call, and every evaluation asks for it (score:
    ~0.1 s a language). It is built once a thread now; each thread tokenises with its own, whichever
    thread made the tokenizer (spaCy's tokenizer is not safe to share: it writes its vocabulary and
    cache as it reads), and the tokens are those of a tokenizer built afresh."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from cometnmt.data import tokenizers

    text = "Ein Mann im T-Shirt, <unk>-Hose."
    expected = SpacyTokenizer("de", unk_word=True).tokenize(text)
    built = []
    real = tokenizers._blank_tokenizer
    monkeypatch.setattr(tokenizers, "_blank_tokenizer", lambda lang: built.append(lang) or real(lang))
    monkeypatch.setattr(tokenizers, "_THREAD", threading.local(), raising=False)  # no pipeline kept from other tests
    first = metric_tokenizer("de")
    assert [metric_tokenizer("de", lowercase=True).tokenize(text), first.tokenize(text)] == \
        [[t.lower() for t in expected], expected]
    assert built == ["de"]  # before: once a call
    with ThreadPoolExecutor(max_workers=1) as pool:  # made here, used there: that thread builds its own
        assert pool.submit(first.tokenize, text).result() == expected
        assert pool.submit(lambda: first._tokenizer).result() is not first._tokenizer
        assert pool.submit(lambda: metric_tokenizer("de").tokenize_many([text, "Hund."])).result() == \
            [expected, ["Hund", "."]]
    assert built == ["de", "de"]
    with pytest.raises(DataError, match="spaCy has no tokenizer for language 'xx-none'"):
        metric_tokenizer("xx-none")  # at once, as before


def test_spacy_detokenize_roundtrip_on_multi30k_val() -> None:
    sentences = read_lines(multi30k_dir() / "val.en.gz")[:50]
    tok = SpacyTokenizer("en")
    exact = sum(tok.detokenize(toks) == s for toks, s in zip(tok.tokenize_many(sentences), sentences))
    fraction = exact / len(sentences)
    logger.info("spaCy en round trip: %d/%d exact", exact, len(sentences))
    assert fraction >= 0.95, f"only {exact}/{len(sentences)} val sentences round-trip exactly"


@pytest.mark.parametrize("lang, text", [
    ("en", "I don't know why it isn't here; we can't, they won't."),
    ("en", "DON'T STOP, we're gonna stay, I wanna go and you gotta see the man's dog."),
    ("fr", "Qu'est-ce que c'est, dit-il ? Va-t-il venir ? Donne-le-moi, peut-être."),
])
def test_spacy_detokenize_joins_the_words_its_exceptions_split(lang, text) -> None:
    """spaCy splits "don't" into do n't and "dit-il" into dit -il; Moses left them apart, so every
    English-target model wrote "I do n't know"."""
    tok = SpacyTokenizer(lang)
    assert len(tok.tokenize(text)) > len(text.split())  # split by the tokenizer...
    assert tok.detokenize(tok.tokenize(text)) == text  # ...and joined again


@pytest.mark.parametrize("lang, tokens", [
    ("en", ["A", "<unk>", "in", "a", "<unk>", "@-@", "shirt", "."]),
    ("en", ["<unk>", "'s", "<unk>", "@-@", "<unk>", ",", "\"", "<unk>", "\"", "<unk>"]),
    ("de", ["Ein", "<unk>", "mit", "<unk>", "."]),
    ("fr", ["Un", "<unk>", "de", "l'", "<unk>", "."]),
])
def test_a_translations_unk_tokenises_back_to_unk(lang, tokens) -> None:
    """A model writes its unknown word as the text <unk>; the codec's tokenizer (training's, and
    logprob's on translate's output) reads it back as that one token, so forced decoding scores
    what search found. spaCy alone made it "<", "unk", ">" (or "<unk>." whole, in French), each
    another unknown word: logprob --nbest-input scored translate's own n-best list far lower."""
    codec_tok = tokenizer_from_state(SpacyTokenizer(lang).state_dict())
    text = codec_tok.detokenize(tokens)
    assert codec_tok.tokenize(text) == tokens and codec_tok.tokenize_many([text, text]) == [tokens, tokens]
    assert build_tokenizer("spacy", lang, [], lowercase=True, sp_vocab_size=0, sp_model_type="unigram").tokenize(
        text.upper()) == [t.lower() for t in tokens]  # "<UNK>" lowercased is the unknown word too
    assert metric_tokenizer(lang).tokenize(text) == tokens  # the paper metric's: one word too
    assert "<unk>" not in SpacyTokenizer(lang).tokenize(text)  # spaCy's own tokens without unk_word


@pytest.mark.parametrize("lang, text", [
    ("en", "The dog’s ball: I don’t know, we’re sure the dogs’ owner said ‘hello’ to McDonald’s."),
    ("de", "Geht’s gut? Ein Schild von McDonald’s und ein ‘Zitat’."),
    ("fr", "Aujourd’hui, j’ai vu qu’il est là : c’est l’été à l’océan."),
    ("it", "L’uomo è all’aperto."),
])
def test_spacy_detokenize_joins_typographic_apostrophes(lang, text) -> None:
    """Moses joins "dog 's" and "l' été" but left the typographic ’ apart: translations read
    "dog ’s", "l’ été" (Multi30k's French training text: 16 lines)."""
    tok = SpacyTokenizer(lang)
    assert tok.detokenize(tok.tokenize(text)) == text


def test_no_hyphen_marker_is_left_in_detokenised_text() -> None:
    """Moses joins one "@-@" (spaCy's split intra-word hyphen); two in a row, as an undertrained
    model may emit them, left "a-@-@ b" in the translation."""
    tok = SpacyTokenizer("en")
    assert tok.detokenize(["a", "@-@", "@-@", "b"]) == "a-- b"
    assert tok.detokenize(["t", "@-@", "shirt", "@-@", "wearing", "@-@"]) == "t-shirt-wearing-"
    assert "@" not in tokenizer_from_state(tok.state_dict()).detokenize(["@-@", "@-@", "<unk>", "@-@", "@-@"])


def test_sentencepiece_writes_and_reads_the_unknown_piece_as_unk(train_pairs: tuple[list[str], list[str]]) -> None:
    """A piece the model's vocabulary lacks (past data.max_vocab, say) came out as " ⁇ " with a
    double space ("a ⁇  dog"); it is now the word <unk>, and the text <unk> tokenises back to it."""
    tok = SentencePieceTokenizer.train(train_pairs[1][:2000], 500, seed=1)
    assert tok.detokenize(["\u2581a", "<unk>", "\u2581dog"]) == "a <unk> dog"
    assert tok.detokenize(["<unk>", "\u2581a", "<unk>", "s", "<unk>"]) == "<unk> a <unk>s <unk>"
    assert tok.detokenize(["\u2581a", "\u2581dog"]) == "a dog"  # no unknown piece: SentencePiece's own
    text = "A man <unk> a dog."
    pieces = tok.tokenize(text)
    assert pieces.count("<unk>") == 1 and tok.detokenize(pieces) == text
    assert tok.tokenize_many([text, "A dog."]) == [pieces, tok.tokenize("A dog.")]


def test_spacy_tokenizes_the_whole_training_side(train_pairs: tuple[list[str], list[str]]) -> None:
    """Batched (spaCy's pipe) as one sentence at a time. No timing here: speed belongs in bench/
    (this test asserted under 30 s, about a second when unloaded)."""
    tok = SpacyTokenizer("en")
    tokens = tok.tokenize_many(train_pairs[1])
    assert len(tokens) == len(train_pairs[1]) and all(tokens)
    assert [tokens[i] for i in range(0, len(tokens), 997)] == [tok.tokenize(train_pairs[1][i])
                                                                for i in range(0, len(tokens), 997)]


def test_sentencepiece_train_roundtrip_and_state(train_pairs: tuple[list[str], list[str]]) -> None:
    texts = train_pairs[1][:2000]
    tok = SentencePieceTokenizer.train(texts, vocab_size=4000)  # more than 2k sentences allow
    again = SentencePieceTokenizer.train(texts, vocab_size=4000)
    assert tok.state_dict() == again.state_dict(), "training is not deterministic"
    pieces = tok.tokenize_many(texts)
    assert all(tok.detokenize(p) == t for p, t in zip(pieces, texts))
    restored = tokenizer_from_state(tok.state_dict())
    assert restored.kind == "sentencepiece"
    assert restored.tokenize_many(texts[:200]) == pieces[:200]
    assert restored.tokenize(texts[0]) == tok.tokenize(texts[0])
    bpe = build_tokenizer("sentencepiece", "en", texts, lowercase=True, sp_vocab_size=500, sp_model_type="bpe")
    assert bpe.detokenize(bpe.tokenize("A Dog runs.")) == "a dog runs."


def test_sentencepiece_reads_every_whitespace_as_a_space_as_spacy_does(train_pairs: tuple[list[str], list[str]]) -> None:
    """spaCy takes a tab, a carriage return inside a line or a no-break space as a space;
    SentencePiece (identity normalization) kept each as a character, in training and tokenising:
    a tab in the training text became a piece, and cut the word after it into pieces without
    their word-start mark ("▁Zwei", "\t", "j", "ung", "e"); one the training text lacked was
    <unk>. Now both read them as spaces, in training and tokenising alike; a model trained before
    (its state without the key) keeps reading them as it was trained."""
    assert set(OTHER_SPACES) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()} - {" "}
    texts = train_pairs[1][:2000]
    texts = [texts[0].replace(" ", "\t", 2), texts[1].replace(" ", "\u00a0"), *texts[2:]]
    tok = SentencePieceTokenizer.train(texts, 500, seed=1)
    pieces = {tok._sp.id_to_piece(i) for i in range(len(tok._sp))}
    assert not [p for p in pieces if set(p) & set(OTHER_SPACES)], "whitespace other than spaces became a piece"
    odd, plain = "A man\tis walking\rwith a\u00a0dog\u3000.", "A man is walking with a dog ."
    assert tok.tokenize(odd) == tok.tokenize(plain) and not set("".join(tok.tokenize(odd))) & set(OTHER_SPACES)
    assert tok.tokenize_many([odd, texts[0]]) == [tok.tokenize(odd), tok.tokenize(texts[0].replace("\t", " "))]
    spacy_tok = SpacyTokenizer("en")
    assert spacy_tok.tokenize(odd) == spacy_tok.tokenize(plain)
    state = tok.state_dict()
    assert tokenizer_from_state(state).tokenize(odd) == tok.tokenize(odd)
    old = tokenizer_from_state({k: v for k, v in state.items() if k != "spaces_only"})
    assert "\t" in old.tokenize("A man\tis") and "\t" in "".join(old.tokenize_many(["A man\tis"])[0])
    lower = build_tokenizer("sentencepiece", "en", texts, lowercase=True, sp_vocab_size=500, sp_model_type="bpe")
    assert lower.tokenize("A\tDog") == lower.tokenize("a dog")


def test_sentencepiece_keeps_runs_of_spaces_and_spacy_does_not() -> None:
    """docs/data.md's *Whitespace*: SentencePiece is trained with remove_extra_whitespaces off (its own
    default collapses a run of spaces into one piece and trims both ends), so a run of spaces, and
    spaces at either end, come back from detokenize as written; spaCy's words come back with single
    spaces. A tab is a space to both."""
    texts = ["Ein Hund läuft.", "Zwei  Katzen  schlafen.", " Ein Mann. "] * 20 + ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ äöüß."]
    tok = SentencePieceTokenizer.train(texts, 60)
    for text in ("Zwei  Katzen  schlafen.", " Ein Mann. ", "Ein   Hund."):
        assert tok.detokenize(tok.tokenize(text)) == text
    assert tok.tokenize("Ein   Hund.").count("\u2581") >= 2  # the run: one word-start mark a space
    assert tok.detokenize(tok.tokenize("Ein\tHund.")) == "Ein Hund."
    spacy_tok = SpacyTokenizer("de")
    assert spacy_tok.detokenize(spacy_tok.tokenize("Zwei  Katzen\tschlafen. ")) == "Zwei Katzen schlafen."


# --- batching ------------------------------------------------------------------------------------


def _lengths(train_pairs: tuple[list[str], list[str]]) -> tuple[list[int], list[int]]:
    src = SpacyTokenizer("de").tokenize_many(train_pairs[0])
    tgt = SpacyTokenizer("en").tokenize_many(train_pairs[1])
    return [len(t) for t in src], [len(t) for t in tgt]


@pytest.fixture(scope="module")
def train_lengths(train_pairs: tuple[list[str], list[str]]) -> tuple[list[int], list[int]]:
    return _lengths(train_pairs)


def test_make_batches_on_multi30k_train(train_lengths: tuple[list[int], list[int]]) -> None:
    src_lens, tgt_lens = train_lengths
    batches = make_batches(src_lens, tgt_lens, max_tokens=4096, shuffle=True, seed=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(src_lens)))
    for b in batches:
        cost = len(b) * max(max(src_lens[i] for i in b), max(tgt_lens[i] + 1 for i in b))
        assert cost <= 4096 or len(b) == 1
    frac = padding_fraction(batches, src_lens, tgt_lens)
    assert frac < 0.10, f"padding fraction {frac:.2%} with max_tokens=4096 ({len(batches)} batches)"
    assert make_batches(src_lens, tgt_lens, max_tokens=4096, shuffle=True, seed=3) == batches
    assert make_batches(src_lens, tgt_lens, max_tokens=4096, shuffle=True, seed=4) != batches


def test_wide_buckets_mix_lengths(train_lengths: tuple[list[int], list[int]]) -> None:
    # train.bucket_width: 1 cuts batches of one source length; a width above the longest sentence
    # gives batches of mixed lengths (what batch norm sees at test time), still within the budget
    src_lens, tgt_lens = train_lengths
    tight = make_batches(src_lens, tgt_lens, max_tokens=2048, shuffle=True, seed=3)
    wide = make_batches(src_lens, tgt_lens, max_tokens=2048, shuffle=True, seed=3, bucket_width=1000)
    spread = lambda bs: statistics.mean(max(src_lens[i] for i in b) - min(src_lens[i] for i in b) for b in bs)  # noqa: E731
    assert spread(tight) < 1 < 10 < spread(wide)  # tight: only batches at a length boundary span two
    assert sorted(i for b in wide for i in b) == list(range(len(src_lens)))
    assert all(len(b) * max(max(src_lens[i] for i in b), max(tgt_lens[i] + 1 for i in b)) <= 2048 or len(b) == 1 for b in wide)
    assert padding_fraction(wide, src_lens, tgt_lens) > padding_fraction(tight, src_lens, tgt_lens)


def test_trainer_cuts_batches_with_the_configured_bucket_width() -> None:
    from types import SimpleNamespace

    from cometnmt.config import load_config
    from cometnmt.data.pipeline import Examples
    from cometnmt.training.distributed import DistInfo
    from cometnmt.training.trainer import Trainer

    lens = [2 + i % 30 for i in range(600)]
    data = Examples([[5] * n for n in lens], [[5] * n for n in lens], [""] * 600, [""] * 600)
    spreads = {}
    for width in (1, 1000):
        tc = load_config(None, ["train.batch_tokens=256", f"train.bucket_width={width}"]).train
        batches = Trainer.epoch_batches(SimpleNamespace(train_data=data, tc=tc, dist=DistInfo()), 1)
        spreads[width] = statistics.mean(max(lens[i] for i in b) - min(lens[i] for i in b) for b in batches)
    assert spreads[1] < 1 < 10 < spreads[1000]


def test_make_batches_caps_and_overlong() -> None:
    src_lens, tgt_lens = [3, 50, 4, 3, 5, 2], [2, 60, 3, 4, 4, 1]
    batches = make_batches(src_lens, tgt_lens, max_tokens=20, max_sentences=2, shuffle=False)
    assert [1] in batches  # index 1 (target row 61 > 20 tokens) gets a batch of its own
    assert all(len(b) <= 2 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert make_batches(src_lens, None, max_tokens=10, shuffle=False) == [[5, 0, 3], [2, 4], [1]]
    assert padding_fraction([[0, 1]], [1, 3], None) == pytest.approx(2 / 6)


def test_collate_shapes_and_masks() -> None:
    batch = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], indices=[4, 2])
    assert batch.src.tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert batch.src_pad_mask.tolist() == [[False, False, False], [False, True, True]]
    assert batch.tgt_in.tolist() == [[BOS, 9, 10, PAD], [BOS, 11, 12, 13]]
    assert batch.tgt_out.tolist() == [[9, 10, EOS, PAD], [11, 12, 13, EOS]]
    assert batch.src.dtype == torch.long and batch.src_pad_mask.dtype == torch.bool
    assert (batch.indices, batch.n_src_tokens, batch.n_tgt_tokens) == ([4, 2], 4, 7)
    moved = batch.to("cpu").pin_memory()
    assert torch.equal(moved.tgt_out, batch.tgt_out)
    infer = collate([[5], [6, 7]], None, indices=[0, 1])
    assert infer.tgt_in.shape == (2, 0) and infer.tgt_out.shape == (2, 0) and infer.n_tgt_tokens == 0


def test_a_sentencepiece_vocabulary_too_small_for_the_text_names_its_key():
    """SentencePiece needs a piece per character: a smaller data.sp_vocab_size fails naming the key."""
    from cometnmt.config import load_config
    from cometnmt.data.corpus import ParallelCorpus
    from cometnmt.data.pipeline import build_codec

    cfg = load_config(None, ["data.tokenizer=sentencepiece", "data.sp_vocab_size=6"]).data
    corpus = ParallelCorpus(["Ein Hund läuft.", "Zwei Katzen."], ["A dog runs.", "Two cats."], "a.de", "a.en", 0)
    with pytest.raises(DataError, match=r"config key 'data.sp_vocab_size' \(de\): SentencePiece training .*vocab_size=6"):
        build_codec(cfg, corpus)
    # another SentencePiece failure is not blamed on the key (every such message holds "vocab_size=")
    from cometnmt.data.tokenizers import VocabSizeError, _train_sentencepiece

    with pytest.raises(DataError, match=r"^SentencePiece training .* failed") as info:
        _train_sentencepiece([], 50, "unigram", 1.0, 1)
    assert not isinstance(info.value, VocabSizeError)
    with pytest.raises(VocabSizeError):
        _train_sentencepiece(corpus.src, 6, "unigram", 1.0, 1)


def test_pairs_dropped_as_too_long_are_counted_naming_both_files_and_sides(caplog):
    """The message named the source file alone, so a target side too long (or tokenised into more
    pieces) looked like the source's fault; it now names both files and counts each side."""
    from cometnmt.config import load_config
    from cometnmt.data.corpus import ParallelCorpus
    from cometnmt.data.pipeline import build_codec, encode_pairs

    cfg = load_config(None, []).data  # spaCy: a word a token here
    corpus = ParallelCorpus(["a b", "a b c d", "a", "a b c d"], ["x", "x y", "x y z w", "x y z w"], "t.de", "t.en", 0)
    codec = build_codec(cfg, corpus)[0]
    with caplog.at_level(logging.INFO, logger="cometnmt"):
        kept = encode_pairs(codec, corpus, 3)
    assert kept.src_text == ["a b"]
    assert ("t.de / t.en: dropped 3 pairs longer than data.max_len=3 tokens (2 over it on the source side, "
            "2 on the target side)") in caplog.text


def test_the_vocabularies_count_only_the_pairs_kept_at_max_len():
    """build_codec counted the vocabularies on every training pair and encode_pairs then dropped those
    over data.max_len: a word seen only in a dropped pair got a row no gradient reached, and a word in
    a dropped pair counted towards data.min_freq. Now they count the pairs training keeps; with a
    max_len that keeps every pair, every word is in."""
    import dataclasses

    from cometnmt.config import load_config
    from cometnmt.data.corpus import ParallelCorpus
    from cometnmt.data.pipeline import build_codec, encode_pairs

    corpus = ParallelCorpus(["ein Hund", "ein Hund rennt", "ein Zebra rennt schnell weg"],
                            ["a dog", "a dog runs", "a zebra runs away quickly"], "t.de", "t.en", 0)
    short = load_config(None, ["data.max_len=3", "data.min_freq=1"]).data  # spaCy: a word a token
    codec, src_tokens, tgt_tokens = build_codec(short, corpus)
    assert "Zebra" not in codec.src_vocab and "zebra" not in codec.tgt_vocab  # only in the dropped pair
    assert "rennt" in codec.src_vocab and "runs" in codec.tgt_vocab
    assert len(src_tokens) == len(corpus)  # every pair's tokens, in order, as encode_pairs takes them
    assert encode_pairs(codec, corpus, short.max_len, (src_tokens, tgt_tokens)).src_text == corpus.src[:2]
    # "rennt" / "runs": once in a kept pair, once in the dropped one: rarer than min_freq 2 now
    codec = build_codec(dataclasses.replace(short, min_freq=2), corpus)[0]
    assert "rennt" not in codec.src_vocab and "runs" not in codec.tgt_vocab
    assert "Hund" in codec.src_vocab and "dog" in codec.tgt_vocab
    every = dataclasses.replace(short, max_len=5)  # keeps the long pair
    codec = build_codec(every, corpus)[0]
    assert "Zebra" in codec.src_vocab and "zebra" in codec.tgt_vocab
    assert "rennt" in build_codec(dataclasses.replace(every, min_freq=2), corpus)[0].src_vocab
    # a run resumed (or fine-tuned) keeps its checkpoint's codec, counted as it was: not rebuilt
    from cometnmt.data.pipeline import TextCodec
    from cometnmt.training.run import training_examples

    saved = TextCodec.from_state(codec.state_dict())
    run_cfg = load_config(None, ["data.max_len=3", "data.min_freq=1"])
    kept, data = training_examples(run_cfg, corpus, saved)
    assert kept is saved and "Zebra" in kept.src_vocab and len(data) == 2
    # subwords: the SentencePiece model is trained on every pair (the filter counts its pieces), the
    # vocabulary on the kept pairs' pieces: a character only the dropped pair holds is <unk>
    pieces = dataclasses.replace(short, tokenizer="sentencepiece", sp_vocab_size=40, max_len=8)
    codec, src_tokens, _ = build_codec(pieces, corpus)
    assert len(src_tokens[2]) > 8 >= max(len(src_tokens[0]), len(src_tokens[1]))
    assert "Z" in codec.src_tok._sp.encode("Z", out_type=str)[-1]  # the model knows it...
    assert not any("Z" in piece for piece in codec.src_vocab.itos)  # ...the vocabulary does not


def test_a_folder_as_a_data_file_names_the_config_key(tmp_path: Path) -> None:
    """data.train_tgt=/some/folder said only '<folder>: is a directory', without the key."""
    from cometnmt.config import DataConfig
    from cometnmt.data.pipeline import read_split

    (tmp_path / "t.de").write_text("Ein Hund.\n", encoding="utf-8")
    cfg = DataConfig(corpus="files", train_src=str(tmp_path / "t.de"), train_tgt=str(tmp_path))
    with pytest.raises(DataError, match=rf"^config key 'data.train_tgt': {tmp_path}: is a folder, expected a text file$"):
        read_split(cfg, "train")


def test_sentencepiece_trains_on_a_sentence_longer_than_its_default_limit():
    """SentencePiece's trainer skips, without a word, a sentence longer than its
    max_sentence_length (4192 bytes by default): the Greek letters of a 5,000-byte line, found
    nowhere else, had no piece and tokenised as <unk>. The limit is now the longest sentence."""
    greek = " ".join(["αβγδεζηθ"] * 320)  # 16 bytes a word: 5,439 UTF-8 bytes
    assert len(greek.encode("utf-8")) > 4192
    texts = ["a dog runs .", "two cats sleep .", greek, "a man walks ."]
    tok = SentencePieceTokenizer.train(texts, 60, seed=1)
    pieces = {tok._sp.id_to_piece(i) for i in range(len(tok._sp))}
    assert set("αβγδεζηθ") <= set("".join(pieces)), "the long sentence was skipped in training"
    assert tok.detokenize(tok.tokenize("αβγδεζηθ")) == "αβγδεζηθ"
