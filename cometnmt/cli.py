"""Command line: ``cometnmt train | translate | logprob | attention | evaluate | average | serve | reproduce | compare | render``.

Thin by design: parse arguments, load the config or checkpoint, call the library. Any
:class:`~cometnmt.errors.CometNMTError` becomes a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shlex
import signal
import sys
import threading
import traceback
from pathlib import Path

from cometnmt.atomic import refuse_overwrite
from cometnmt.errors import CheckpointError, CometNMTError, DataError, MisreadInputError
from cometnmt.interrupts import first_raises
from cometnmt.training.run_files import LAST_CHECKPOINT

log = logging.getLogger("cometnmt")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C (the trainer saves last.pt) but exiting 143 as a terminated process does."""


def _sigterm(signum, frame):  # pragma: no cover - exercised by an interrupted run
    raise _Terminated


def _say_failure(exc: KeyboardInterrupt) -> None:
    """An interrupt that came during a failure (``interrupts.deferred`` raises it from the failure):
    report the failure first, as it would have been reported alone (another rank's as one line that
    names it, the toolkit's errors as one line, others with their traceback); the interrupt's exit
    status wins (130, 143)."""
    cause = exc.__cause__
    if (line := _from_another_rank(cause)) is not None:
        _say_error(line)
    elif isinstance(cause, CometNMTError):
        _say_error(cause)
    elif isinstance(cause, Exception):
        traceback.print_exception(cause)


def _say_error(error: object) -> None:
    """``cometnmt: error: ERROR`` and its newline on standard error in one write: print() writes the
    text and the end apart, and where standard error is unbuffered (PYTHONUNBUFFERED=1, as torchrun
    runs are often launched) two ranks' lines on the terminal they share ran together ("...a bad
    linecometnmt: error: rank 1 of 2 ...")."""
    sys.stderr.write(f"cometnmt: error: {error}\n")
    sys.stderr.flush()


def _from_another_rank(exc: BaseException | None) -> str | None:
    """The line that shows ``exc`` where it is a rank's word of another rank's failure: that the
    other left the process group (``training.distributed.PeerLeft``), or the error it sent
    (``training.distributed.rank_error``: a toolkit error of the same class, or ``RankFailed``),
    as its ``relayed_line``, which names the rank, what it was doing and the error's class, not its
    message: the failing rank shows the error itself. None for any other error. One line, since
    its traceback, a collective's, says nothing of why, and the message would repeat the failing
    rank's. PeerLeft is looked up among the loaded modules: where training never ran, it cannot be one."""
    relayed = getattr(exc, "relayed_line", None)
    if relayed is not None:
        rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
        return f"rank {rank} of {world} stopped training: {relayed}"
    distributed = sys.modules.get("cometnmt.training.distributed")
    if distributed is not None and isinstance(exc, distributed.PeerLeft):
        return str(exc)
    return None


def _resume_command(command: list[str], accum_steps: int) -> str:
    """The command that continues an interrupted run (``command``: cometnmt's arguments): under
    torchrun a torchrun command with as many ranks, since a step consumes accum_steps x ranks
    micro-batches (the single-process command printed before resumed with fewer a step, a smaller
    batch than the run's). Another number of ranks resumes too: say how to keep the batch."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return shlex.join(["cometnmt", *command])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    launch = ["torchrun", "--standalone", f"--nproc_per_node={world}"] if local == world else ["torchrun", "..."]
    where = "" if local == world else f" (the run's --nnodes, --nproc_per_node={local} and rendezvous options)"
    return (f"{shlex.join([*launch, '-m', 'cometnmt', *command])}{where}; with another number of ranks, set "
            f"train.accum_steps so that accum_steps x ranks stays {accum_steps * world} micro-batches a step")


def cmd_train(args) -> int:
    cfg = None
    main_rank = int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 reports
    try:
        from cometnmt.config import load_config, origin_named
        from cometnmt.training.run import train

        cfg = load_config(args.config, args.set)
        with origin_named(args.config, args.set):  # training's own checks: the file's value or the override's
            summary = train(cfg, resume=args.resume, init_from=args.init_from)
    except KeyboardInterrupt as exc:
        _say_failure(exc)
        if not main_rank:  # under torchrun rank 0 says how to resume; the others would repeat it
            pass
        elif cfg is None:  # importing torch and the config's check take seconds; nothing is written yet
            print("interrupted while starting; nothing was written (run the same command again)", file=sys.stderr)
        elif (Path(cfg.train.save_dir).expanduser() / LAST_CHECKPOINT).exists():
            command = ["train", args.config, "--resume", *(a for o in args.set for a in ("--set", o))]
            print(f"interrupted; continue with: {_resume_command(command, cfg.train.accum_steps)}", file=sys.stderr)
        else:
            print(f"interrupted before the first checkpoint; nothing to resume in {cfg.train.save_dir}", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    except RuntimeError as exc:
        if (line := _from_another_rank(exc)) is None:
            raise
        _say_error(line)  # under torchrun, beside the error of the rank that failed
        return 1
    best = summary["best"]
    if not main_rank:
        return 0
    steps, epochs = summary["steps"], summary["epochs"]
    print(f"trained {steps} step{'s' * (steps != 1)}, {epochs} epoch{'s' * (epochs != 1)}; best validation "
          f"{'BLEU' if cfg.train.stopping == 'bleu_patience' else 'loss'} {best if best is None else round(best, 4)}; "
          f"checkpoints in {summary['save_dir']}")
    return 0


def _decode_cfg(base, args):
    from cometnmt.inference import decode_config

    return decode_config(base, args.beam, args.nbest, args.length_penalty, args.batch_sentences, sampling=args.sampling,
                         topk=args.topk, topp=args.topp, temperature=args.temperature, seed=args.seed,
                         replace_unk=args.replace_unk, precision=args.precision)


def _search_args(args) -> dict:
    """The sampling options, --replace-unk and --precision, as keywords of the library's functions."""
    return {"sampling": args.sampling, "topk": args.topk, "topp": args.topp, "temperature": args.temperature,
            "seed": args.seed, "replace_unk": args.replace_unk, "precision": args.precision}


def _checkpoints(paths) -> list[tuple[str, str]]:
    """The checkpoint arguments (one, or an ensemble's) as refuse_overwrite's inputs."""
    return [("checkpoint", path) for path in paths or ()]


def _dash_is_std(args, *names: str) -> None:
    """``-`` for a file option is standard input or output, as for most Unix tools (it was read
    or written as a file named '-')."""
    for name in names:
        if getattr(args, name) == "-":
            setattr(args, name, None)


# '-' is standard input for these, standard output for those (_dash_is_std); elsewhere it would be
# a file named '-': an input "not found", or an output written under that name (evaluate --hyp-out -
# left a file '-' beside the table on stdout), so another option given '-' is refused by name
_DASH_MEANS = "'-' is standard input for translate -i and evaluate --hyp, standard output for translate -o and logprob -o"


def _no_dash(args, **options: str) -> None:
    """Refuse ``-`` for the file ``options`` (flag -> attribute) that read or write files only."""
    for flag, name in options.items():
        if getattr(args, name, None) == "-":
            raise CometNMTError(f"{flag} -: give a file name ({_DASH_MEANS})")


def cmd_translate(args) -> int:
    from cometnmt.inference import Translator

    _dash_is_std(args, "input", "output")
    if args.output and Path(args.output).is_dir():  # before any work
        raise CometNMTError(f"-o {args.output}: is a directory, expected a file name to write")
    refuse_overwrite([("-o", args.output)], [("-i", args.input), *_checkpoints(args.checkpoint)])
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    if interactive and (args.input or args.output):
        raise CometNMTError("--interactive reads standard input and writes standard output: leave out -i and -o")
    if interactive and (args.resume or args.buffer_size is not None):
        raise CometNMTError(f"{'--resume' if args.resume else '--buffer-size'}: not with --interactive, which translates "
                            "each line as it comes")
    if args.resume and not args.output:
        raise CometNMTError("--resume continues an interrupted translation into -o FILE: give the same -o FILE")
    if args.buffer_size is not None and args.buffer_size < 1:
        raise CometNMTError(f"--buffer-size {args.buffer_size}: must be at least 1")
    try:
        translator = Translator.from_checkpoint(args.checkpoint, args.device)
    except CheckpointError as exc:  # `translate best.pt src.de` takes the source for an ensemble's second model
        if args.input is None and len(args.checkpoint) > 1 and ": not a checkpoint;" in str(exc):
            raise CheckpointError(f"{exc} (a source file? give it as -i FILE; every argument without an option "
                                  "is a checkpoint of an ensemble)") from None
        raise
    decode = _decode_cfg(translator.cfg.decode, args)
    translator._check_replace_unk(decode, flags=True)  # named as the flag given, before any input is read
    columns = args.nbest is not None or decode.nbest > 1  # an explicit --nbest 1 too, as logprob --nbest-input reads
    if interactive:
        return _translate_interactively(translator, decode, columns)
    return _translate_in_chunks(translator, _one_seed(decode), columns, args)


def _one_seed(decode):
    """Sampling without a seed: one drawn for the whole run (not one per chunk), so that the run is
    one seeded run, which --resume continues with that seed."""
    import dataclasses

    from cometnmt.decoding import sampling_seed

    if decode.method == "sample" and decode.sampling_seed is None:
        return dataclasses.replace(decode, sampling_seed=sampling_seed(decode))
    return decode


def _translate_in_chunks(translator, decode, columns: bool, args) -> int:
    """The input read, translated and written --buffer-size lines at a time (cometnmt.streaming):
    to standard output, flushed after each chunk, or appended to -o FILE's FILE.partial, renamed
    to FILE at the end. An interrupt or error after a chunk is done keeps FILE.partial for --resume."""
    from cometnmt.config import to_dict
    from cometnmt.progress import progress_bar
    from cometnmt.streaming import DEFAULT_BUFFER_SIZE, ChunkedInput, PartialOutput, checkpoint_identity

    source = ChunkedInput(args.input, args.buffer_size or DEFAULT_BUFFER_SIZE)
    out = bar = None
    try:
        if args.output:
            identity = {"input": str(Path(args.input).resolve()) if args.input else "<stdin>",
                        "checkpoints": checkpoint_identity(args.checkpoint), "decode": to_dict(decode)}
            out = PartialOutput(args.output, identity)
            out.open(args.resume)
            out.check_input(source)
        done = source.lines_read  # by a resumed run
        bar = progress_bar(total=source.total(), initial=done, desc="translate", unit="sent", leave=False)
        for start, lines, sha256 in source.chunks():
            text = _translate_chunk(translator, decode, columns, lines, start, source.name, bar)
            if out is not None:
                out.append(text, start + len(lines), sha256)
            elif not _write_stdout(text):
                return 0
    except BaseException as exc:
        if out is None or not out.abandon(keep=not isinstance(exc, MisreadInputError)):  # no resuming of misread text
            raise
        if bar is not None:  # before the message, which would share the bar's line
            bar.close()
            bar = None
        return _kept(out, exc, _continue_command(args, decode))
    finally:
        if bar is not None:
            bar.close()
        source.close()
    if out is not None:
        out.finish()
    return 0


def _translate_chunk(translator, decode, columns: bool, lines: list[str], start: int, name: str, bar) -> str:
    """One chunk's output; ``start``: the place of its first line in the input (n-best indices,
    sampling's streams and errors' line numbers count in the whole input)."""
    from cometnmt.inference import read_from_files

    try:
        with read_from_files():  # the readers warned of text not in NFC, naming the file and line
            results = translator.translate(lines, decode, progress=bar, start=start)
    except DataError as exc:  # name the input, and the line in it ("input line 3" counted in the chunk)
        message = re.sub(r"^input line (\d+):", lambda m: f"input line {int(m.group(1)) + start}:", str(exc))
        raise DataError(f"{name}: {message}") from None
    return "".join(_output_lines(start + i, hyps, columns) for i, hyps in enumerate(results))


def _write_stdout(text: str) -> bool:
    """Write a chunk's output to standard output at once; False when the reader is gone
    (``translate | head``): the rest is not translated, and the exit is quiet."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # Python's flush at exit would fail again
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False
    return True


def _kept(out, exc: BaseException, command: str) -> int:
    """After an interrupt or error with chunks done: say what is kept in FILE.partial and how to
    continue; an interrupt exits 130 (143 for SIGTERM), an error goes on to main."""
    done = "line is" if out.lines_done == 1 else f"{out.lines_done} lines are"
    kept = f"the input's first {done} translated and kept in {out.partial}"
    if isinstance(exc, KeyboardInterrupt):
        print(f"interrupted; {kept}; continue with: {command}", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    if isinstance(exc, CometNMTError):
        raise type(exc)(f"{exc} ({kept}; once the input is fixed, continue with: {command})") from None
    log.error("%s; continue with: %s", kept, command)
    raise exc


def _continue_command(args, decode) -> str:
    """The translate command that continues this one with --resume (a drawn sampling seed given as
    --seed; standard input must be given again)."""
    options = [("-i", args.input), ("-o", args.output), ("--beam", args.beam), ("--nbest", args.nbest),
               ("--length-penalty", args.length_penalty), ("--sampling", args.sampling), ("--topk", args.topk),
               ("--topp", args.topp), ("--temperature", args.temperature),
               ("--seed", decode.sampling_seed if decode.method == "sample" else None),
               ("--replace-unk", args.replace_unk), ("--precision", args.precision), ("--batch-size", args.batch_sentences),
               ("--buffer-size", args.buffer_size), ("--device", None if args.device == "auto" else args.device)]
    command = ["cometnmt", "translate", *args.checkpoint]
    for flag, value in options:
        if value is True:
            command.append(flag)
        elif value is not None and value is not False:
            command += [flag, str(value)]
    return shlex.join([*command, "--resume"]) + ("" if args.input else " < INPUT (the same standard input)")


def _output_lines(index: int, hyps, columns: bool) -> str:
    """translate's output for source line ``index`` (0-based): its best translation, or in
    ``columns`` (n-best lists) a line per hypothesis: the index, the score and the text, tab-separated."""
    if columns:
        return "".join(f"{index}\t{h.score:.4f}\t{h.text}\n" for h in hyps)
    return hyps[0].text + "\n"


def _translate_interactively(translator, decode, columns: bool) -> int:
    """A line in, its translation out at once (standard input a terminal, or --interactive): a
    line that cannot be translated gets its error on stderr and the session goes on; Ctrl-D ends.
    UTF-16 or UTF-32 input is judged once, from the first line and the bytes already there after it
    (wide_encoding, ready_bytes: no wait for a line not yet sent), and every line is refused naming
    it: split at b"\\n", a line alone may show another byte order, or none. Such a line's errors
    name its line and column in the input's own lines and characters (corpus.WidePlace), not the
    count of 0x0a bytes read, which stand inside its characters too; a piece that only finishes the
    character the line before cut (UTF-16LE's b"\\0" after the b"\\n" of its line break) is no line,
    and gets no error of its own. Input whose start did not show it (a pipe whose first line came
    alone) is refused from the line that does (corpus.later_wide_encoding), and every line after it."""
    from cometnmt.data.corpus import (WidePlace, decode_lines, later_wide_encoding, misread_wide_error, ready_bytes,
                                      unit_rest, wide_encoding)
    from cometnmt.inference import read_from_files

    if sys.stdin.isatty():
        print("type a sentence and press Enter; Ctrl-D ends", file=sys.stderr, flush=True)
    number, offset, encoding, place = 0, 0, None, None  # offset: the input's bytes before this line
    while raw := sys.stdin.buffer.readline():
        number += 1
        if number == 1:
            encoding = wide_encoding(raw + ready_bytes(sys.stdin.buffer))
            place = WidePlace(encoding) if encoding else None
        try:  # warnings name the session's line
            if encoding and len(raw) <= unit_rest(encoding, offset):
                continue  # the rest of a character the line before cut, refused with that line
            line = (decode_lines(raw, "<stdin>", first_line=number, encoding=encoding, place=place) or [""])[0]
            # start: a seeded session samples line N as a file's line N is sampled
            with read_from_files():  # decode_lines warned of a line not in NFC
                out = _output_lines(number - 1, translator.translate([line], decode, start=number - 1)[0], columns)
        except DataError as exc:  # "<stdin>:N: ..." or "input line 1: ...": say which line of the session
            if number > 1 and encoding is None and (shown := later_wide_encoding(raw, offset)):
                exc, encoding = misread_wide_error("<stdin>", shown, offset, number), shown  # and every line after
            # N: the line decode_lines names, the session's (of UTF-16/32 input, where the column is)
            named = re.match(r"<stdin>:(\d+): ", str(exc))
            where = named.group(1) if named else number
            _say_error(f"line {where}: {str(exc).split(': ', 1)[-1]}")
            continue
        finally:
            offset += len(raw)
            if place is not None:
                place.advance(raw)
        sys.stdout.write(out)
        sys.stdout.flush()
    return 0


_NBEST_LINE = re.compile(r"\d+\t[-+0-9.eEinfINFa]+\t")  # translate --nbest: index, score, text


def _refuse_nbest_columns(name: str, lines: list[str] | None, hint: str) -> None:
    """translate --nbest's columns (index, score, text) read as text scored the index and score as
    words. Checked before the line count: N lines per source line would be refused as misaligned."""
    if lines and all(_NBEST_LINE.match(line) for line in lines):
        raise DataError(f"{name}: every line is 'index<TAB>score<TAB>text', translate --nbest output; {hint}")


def _read_nbest(path: str, n_sources: int) -> tuple[list[int], list[str]]:
    """``translate --nbest`` output (index, score, text; tab-separated) -> source indices and texts."""
    from cometnmt.data.corpus import read_lines

    index, texts = [], []
    for number, line in enumerate(read_lines(path), 1):
        fields = line.split("\t", 2)
        if len(fields) != 3 or not fields[0].isdigit():
            raise DataError(f"{path}, line {number}: expected 'INDEX<tab>SCORE<tab>TEXT' as translate --nbest writes")
        if int(fields[0]) >= n_sources:
            raise DataError(f"{path}, line {number}: source index {fields[0]}, but the source has {n_sources} lines")
        index.append(int(fields[0]))
        texts.append(fields[2])
    return index, texts


def _logprob_pairs(args) -> tuple[list[str], list[str], list[int]]:
    """The sources, targets and each target's source line (0-based) that ``logprob`` scores."""
    from cometnmt.data.corpus import read_lines

    sources = read_lines(args.input)
    if args.nbest_input:
        index, targets = _read_nbest(args.target, len(sources))
    else:
        targets = read_lines(args.target)
        _refuse_nbest_columns(args.target, targets, "give --nbest-input to rescore it (or the translations alone: cut -f3)")
        if len(targets) != len(sources):
            raise DataError(f"{args.target} has {len(targets)} lines but {args.input} has {len(sources)} "
                            "(-t and -i); they must be line-aligned (or give --nbest-input for translate --nbest output)")
        index = list(range(len(sources)))
    return [sources[i] for i in index], targets, index


def _name_the_file(args, index: list[int], exc: DataError) -> DataError:
    """"source line 3: ..." or "target line 3: ..." from Translator.log_prob, with the file it is
    in (and, for an n-best row, the line of its source)."""
    message = str(exc)
    if message.startswith("source line ") and args.nbest_input:
        row = int(message.split()[2].rstrip(":"))
        message = f"source line {index[row - 1] + 1}:" + message.split(":", 1)[1]
    return DataError(f"{args.target if message.startswith('target line') else args.input}: {message}")


def cmd_logprob(args) -> int:
    import math

    from cometnmt.data.corpus import write_text_file
    from cometnmt.evaluation import write_json
    from cometnmt.inference import Translator, read_from_files

    _dash_is_std(args, "output")
    _no_dash(args, **{"-i": "input", "-t": "target", "--json": "json"})
    for option, path in (("-o", args.output), ("--json", args.json)):
        if path and Path(path).is_dir():  # before any work
            raise CometNMTError(f"{option} {path}: is a directory, expected a file name to write")
    refuse_overwrite([("-o", args.output), ("--json", args.json)],
                     [("-i", args.input), ("-t", args.target), *_checkpoints(args.checkpoint)])
    if args.batch_sentences is not None and args.batch_sentences < 1:
        raise CometNMTError(f"--batch-size {args.batch_sentences}: must be at least 1")
    sources, targets, index = _logprob_pairs(args)
    if not sources:  # 0 nats over 0 tokens would print as perplexity 1.00
        raise DataError(f"{args.target if args.nbest_input else args.input}: no lines to score")
    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    try:
        with read_from_files():  # the readers warned of text not in NFC, naming the file and line
            scores = translator.log_prob(sources, targets, batch_size=args.batch_sentences, progress=True)
    except DataError as exc:
        raise _name_the_file(args, index, exc) from None
    if args.nbest_input:
        lines = [f"{i}\t{s.log_prob:.4f}\t{text}" for i, s, text in zip(index, scores, targets)]
    else:
        lines = [f"{s.log_prob:.4f}\t{s.tokens}" for s in scores]
    text = "".join(line + "\n" for line in lines)
    if args.output:
        write_text_file(args.output, text)
    else:
        sys.stdout.write(text)
    tokens = sum(s.tokens for s in scores)
    nll = -sum(s.log_prob for s in scores) / max(tokens, 1)
    summary = {"checkpoints": list(args.checkpoint), "pairs": len(scores), "target_tokens": tokens,
               "unknown_tokens": sum(s.unknown for s in scores), "nll_per_token": nll, "perplexity": perplexity(nll),
               "log_probs": [s.log_prob for s in scores], "tokens": [s.tokens for s in scores]}
    print(f"{summary['pairs']} pairs, {tokens} target tokens (</s> included; {summary['unknown_tokens']} unknown to the "
          f"vocabulary, scored as <unk>): {nll:.4f} nats per token, perplexity {summary['perplexity']:.2f}", file=sys.stderr)
    if args.json:
        write_json(summary, args.json)
    return 0


def perplexity(nll: float) -> float:
    """exp(nats per token), inf past a float's range: math.exp raised OverflowError above ~709.78
    nats a token (a model that puts almost nothing on the targets), after the scores were written
    and before the totals were printed or --json was written."""
    import math

    try:
        return math.exp(nll)
    except OverflowError:
        return math.inf


_HEATMAP = re.compile(r"line_\d{4,}\.png")  # the names cmd_attention gives its plots


def cmd_attention(args) -> int:
    import json

    from cometnmt.data.corpus import read_lines, write_text_file
    from cometnmt.inference import Translator, read_from_files
    from cometnmt.plots import plot_attention
    from cometnmt.progress import progress_bar

    _no_dash(args, **{"-i": "input", "-t": "target", "--out": "out"})
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CometNMTError(f"--out {out}: is a file, expected a folder to write into")
    inputs = [("-i", args.input), ("-t", args.target), *_checkpoints([args.checkpoint])]
    # what it writes in --out: attention.jsonl and line_0001.png on (only the names an input has are compared)
    written = {"attention.jsonl"} | {Path(p).name for _, p in inputs if p and _HEATMAP.fullmatch(Path(p).name)}
    refuse_overwrite([("--out", out / name) for name in sorted(written)], inputs)
    for option, value, low in (("--plots", args.plots, 0), ("--batch-size", args.batch_sentences, 1)):
        if value is not None and value < low:
            raise CometNMTError(f"{option} {value}: must be at least {low}")
    sources = read_lines(args.input)
    targets = read_lines(args.target) if args.target else None
    _refuse_nbest_columns(args.target, targets, "give the translations alone (cut -f3 of --nbest 1's lines)")
    if targets is not None and len(targets) != len(sources):
        raise DataError(f"{args.target} has {len(targets)} lines but {args.input} has {len(sources)} (-t and -i); "
                        "they must be line-aligned")
    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    try:
        with read_from_files():  # the readers warned of text not in NFC, naming the file and line
            maps = translator.attention(sources, targets, layer=args.layer, batch_size=args.batch_sentences,
                                        progress=True, flags=True)
    except DataError as exc:
        message = str(exc)
        # without -t the targets are the model's translations of -i's lines ("None: target line 1")
        raise DataError(f"{args.target if args.target and message.startswith('target line') else args.input}: "
                        f"{message}") from None
    out.mkdir(parents=True, exist_ok=True)
    records = [{"line": i + 1, "layer": m.layer, "source": m.source, "target": m.target,
                "weights": [[round(w, 4) for w in row] for row in m.weights]} for i, m in enumerate(maps)]
    write_text_file(out / "attention.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    shown = maps[: args.plots]
    stale = [p for p in out.glob("line_*.png") if _HEATMAP.fullmatch(p.name)]
    for path in stale:  # an earlier run's heatmaps would stand beside this run's attention.jsonl
        path.unlink()
    if stale:
        log.info("removed %d heatmaps of an earlier run from %s", len(stale), out)
    for i, amap in enumerate(progress_bar(shown, desc="plots", unit="png", disable=len(shown) < 2, leave=False)):
        # counted among the layers that attend to the source, as --layer counts them (the RNN's one
        # attention reads the top of a decoder of model.rnn.dec_layers layers)
        plot_attention(amap, out / f"line_{i + 1:04d}.png", f"{Path(args.input).name}, line {i + 1}; attention layer {amap.layer + 1} of "
                       f"{len(translator.model.cross_attention_modules())}, heads averaged")
    print(f"{len(maps)} pair{'s' * (len(maps) != 1)}: {out / 'attention.jsonl'}; "
          f"{len(shown)} heatmap{'s' * (len(shown) != 1)} {out}/line_*.png", file=sys.stderr)
    return 0


def cmd_evaluate(args) -> int:
    from cometnmt.data.corpus import read_lines, read_stdin_lines
    from cometnmt.data.pipeline import read_text_file
    from cometnmt.evaluation import format_table, language_code, score, write_json

    hyp_stdin = args.hyp == "-"
    _no_dash(args, **{"--ref": "ref", "--src": "src", "--json": "json", "--hyp-out": "hyp_out"})
    for option, path in (("--json", args.json), ("--hyp-out", args.hyp_out)):
        if path and Path(path).is_dir():  # before any work
            raise CometNMTError(f"{option} {path}: is a directory, expected a file name to write")
    # each mode's options are refused in the other, rather than silently ignored
    file_options = {"--hyp": args.hyp, "--ref": args.ref, "--src": args.src, "--lang": args.lang,
                    "--src-lang": args.src_lang}
    checkpoint_options = {"--split": args.split, "--limit": args.limit, "--hyp-out": args.hyp_out, "--beam": args.beam,
                          "--nbest": args.nbest,
                          "--length-penalty": args.length_penalty, "--batch-size": args.batch_sentences,
                          **{f"--{key.replace('_', '-')}": value for key, value in _search_args(args).items()}}
    given = [option for option, value in (file_options if args.checkpoint else checkpoint_options).items()
             if value is not None]
    if given:
        raise CometNMTError(f"{', '.join(given)}: only without --checkpoint (to score --hyp against --ref)"
                            if args.checkpoint else
                            f"{', '.join(given)}: only with --checkpoint (to translate a split and score it)")
    refuse_overwrite([("--json", args.json), ("--hyp-out", args.hyp_out)],
                     [("--hyp", None if hyp_stdin else args.hyp), ("--ref", args.ref), ("--src", args.src),
                      *(("--checkpoint", path) for path in args.checkpoint or ())])
    if args.checkpoint:
        from cometnmt.api import evaluate_checkpoint

        if args.lowercase:
            raise CometNMTError("--lowercase: with --checkpoint the model's data.lowercase decides")
        if args.nbest is not None and args.nbest != 1:
            raise CometNMTError(f"--nbest {args.nbest}: evaluate scores the best hypothesis only")
        if args.limit is not None and args.limit < 1:  # before the checkpoint loads
            raise CometNMTError(f"--limit {args.limit}: a number of sentences, at least 1")
        result, _ = evaluate_checkpoint(args.checkpoint, args.split or "test", beam=args.beam, limit=args.limit,
                                        length_penalty=args.length_penalty, batch_size=args.batch_sentences,
                                        device=args.device, progress=True, flags=True, hyp_out=args.hyp_out,
                                        json_out=args.json, **_search_args(args))  # it writes both
    else:
        if not (args.hyp and args.ref):
            raise CometNMTError("evaluate needs --hyp FILE --ref FILE, or --checkpoint CKPT [--split SPLIT]")
        lang = "en" if args.lang is None else language_code(args.lang, "lang", "--lang")
        src_lang = "de" if args.src_lang is None else language_code(args.src_lang, "src_lang", "--src-lang")
        refs = read_text_file(args.ref)  # an empty hypothesis scores zero
        if not refs:  # score's own error ("the reference set is empty") names no file
            raise DataError(f"{args.ref}: no references (an empty file)")
        hyps = read_stdin_lines() if hyp_stdin else read_lines(args.hyp)
        src = read_text_file(args.src) if args.src else None
        _refuse_nbest_columns("<stdin>" if hyp_stdin else args.hyp, hyps,
                              "give the translations alone (cut -f3 of --nbest 1's lines)")
        for option, name, lines in (("--hyp", "<stdin>" if hyp_stdin else args.hyp, hyps), ("--src", args.src, src)):
            if lines is not None and len(lines) != len(refs):
                raise DataError(f"{name} has {len(lines)} lines but {args.ref} has {len(refs)} ({option} and --ref); "
                                "they must be line-aligned")
        if args.lang is None:
            log.info("tokenised metrics (the paper's, BLEU by length) use spaCy's English rules, and BLEU sacreBLEU's "
                     "tokeniser for English (13a): give --lang for another target language")
        if args.src and args.src_lang is None:  # BLEU by length counted a French source's words as German
            log.info("BLEU by source length counts --src's words with spaCy's German rules: give --src-lang for "
                     "another source language")
        result = score(hyps, refs, lang=lang, src=src, src_lang=src_lang, lowercase=args.lowercase)
        if args.json:
            write_json(result, args.json)
    print(format_table(result))
    return 0


def cmd_average(args) -> int:
    from cometnmt.api import average_checkpoints, last_epoch_checkpoints

    _no_dash(args, **{"-o": "output", "--dir": "dir"})
    paths = list(args.checkpoints)
    if (args.last is None) != (args.dir is None):
        raise CometNMTError("--dir and --last go together: --dir RUN_FOLDER --last N averages its last N epoch checkpoints")
    if args.last is not None:
        paths += last_epoch_checkpoints(args.dir, args.last, flags=True)
    if not paths:
        raise CometNMTError("no checkpoints to average: name them (cometnmt average A.pt B.pt -o avg.pt), or give "
                            "--dir RUN_FOLDER --last N for a run's last N epoch checkpoints")
    average_checkpoints(paths, args.output, flags=True)
    print(f"averaged {len(paths)} checkpoint{'s' * (len(paths) != 1)} into {args.output}")
    return 0


def cmd_serve(args) -> int:
    """Ctrl-C or SIGTERM (what systemd, Docker and Kubernetes send to stop it) stops the server:
    it accepts no more connections, closes those whose next request has not arrived whole (idle
    keep-alive ones, slow clients still sending a request's head), gives the requests being answered
    up to 5 seconds to finish (TranslationServer.server_close), says so and exits 0, since stopping is how a server ends,
    not work cut short (train and translate exit 130/143: their work is unfinished; systemd counts
    143 as a failure). Left to SIGTERM's default, the process died at once (143, no message) with
    answers half sent, bypassing the close that keeps a response thread from aborting the process.
    While the imports run and the model is still loading, either signal is an interruption, said in one line
    ("stopped (SIGTERM) while starting, before serving"; the program, ``cometnmt`` or ``python -m cometnmt``,
    says it for a SIGTERM during its own imports too: cometnmt/__main__.py): 130 (Ctrl-C) or 143."""
    try:
        from cometnmt.serve import make_server

        server = make_server(args.checkpoint, args.host, args.port, args.device, beam=args.beam, nbest=args.nbest,
                             length_penalty=args.length_penalty, batch_size=args.batch_sentences,
                             max_sentences=args.max_sentences, max_beam=args.max_beam, max_chars=args.max_chars,
                             nfc_warning_interval=args.nfc_warning_interval, max_batch_sentences=args.max_batch_sentences,
                             batch_wait_ms=args.batch_wait_ms, max_batch_chars=args.max_batch_chars, flags=True,
                             **_search_args(args))
    except KeyboardInterrupt as exc:  # said "interrupted", which did not tell a stop before serving from one after
        how = "SIGTERM" if isinstance(exc, _Terminated) else "Ctrl-C"
        print(f"cometnmt serve: stopped ({how}) while starting, before serving", file=sys.stderr, flush=True)
        return 143 if isinstance(exc, _Terminated) else 130
    host, port = server.server_address[:2]
    print(f"serving {' + '.join(args.checkpoint)} on http://{host}:{port} (POST /translate, POST /logprob, GET /health); "
          "Ctrl-C or SIGTERM stops", file=sys.stderr, flush=True)
    how = "shut down"
    try:
        server.serve_forever()
    except KeyboardInterrupt as exc:
        how = "SIGTERM" if isinstance(exc, _Terminated) else "Ctrl-C"
    finally:
        server.server_close()
    if server.still_running():  # still answering after the wait: a thread stopped by the interpreter's exit inside
        # torch's C++ code aborted the process ("terminate called without an active exception", exit 134), so the
        # exit skips that; a request still being worked on gets 503 and Retry-After, so its client can send it again
        refused, cut = server.refuse_running()
        said = [f"{n} request{'s' * (n != 1)} still being answered after 5 s {what}" for n, what in
                ((refused, "got 503 Service Unavailable (send again)"),
                 (cut, "cut off (the connection closes without an answer)")) if n]
        print(f"cometnmt serve: stopped ({how})" + "".join(f"; {line}" for line in said), file=sys.stderr, flush=True)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    print(f"cometnmt serve: stopped ({how})", file=sys.stderr, flush=True)
    return 0


def _runs_interruptibly(run, args) -> int:
    """reproduce/compare: Ctrl-C or SIGTERM stops the running trainings (each saves last.pt) and
    starts no other; the same command later resumes them."""
    try:
        return run(args)  # says whether it wrote OUT/report.md
    except KeyboardInterrupt as exc:
        print(f"interrupted; the runs in {args.out} resume when you run the same command again", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130


def cmd_reproduce(args) -> int:
    from cometnmt.reproduce import run_reproduce

    return _runs_interruptibly(run_reproduce, args)


def cmd_compare(args) -> int:
    from cometnmt.compare import run_compare

    return _runs_interruptibly(run_compare, args)


def cmd_render(args) -> int:
    from cometnmt.render import render_report

    print(f"report written to {render_report(Path(args.report_json), Path(args.out) if args.out else None)}")
    return 0


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, help="beam size (1 = greedy); default: the checkpoint's decode config")
    p.add_argument("--nbest", type=int, help="hypotheses per sentence (beam search; above 1 on a checkpoint of greedy search, "
                                             "a beam of its decode.beam_size), or samples per sentence (--sampling)")
    p.add_argument("--length-penalty", dest="length_penalty", type=float, help="GNMT length penalty alpha")
    p.add_argument("--sampling", action="store_true", default=None,
                   help="draw each token at random (e.g. for back-translation; not with --beam); scores are the model's "
                        "log-probabilities of the samples")
    p.add_argument("--topk", type=int, metavar="K",
                   help="with --sampling: draw from the K most probable tokens only (0: all; default: the checkpoint's, usually 0)")
    p.add_argument("--topp", type=float, metavar="P",
                   help="with --sampling: nucleus, the most probable tokens up to probability P (after --topk; "
                        "1: off; default: the checkpoint's, usually 1)")
    p.add_argument("--temperature", type=float, metavar="T",
                   help="with --sampling: divide the logits by T (default: the checkpoint's, usually 1)")
    p.add_argument("--seed", type=int, metavar="S",
                   help="with --sampling: repeatable samples (line i's come from a stream keyed by S and i, whatever the "
                        "--batch-size); default: a seed drawn at random")
    p.add_argument("--replace-unk", dest="replace_unk", action="store_true", default=None,
                   help="put the source word the decoder attends to most in place of each <unk> of the output (word "
                        "vocabularies, data.tokenizer spacy); default: the checkpoint's decode.replace_unk, usually off")
    p.add_argument("--batch-size", dest="batch_sentences", type=int, help="sentences per batch")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),  # config.PRECISIONS (config imports torch)
                   help="the search's arithmetic: fp32, or bf16 / fp16 under autocast (bf16: faster on CPUs with AMX "
                        "and on GPUs from Ampere; fp16: GPUs); default: the checkpoint's decode.precision, usually fp32")
    _device_option(p)


def _device_option(p: argparse.ArgumentParser) -> None:
    """--device of a command that loads a model in this process: main checks it before the command
    runs (reproduce's and compare's go to their runs' training, and --report-only uses none)."""
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.set_defaults(loads_a_model=True)


def _train_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML file, e.g. configs/multi30k/transformer.yaml; every key with its default and "
                                  "meaning: configs/reference.yaml; for your own parallel text (data.corpus: files, "
                                  "data.train_src, ...) see README, 'Your own parallel text'")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. train.lr=3e-4")
    p.add_argument("--resume", action="store_true", help=f"continue the run in train.save_dir from {LAST_CHECKPOINT}")
    p.add_argument("--init-from", dest="init_from", metavar="CKPT",
                   help="start a new run from a trained checkpoint's weights and vocabularies (fine-tuning; fresh optimizer "
                        "and schedule); the config's model and vocabulary keys must fit the checkpoint")


def _translate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="+", help="a checkpoint; several are an ensemble (their probabilities averaged)")
    p.add_argument("-i", "--input", help="source file (plain or gzip); default (or -) stdin")
    p.add_argument("-o", "--output", help="output file, written through FILE.partial (see --resume) and complete or not "
                                          "at all; default (or -) stdout")
    p.add_argument("--interactive", action="store_true",
                   help="translate each line of standard input as it comes (the default when it is a terminal)")
    p.add_argument("--buffer-size", dest="buffer_size", type=int, metavar="N",
                   help="read, translate and write the input N lines at a time (default 10000): output comes chunk by "
                        "chunk, and an interrupted -o FILE keeps its finished chunks in FILE.partial; any N writes the "
                        "same output")
    p.add_argument("--resume", action="store_true",
                   help="with -o FILE: continue the interrupted translation kept in FILE.partial (and FILE.partial.json), "
                        "from its first unfinished line; the input, checkpoints and search settings must be the same")
    _add_decode_args(p)


def _logprob_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="+", help="a checkpoint; several are an ensemble (their probabilities averaged)")
    p.add_argument("-i", "--input", required=True, help="source file (plain or gzip), one sentence per line")
    p.add_argument("-t", "--target", required=True,
                   help="target file: one translation per source line, or translate --nbest output with --nbest-input")
    p.add_argument("--nbest-input", dest="nbest_input", action="store_true",
                   help="the target file is translate --nbest output (INDEX, SCORE, TEXT); written back with new scores")
    p.add_argument("-o", "--output", help="output file (default, or -: stdout): per line the log-probability (natural log, "
                   "summed over the target's tokens and </s>) and the token count, tab-separated")
    p.add_argument("--json", help="also write the totals (tokens, nats per token, perplexity) and every score here")
    p.add_argument("--batch-size", dest="batch_sentences", type=int, help="sentences per batch")
    _device_option(p)


def _attention_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a checkpoint")
    p.add_argument("-i", "--input", required=True, help="source file (plain or gzip), one sentence per line")
    p.add_argument("-t", "--target", help="line-aligned translations to attend with (default: the model's own, "
                   "with its checkpoint's search)")
    p.add_argument("--out", required=True, help="folder for attention.jsonl and line_NNNN.png")
    p.add_argument("--layer", type=int, default=-1,
                   help="which of the decoder's attentions over the source, 0-based (default -1, the last): one per "
                        "decoder layer for the Transformer family and ConvS2S, the RNN's one, after its top layer, "
                        "whatever model.rnn.dec_layers")
    p.add_argument("--plots", type=int, default=20, help="heatmaps for the first N lines (default 20; 0: none)")
    p.add_argument("--batch-size", dest="batch_sentences", type=int, help="sentences per batch")
    _device_option(p)


def _evaluate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hyp", help="hypothesis file (-: standard input, e.g. piped from translate)")
    p.add_argument("--ref", help="reference file")
    p.add_argument("--src", help="source file (adds BLEU by source length)")
    p.add_argument("--lang", help="with --hyp/--ref: target language for tokenised metrics and BLEU's tokeniser "
                                  "(sacreBLEU's for it: zh for Chinese, say; default en)")
    p.add_argument("--src-lang", dest="src_lang", help="with --hyp/--ref/--src: source language (default de)")
    p.add_argument("--checkpoint", nargs="+", help="translate a data split with this checkpoint (several: an ensemble), then score it")
    p.add_argument("--split", choices=["train", "valid", "test"], help="with --checkpoint (default test)")
    p.add_argument("--limit", type=int, metavar="N",
                   help="with --checkpoint: translate and score only the first N sentences of the split (smoke runs; "
                        "the table and --json say how many of its lines)")
    p.add_argument("--hyp-out", dest="hyp_out", help="with --checkpoint: also write the translations here")
    p.add_argument("--lowercase", action="store_true",
                   help="score lowercased text (with --checkpoint: follows the model's data.lowercase)")
    p.add_argument("--json", help="write all results to this JSON file")
    _add_decode_args(p)


def _average_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="*", help="checkpoints of one run to average (or --dir and --last)")
    p.add_argument("--dir", help="run folder holding epochNNN.pt files")
    p.add_argument("--last", type=int, help="average the last N epoch checkpoints of --dir")
    p.add_argument("-o", "--output", required=True,
                   help="the averaged checkpoint to write (in the run's folder, a name of its own such as avg.pt)")


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", nargs="+", help="a checkpoint; several are an ensemble")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--max-sentences", dest="max_sentences", type=int, default=1000, help="most sentences per request (default 1000)")
    p.add_argument("--max-beam", dest="max_beam", type=int, default=64, help="largest beam (and nbest) a request may ask for (default 64)")
    p.add_argument("--max-chars", dest="max_chars", type=int, default=10000,
                   help="most characters in one sentence of a request (default 10000; an RNN has no position limit, "
                        "and its search time grows with the source's length)")
    p.add_argument("--nfc-warning-interval", dest="nfc_warning_interval", type=float, default=60.0, metavar="SECONDS",
                   help="log a warning of request text not in Unicode NFC at most once per SECONDS, counting the "
                        "requests in between (default 60; 0 warns of every such request)")
    p.add_argument("--max-batch-sentences", dest="max_batch_sentences", type=int, default=64, metavar="N",
                   help="dynamic batching: concurrent /translate requests of the same search are decoded together, "
                        "a batch closing at N sentences (a larger request is a batch alone) or --batch-wait-ms after "
                        "its first request (default 64; 1: off, each request decoded alone)")
    p.add_argument("--max-batch-chars", dest="max_batch_chars", type=int, default=20000, metavar="N",
                   help="a batch also closes when its padded size reaches N characters: its sentences x the "
                        "characters of its longest, as the model pads each sentence to the longest, so that 64 long "
                        "sentences, or one long sentence and 63 short ones, are not decoded at once (a larger request "
                        "is a batch alone; default 20000, 64 sentences of up to 312 characters; 0: off, batches "
                        "bounded by --max-batch-sentences alone; GET /health shows it as max_batch_padded_chars)")
    p.add_argument("--batch-wait-ms", dest="batch_wait_ms", type=float, default=5.0, metavar="MS",
                   help="the longest a batch waits for more requests after its first while the model is busy; a batch "
                        "that finds the model free is decoded at once (default 5; 0: no batching)")
    _add_decode_args(p)


def _reproduce_options(p: argparse.ArgumentParser) -> None:
    from cometnmt.reproduce import add_arguments

    add_arguments(p)


def _compare_options(p: argparse.ArgumentParser) -> None:
    from cometnmt.compare import add_arguments

    add_arguments(p)


def _render_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("report_json", metavar="REPORT_JSON", help="the report.json of a reproduce or compare report folder")
    p.add_argument("--out", help="folder for report.md and the figures (report.json is copied there); default: "
                                 "REPORT_JSON's folder, whose report.json is left as it is")


# each command: its help line in `cometnmt --help` and what adds its options; cmd_NAME runs it
_COMMANDS = {
    "train": ("train a model from a YAML config", _train_options),
    "translate": ("translate text with a checkpoint (stdin -> stdout by default)", _translate_options),
    "logprob": ("forced decoding: a checkpoint's log-probability of given translations (rescoring, perplexity)",
                _logprob_options),
    "attention": ("where each target token looks in the source: attention weights as JSON lines and heatmap PNGs",
                  _attention_options),
    "evaluate": ("score translations (sacreBLEU BLEU/chrF and the COMET paper's metric)", _evaluate_options),
    "average": ("average the weights of several checkpoints", _average_options),
    "serve": ("serve a checkpoint over HTTP: POST /translate (and /logprob) with JSON", _serve_options),
    "reproduce": ("rerun the COMET paper's Table 1 rows and write a report", _reproduce_options),
    "compare": ("train configs with several seeds; test the first against the others (paired bootstrap)",
                _compare_options),
    "render": ("rewrite a reproduce or compare report's report.md and figures from its report.json "
               "(no training, decoding or scoring)", _render_options),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser. ``command``: build that command's options alone (``main`` passes
    the one typed, :func:`_command_at`): the other commands get their name and help line only, all
    that ``cometnmt --help`` and argparse's "invalid choice" show. Every command's options (reproduce's
    and compare's import their modules) were half the CPU time of a ``cometnmt translate --help``
    (bench/startup.py --parser). A name that is no command ('' say) builds none; None builds all."""
    parser = argparse.ArgumentParser(prog="cometnmt", description="Neural machine translation: COMET, Transformer and friends.",
                                     epilog="environment: COMETNMT_PLUGINS=MODULE[,FILE.py...] imports modules that register "
                                            "architectures of your own in cometnmt.models.REGISTRY before any command (and in "
                                            "the training processes compare and reproduce start); docs/architectures.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    from cometnmt import __version__

    parser.add_argument("--version", action="version", version=f"cometnmt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (line, add_options) in _COMMANDS.items():
        p = sub.add_parser(name, help=line)
        if command is None or command == name:
            add_options(p)
        p.set_defaults(func=globals()[f"cmd_{name}"])  # looked up now: a test may replace cmd_NAME
    return parser


def _command_at(argv: list[str]) -> str:
    """The command typed in ``argv``: its first argument that is not an option (the global options,
    -v/--verbose, --version and -h/--help, take no value), '' where there is none."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


# what a command takes by position, which other toolkits' habits give as an option (`--config`):
# argparse said only "unrecognized arguments: --config", or that `config` was missing
_POSITIONAL_AS_OPTION = {"train": ("config", ("--config",)),
                         "compare": ("configs", ("--config", "--configs")),
                         **{cmd: ("checkpoint", ("--checkpoint", "--checkpoints", "--model"))
                            for cmd in ("translate", "logprob", "attention", "serve")}}


def _positional_as_option(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Exit 2 with the command line to type where a command's positional argument was given as
    an option (``cometnmt train --config X.yaml``): the same line without the option name."""
    command = _command_at(argv)
    if command not in _POSITIONAL_AS_OPTION:
        return
    cmd = argv.index(command)  # the first argument not an option is the first of its name
    what, names = _POSITIONAL_AS_OPTION[argv[cmd]]
    fixed, given = list(argv[:cmd + 1]), None
    for arg in argv[cmd + 1:]:
        name, eq, value = arg.partition("=")
        if name in names:
            given = name
            if eq:
                fixed.append(value)
        else:
            fixed.append(arg)
    if given is not None:
        parser.exit(2, f"cometnmt {argv[cmd]}: error: {given}: there is no such option; {argv[cmd]} takes its "
                       f"{what} by position: {shlex.join(['cometnmt', *fixed])}\n")


def main(argv: list[str] | None = None) -> int:
    """Run one command. SIGTERM is Ctrl-C for every command (exit 143, not 130): train saves
    last.pt, serve stops cleanly, and any command's half-written output file is removed
    (``atomic_write``) rather than left as a temporary file, as a process killed outright would."""
    given = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_at(given))
    _positional_as_option(parser, given)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not args.verbose:  # torch's own INFO lines (FakeTensor cache stats at exit, say) are not ours to show
        logging.getLogger("torch").setLevel(logging.WARNING)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _sigterm) if in_main_thread else None
    code = 1
    try:
        # a second signal (Ctrl-C twice; reproduce's SIGTERM after the terminal's SIGINT) is noted
        # while the first is handled, not raised there as a traceback and exit 1
        with first_raises():
            try:
                if os.environ.get("COMETNMT_PLUGINS"):  # architectures of the user's own (cometnmt.models.load_plugins)
                    from cometnmt.models import load_plugins

                    load_plugins()
                # a command that loads a model here (_device_option): its device named as the flag, before any
                # checkpoint is read
                if getattr(args, "loads_a_model", False) and args.device != "auto":
                    from cometnmt.inference import resolve_device

                    resolve_device(args.device, "--device", flag=True)
                code = args.func(args)
            except CometNMTError as exc:  # another rank's (train under torchrun): named, not shown again
                _say_error(_from_another_rank(exc) or exc)
                code = 2
            except KeyboardInterrupt as exc:  # Ctrl-C in translate, evaluate, serve's start-up...: one line, not a traceback
                _say_failure(exc)
                print(f"cometnmt {args.command}: interrupted", file=sys.stderr)
                code = 143 if isinstance(exc, _Terminated) else 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
            if argv is None and code in (130, 143):  # run as the program (not called in-process), ending on an interrupt:
                for signum in (signal.SIGINT, signal.SIGTERM):  # one more signal would end it by the
                    signal.signal(signum, signal.SIG_IGN)  # default action (-2, -15) with its exit status lost
    return code
