"""translate --buffer-size and --resume: the input read, translated and written chunk by chunk, an
interrupted -o FILE kept in FILE.partial and continued to the file an uninterrupted run writes."""

from __future__ import annotations

import io
import json
import shlex
import sys
import types

import pytest

import cometnmt
from conftest import tiny_train_cfg

LINES = ["Ein Hund läuft.", "Zwei Kinder spielen.", "", "Eine Frau.", "Ein Mann fährt Fahrrad.", "Ein Hund.", "Zwei."]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, data_dir):
    save = tmp_path_factory.mktemp("stream") / "run"
    cometnmt.train(tiny_train_cfg(save, data_dir, "train.num_threads=1"))
    return str(save / "best.pt")


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "src.de"
    path.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    return str(path)


def translate(capsys, *args: str) -> tuple[int, str, str]:
    from cometnmt import cli

    code = cli.main(["translate", *args, "--device", "cpu"])
    out, err = capsys.readouterr()
    return code, out, err


def columns(text: str) -> list[tuple]:
    """translate --nbest lines as (index, score, text)."""
    return [(int(i), float(s), t) for i, s, t in (line.split("\t") for line in text.splitlines())]


def same_output(chunked: str, whole: str, nbest: bool) -> None:
    """The translations byte for byte; an n-best score to float32 rounding in its 4th decimal
    (a sentence's scores move by 1e-4 with the batch it is searched in, as they do with --batch-size)."""
    if not nbest:
        assert chunked == whole
        return
    got, want = columns(chunked), columns(whole)
    assert [(i, t) for i, _, t in got] == [(i, t) for i, _, t in want]
    assert [s for _, s, _ in got] == pytest.approx([s for _, s, _ in want], abs=2e-4)


@pytest.mark.parametrize("options", [[], ["--beam", "3", "--nbest", "2"], ["--sampling", "--seed", "3", "--nbest", "2"]])
def test_any_buffer_size_writes_the_whole_inputs_output(ckpt, src, tmp_path, capsys, options):
    from cometnmt.cli import _output_lines

    translator = cometnmt.Translator.from_checkpoint(ckpt, device="cpu")
    nbest = "--nbest" in options
    decode = {"beam": 3, "nbest": 2} if "--beam" in options else {"sampling": True, "seed": 3, "nbest": 2} if nbest else {}
    whole = "".join(_output_lines(i, hyps, nbest) for i, hyps in enumerate(translator.translate(LINES, **decode)))
    for size in ("1", "3", "50"):
        out = tmp_path / f"out{size}.txt"
        assert translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", size, *options)[0] == 0
        same_output(out.read_text(encoding="utf-8"), whole, nbest)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(out.name)) == [out.name]  # no .partial left
        code, stdout, _ = translate(capsys, ckpt, "-i", src, "--buffer-size", size, *options)
        same_output(stdout, whole, nbest)


def test_stdout_gets_each_chunk_before_the_next_is_read(ckpt, capsys, monkeypatch):
    """Standard input read 2 lines at a time: a chunk's output is written and flushed before the
    next chunk is read (translate | head no longer waits for the whole input)."""
    data = "".join(line + "\n" for line in LINES).encode("utf-8")
    stdin = types.SimpleNamespace(buffer=io.BytesIO(data), isatty=lambda: False)
    events = []

    class Stdout(io.StringIO):
        def write(self, text):
            events.append(("write", text.count("\n"), stdin.buffer.tell()))
            return super().write(text)

        def flush(self):
            events.append(("flush",))

    stdout = Stdout()
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", stdout)
    from cometnmt import cli

    assert cli.main(["translate", ckpt, "--buffer-size", "2", "--device", "cpu"]) == 0
    writes = [e for e in events if e[0] == "write"]
    assert [lines for _, lines, _ in writes] == [2, 2, 2, 1]
    read_by_then = [position for _, _, position in writes]
    first_two = len("".join(line + "\n" for line in LINES[:2]).encode("utf-8"))
    assert read_by_then[0] == first_two < len(data)  # the first chunk is out while the rest is unread
    assert events[events.index(("write", *writes[0][1:])) + 1] == ("flush",)
    assert stdout.getvalue().count("\n") == len(LINES)


def _interrupt_at(monkeypatch, start: int, error=KeyboardInterrupt) -> None:
    """Translator.translate raises ``error`` on the chunk whose first line is line ``start`` (0-based)."""
    real = cometnmt.Translator.translate

    def translate(self, texts, *args, **kwargs):
        if kwargs.get("start") == start:
            raise error
        return real(self, texts, *args, **kwargs)

    monkeypatch.setattr(cometnmt.Translator, "translate", translate)


def test_an_interrupted_run_keeps_its_chunks_and_resume_finishes_the_same_file(ckpt, src, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.en"
    assert translate(capsys, ckpt, "-i", src, "-o", str(tmp_path / "whole.en"))[0] == 0
    whole = (tmp_path / "whole.en").read_text(encoding="utf-8")
    _interrupt_at(monkeypatch, 3)
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "3")
    assert code == 130 and not out.exists()
    partial = tmp_path / "out.en.partial"
    assert partial.read_text(encoding="utf-8") == "".join(whole.splitlines(keepends=True)[:3])  # the first chunk
    # said "3 lines translated (of the input's first) are kept in", which does not parse
    assert f"interrupted; the input's first 3 lines are translated and kept in {partial}; continue with: " in err
    record = json.loads((tmp_path / "out.en.partial.json").read_text(encoding="utf-8"))
    assert record["lines_done"] == 3 and record["belongs_to"]["decode"]["method"] == "greedy"
    monkeypatch.undo()
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "3")  # without --resume
    assert code == 2 and "continue it with --resume" in err and partial.exists()
    assert translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "2", "--resume")[0] == 0
    assert out.read_text(encoding="utf-8") == whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.en")) == ["out.en"]


def test_the_printed_command_continues_unseeded_sampling_with_its_seed(ckpt, src, tmp_path, capsys, monkeypatch):
    """Sampling without --seed draws one seed for the run; the command printed on the interrupt
    gives it, and the continued file is that seed's uninterrupted output."""
    out = tmp_path / "bt.en"
    _interrupt_at(monkeypatch, 2)
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "2", "--sampling", "--nbest", "2")
    assert code == 130
    command = shlex.split(err.split("continue with: ")[1].strip())
    assert command[:2] == ["cometnmt", "translate"] and command[-1] == "--resume" and "--seed" in command
    seed = command[command.index("--seed") + 1]
    monkeypatch.undo()
    from cometnmt import cli

    assert cli.main(command[1:]) == 0
    capsys.readouterr()
    assert translate(capsys, ckpt, "-i", src, "-o", str(tmp_path / "seeded.en"), "--sampling", "--nbest", "2",
                     "--seed", seed)[0] == 0
    same_output(out.read_text(encoding="utf-8"), (tmp_path / "seeded.en").read_text(encoding="utf-8"), nbest=True)


def test_a_record_of_another_translation_is_refused_naming_what_differs(ckpt, src, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.en"
    _interrupt_at(monkeypatch, 3)
    assert translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "3")[0] == 130
    monkeypatch.undo()
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--beam", "2", "--resume")
    assert code == 2 and "belongs to another translation" in err
    assert 'decode.beam_size: 5 there, 2 now' in err or 'decode.method: "greedy" there, "beam" now' in err
    changed = tmp_path / "changed.de"
    changed.write_text("Eine Katze.\n" + "".join(line + "\n" for line in LINES[1:]), encoding="utf-8")
    code, _, err = translate(capsys, ckpt, "-i", str(changed), "-o", str(out), "--resume")
    assert code == 2 and f'input: "{src}" there, "{changed}" now' in err
    changed.replace(src)  # the same path, its first line changed
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--resume")
    assert code == 2 and "its first 3 lines are not those whose translations" in err and "SHA-256 differs" in err
    assert (tmp_path / "out.en.partial").exists() and not out.exists()  # refused, nothing mixed or lost


def test_a_checkpoint_copied_anew_resumes_and_one_of_other_content_is_refused_naming_it(ckpt, src, tmp_path, capsys,
                                                                                          monkeypatch):
    """--resume refused a checkpoint whose modification time alone had changed (copied back with
    cp, unpacked or cloned again: the same bytes) as 'another translation'. The record now keeps
    each checkpoint's SHA-256, and a new time with the same content continues the run; other
    content is refused naming the file and both digests; a record without digests (an older
    cometnmt's) is still compared by the time, naming the file."""
    import os
    import shutil

    model = tmp_path / "model.pt"
    shutil.copyfile(ckpt, model)
    out = tmp_path / "out.en"
    assert translate(capsys, str(model), "-i", src, "-o", str(tmp_path / "whole.en"))[0] == 0
    _interrupt_at(monkeypatch, 3)
    assert translate(capsys, str(model), "-i", src, "-o", str(out), "--buffer-size", "3")[0] == 130
    monkeypatch.undo()
    record = tmp_path / "out.en.partial.json"
    before = json.loads(record.read_text(encoding="utf-8"))["belongs_to"]["checkpoints"]
    later = before[0]["modified_ns"] + 10**9
    os.utime(model, ns=(later, later))  # the same bytes with a new time, as cp or an unpack leaves them
    code, _, err = translate(capsys, str(model), "-i", src, "-o", str(out), "--resume")
    assert code == 0, err
    assert out.read_text(encoding="utf-8") == (tmp_path / "whole.en").read_text(encoding="utf-8")

    from cometnmt.streaming import checkpoint_differences, checkpoint_identity

    other = dict(before[0], sha256="0" * 64)  # the same path and size, other bytes
    [message] = checkpoint_differences([other], checkpoint_identity([model]))
    assert message.startswith(f"checkpoint {model.resolve()}: its content differs (SHA-256 000000000000... there, ")
    old_record = {k: v for k, v in before[0].items() if k != "sha256"}
    [message] = checkpoint_differences([old_record], checkpoint_identity([model]))
    assert message.startswith(f"checkpoint {model.resolve()}: modified ") and "no SHA-256" in message


def test_an_error_in_a_later_chunk_names_its_line_in_the_input_and_keeps_the_chunks_before(ckpt, tmp_path, capsys):
    src = tmp_path / "long.de"
    src.write_text("Ein Hund.\nZwei.\nEine Katze.\n" + " ".join(["Hund"] * 1100) + "\n", encoding="utf-8")
    out = tmp_path / "long.en"
    code, _, err = translate(capsys, ckpt, "-i", str(src), "-o", str(out), "--buffer-size", "2")
    assert code == 2 and f"{src}: input line 4: 1100 source tokens" in err
    assert "(the input's first 2 lines are translated and kept in" in err and "--resume" in err
    assert (tmp_path / "long.en.partial").read_text(encoding="utf-8").count("\n") == 2


def test_a_later_chunk_showing_utf16_keeps_no_misread_output_to_resume(ckpt, tmp_path, capsys, monkeypatch):
    """UTF-16 whose start did not show it (a pipe whose first line came alone: CJK text opening with
    上, U+4E0A, whose b"\\x0a\\x4e" gave the first chunk b"\\x0a", an empty line) was refused at
    its second chunk naming the wrong byte order (UTF-16BE), and the first chunk's translation, of
    misread text, was kept in FILE.partial "to continue with --resume once the input is fixed",
    which the converted input, other bytes, could never do. The error names UTF-16LE and that the
    start did not show it, and nothing is kept: no run resumes a translation of misread text."""
    data = "上海的一只狗在草地上奔跑。\n两个男人在街上说话。\n".encode("utf-16-le")
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(data), isatty=lambda: False))
    out = tmp_path / "zh.en"
    code, _, err = translate(capsys, ckpt, "-o", str(out), "--buffer-size", "1")
    assert code == 2 and "<stdin>:2: the input is probably UTF-16LE without a byte order mark, which its first byte " \
                         "did not show" in err, err
    assert "--resume" not in err and "iconv -f UTF-16LE -t UTF-8 FILE > FILE.utf8" in err, err
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # no FILE, FILE.partial or record


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="needs named pipes (POSIX)")
def test_a_pipe_is_read_as_a_file_is(tmp_path):
    """`cometnmt translate best.pt -i <(zcat src.de.gz)` (and `attention -i`, `evaluate --hyp`
    with a process substitution, or -i /dev/stdin) ended in a traceback, io.UnsupportedOperation
    "File or stream is not seekable": the reader read two bytes to look for gzip's magic number and
    sought back. It peeks at them now, and translate's progress bar no longer counts a pipe's lines
    first (which would read it, leaving the translation nothing)."""
    import gzip
    import os
    import threading

    from cometnmt.data.corpus import read_lines
    from cometnmt.streaming import ChunkedInput, count_lines

    def piped(data: bytes, name: str) -> str:
        fifo = tmp_path / name
        os.mkfifo(fifo)
        threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True).start()
        return str(fifo)

    text = "Ein Hund.\nZwei Katzen.\n".encode()
    counted = piped(text, "counted")
    assert count_lines(counted) is None  # not read: a pipe's lines are there once, for the reader
    assert read_lines(counted) == ["Ein Hund.", "Zwei Katzen."]
    assert read_lines(piped(text, "plain")) == ["Ein Hund.", "Zwei Katzen."]
    assert read_lines(piped(gzip.compress(text), "gzip")) == ["Ein Hund.", "Zwei Katzen."]
    chunked = ChunkedInput(piped(gzip.compress(text), "chunks"), 1)
    try:
        assert [lines for _, lines, _ in chunked.chunks()] == [["Ein Hund."], ["Zwei Katzen."]]
    finally:
        chunked.close()


def test_lines_not_in_nfc_are_warned_of_once_per_file_whatever_the_buffer_size(ckpt, tmp_path, capsys, caplog):
    """Each chunk warned of its own lines not in NFC: a large file gave a warning per 10,000
    lines, --buffer-size 2 one per two lines. The input is warned of once, when it is closed, with
    how many lines and the first (a summary of the lines read, at the end)."""
    import logging
    import unicodedata

    nfd = [unicodedata.normalize("NFD", line) for line in LINES]  # "läuft", "fährt" decomposed
    src = tmp_path / "nfd.de"
    src.write_text("".join(line + "\n" for line in [LINES[1], *nfd, nfd[0]]), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cometnmt"):
        code, _, _ = translate(capsys, ckpt, "-i", str(src), "-o", str(tmp_path / "out.en"), "--buffer-size", "2")
    assert code == 0
    warned = [r.getMessage() for r in caplog.records if "not in Unicode NFC" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{src}: 3 lines are not in Unicode NFC (first: line 2)"), warned


@pytest.mark.parametrize("n_lines,gz", [(5, False), (10, False), (25, False), (5, True), (0, False)])
def test_the_bar_total_of_an_input_within_one_chunk_is_counted_as_read_not_by_a_second_read(tmp_path, monkeypatch, n_lines, gz):
    """translate's progress bar counted the input's lines by reading the file once more before
    translating it (count_lines), decompressing a gzip input twice. ChunkedInput.total reads the
    first chunk ahead: an input that ends within it (fewer than --buffer-size lines) is counted as
    read, and only a longer one is counted by a second read. The chunks (their places, lines and
    digests) are those of an input never asked for its total."""
    import gzip

    from cometnmt import streaming

    text = "".join(f"Satz {i}.\n" for i in range(n_lines)).encode()
    path = tmp_path / ("in.txt.gz" if gz else "in.txt")
    path.write_bytes(gzip.compress(text) if gz else text)
    counted = []
    real_count = streaming.count_lines
    monkeypatch.setattr(streaming, "count_lines", lambda p: counted.append(p) or real_count(p))

    def chunks(ask_total: bool):
        source = streaming.ChunkedInput(str(path), 10)
        try:
            total = source.total() if ask_total else None
            return total, list(source.chunks())
        finally:
            source.close()

    total, got = chunks(True)
    assert total == n_lines and got == chunks(False)[1]
    assert [line for _, lines, _ in got for line in lines] == [f"Satz {i}." for i in range(n_lines)]
    assert counted == ([str(path)] if n_lines >= 10 else [])  # 10 lines: the end is not seen in the first chunk


def test_precision_is_a_search_setting_of_the_partial_output(ckpt, src, tmp_path, capsys, monkeypatch):
    """--precision bf16 is recorded with the search: the printed command continues with it, a resume
    without it is refused naming decode.precision, and the continued file is the uninterrupted bf16
    run's. A record written before decode.precision existed (no key) resumes as the fp32 search it was."""
    out = tmp_path / "out.en"
    assert translate(capsys, ckpt, "-i", src, "-o", str(tmp_path / "whole.en"), "--precision", "bf16")[0] == 0
    _interrupt_at(monkeypatch, 3)
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--buffer-size", "3", "--precision", "bf16")
    assert code == 130
    command = shlex.split(err.split("continue with: ")[1].strip())
    assert command[command.index("--precision") + 1] == "bf16"
    monkeypatch.undo()
    code, _, err = translate(capsys, ckpt, "-i", src, "-o", str(out), "--resume")
    assert code == 2 and 'decode.precision: "bf16" there, "fp32" now' in err
    from cometnmt import cli

    assert cli.main(command[1:] + ["--device", "cpu"]) == 0
    capsys.readouterr()
    assert out.read_text(encoding="utf-8") == (tmp_path / "whole.en").read_text(encoding="utf-8")

    older = tmp_path / "older.en"
    _interrupt_at(monkeypatch, 3)
    assert translate(capsys, ckpt, "-i", src, "-o", str(older), "--buffer-size", "3")[0] == 130
    monkeypatch.undo()
    record_path = tmp_path / "older.en.partial.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    del record["belongs_to"]["decode"]["precision"]
    record_path.write_text(json.dumps(record), encoding="utf-8")
    assert translate(capsys, ckpt, "-i", src, "-o", str(older), "--resume")[0] == 0
    assert translate(capsys, ckpt, "-i", src, "-o", str(tmp_path / "fp32.en"))[0] == 0
    assert older.read_text(encoding="utf-8") == (tmp_path / "fp32.en").read_text(encoding="utf-8")
