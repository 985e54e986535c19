"""The Python API: what the command line does, as functions a script or notebook can call.

Example::

    import cometnmt

    cfg = cometnmt.load_config("configs/tiny.yaml", ["train.save_dir=runs/demo", "train.keep_checkpoints=2"])
    summary = cometnmt.train(cfg)                       # or cometnmt.train("configs/tiny.yaml")
    translator = cometnmt.Translator.from_checkpoint("runs/demo/best.pt", device="cpu")
    print(translator("Ein Mann fährt Fahrrad."))
    result, test = cometnmt.evaluate_checkpoint("runs/demo/best.pt", split="test", beam=5)
    print(result["bleu"], test.hyps[0])
    print(cometnmt.score(test.hyps, test.refs, lang="en")["chrf"])
    cometnmt.average_checkpoints(["runs/demo/epoch001.pt", "runs/demo/epoch002.pt"], "runs/demo/avg.pt")

Errors are :class:`~cometnmt.errors.CometNMTError` subclasses (``ConfigError``, ``DataError``,
``CheckpointError``) whose message names the key, file or line, as on the command line.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path
from typing import Sequence

from cometnmt.atomic import refuse_overwrite, same_file
from cometnmt.config import Config, apply_overrides, load_config, origin_named, to_dict
from cometnmt.errors import CheckpointError, ConfigError, DataError, setting
from cometnmt.inference import SplitTranslation, Translator, check_split, checkpoint_list, plain_number


def train(config: Config | str | Path, overrides: Sequence[str] = (), *, resume: bool = False,
          init_from: str | Path | None = None) -> dict:
    """Train the run a config describes, as ``cometnmt train CONFIG --set ...`` does.

    :param config: a :class:`Config` (validated again, so edits made to it are checked) or the path
        of a YAML preset.
    :param overrides: dotted ``section.key=value`` strings, as ``--set``.
    :param resume: continue the run in ``train.save_dir`` from its ``last.pt``.
    :param init_from: start a new run from this checkpoint's weights and vocabularies (fine-tuning),
        as ``--init-from``.
    :return: ``{"steps", "epochs", "best", "save_dir", ...}``; the checkpoints are in ``save_dir``.
    """
    import torch

    from cometnmt.training.run import train as run_training

    overrides = overrides if isinstance(overrides, str) else list(overrides)  # a string is refused by name
    if isinstance(config, Config):
        cfg = apply_overrides(config, overrides)
    elif isinstance(config, (str, Path)):
        cfg = load_config(config, overrides)
    else:
        raise ConfigError(f"train needs a Config or the path of a YAML config, got {type(config).__name__}")
    threads = torch.get_num_threads()
    try:
        with origin_named(None if isinstance(config, Config) else config, overrides):  # training's own checks: whose value
            return run_training(cfg, resume=resume, init_from=init_from, flags=False)
    finally:
        torch.set_num_threads(threads)  # train.num_threads is the run's, not the caller's, setting


def evaluate_checkpoint(checkpoint: str | Path | Sequence[str | Path], split: str = "test", *, beam: int | None = None,
                        length_penalty: float | None = None, batch_size: int | None = None, device: str = "auto",
                        limit: int | None = None, progress: bool = False, flags: bool = False,
                        sampling: bool | None = None, topk: int | None = None, topp: float | None = None,
                        temperature: float | None = None, seed: int | None = None, replace_unk: bool | None = None,
                        precision: str | None = None, hyp_out: str | Path | None = None,
                        json_out: str | Path | None = None) -> tuple[dict, SplitTranslation]:
    """Translate a split of the checkpoint's own data and score it, as ``cometnmt evaluate
    --checkpoint``: the search is the checkpoint's ``decode`` config with the given settings
    replaced; the scores are :func:`~cometnmt.evaluation.score`'s, with BLEU by source length (on
    lowercased text for a model trained with ``data.lowercase``).

    :param split: ``train``, ``valid`` or ``test``.
    :param limit: only the first ``limit`` sentences (smoke runs).
    :param flags: name bad settings as command-line flags (``--beam 0``) rather than keywords.
    :param sampling: score one random sample per sentence (``topk``, ``topp``, ``temperature``,
        ``seed``: :meth:`Translator.translate`'s).
    :param replace_unk: copy the source word attended to most in place of each ``<unk>`` output.
    :param precision: the search's arithmetic (``decode.precision``: fp32, bf16 or fp16).
    :param hyp_out: also write the hypotheses there, a line each; ``json_out``: the scores, as
        :func:`~cometnmt.evaluation.write_json`. Neither may be the split's source or reference
        file nor a checkpoint (refused before anything is translated).
    :return: (scores, with the ``checkpoints``, ``split``, ``limit`` and ``decode`` settings that
        made them, the split's ``source_file`` and ``reference_file`` and the latter's
        ``reference_lines``, more than ``n_sentences`` where fewer were scored; the sources,
        references and hypotheses).
    """
    limit = check_split(split, limit)  # before the checkpoint loads
    from cometnmt.evaluation import paper_tokenizers, score_with

    translator = Translator.from_checkpoint(checkpoint, device)
    decode = translator.search_config(beam=beam, length_penalty=length_penalty, batch_size=batch_size, nbest=1,
                                      sampling=sampling, topk=topk, topp=topp, temperature=temperature, seed=seed,
                                      replace_unk=replace_unk, precision=precision, flags=flags)
    data = translator.cfg.data
    tgt_tok, src_tok = paper_tokenizers(data.tgt_lang, data.src_lang)  # what spaCy cannot tokenise: said now, not after decoding
    if hyp_out is not None or json_out is not None:
        src_file, ref_file = translator.split_files(split)
        refuse_overwrite([(_name("hyp_out", flags), hyp_out), (_name("json_out", flags, "--json"), json_out)],
                         [(f"the {split} split's source", src_file), (f"the {split} split's reference", ref_file),
                          *((_name("checkpoint", flags), path) for path in checkpoint_list(checkpoint))], flags=flags)
    out = translator.translate_split(split, decode, limit=limit, progress=progress)
    if not out.refs:  # score's own error ("the reference set is empty") names no file
        raise DataError(f"{translator.split_files(split)[1]}: no references in the {split} split (an empty file)")
    result = score_with(out.hyps, out.refs, tgt_tok, src_tok, lang=data.tgt_lang, src_lang=data.src_lang, src=out.src,
                        lowercase=data.lowercase)
    paths = [str(Path(p).resolve()) for p in checkpoint_list(checkpoint)]
    result.update(checkpoints=paths, split=split, limit=limit, decode=to_dict(decode), **_scored_files(translator, split))
    if hyp_out is not None:
        from cometnmt.data.corpus import write_text_file

        write_text_file(hyp_out, "".join(h + "\n" for h in out.hyps))
    if json_out is not None:
        from cometnmt.evaluation import write_json

        write_json(result, json_out)
    return result, out


def _scored_files(translator: Translator, split: str) -> dict:
    """The split's files and the reference file's line count, so that sacreBLEU itself can score
    ``hyp_out`` against them (``head -n`` where fewer were scored: ``limit``, ``data.max_valid_pairs``)."""
    from cometnmt.data.corpus import read_lines

    src_file, ref_file = translator.split_files(split)
    return {"source_file": str(Path(src_file).resolve()), "reference_file": str(Path(ref_file).resolve()),
            "reference_lines": len(read_lines(ref_file))}


def _name(keyword: str, flags: bool, flag: str | None = None) -> str:
    """A setting's name as refuse_overwrite shows it: the flag (``--hyp-out``) or the keyword."""
    return (flag or "--" + keyword.replace("_", "-")) if flags else keyword


def last_epoch_checkpoints(run_dir: str | Path, last: int, *, flags: bool = False) -> list[Path]:
    """The ``last`` newest ``epochNNN.pt`` files of a run folder, oldest first (errors name the
    arguments as keywords, or with ``flags`` as ``cometnmt average``'s ``--dir``/``--last``)."""
    last = plain_number(last)
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise CheckpointError(f"{setting('last', last if isinstance(last, int) else repr(last), flags)}: "
                              "must be an integer at least 1")
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"{setting('run_dir', run_dir, flags, flag='--dir')}: not a folder")
    from cometnmt.training.checkpoint import epoch_checkpoints

    found = epoch_checkpoints(run_dir)
    if len(found) < last:
        raise CheckpointError(f"{setting('last', last, flags)}: only {len(found)} epoch checkpoints in {run_dir} "
                              "(a run keeps the last train.keep_checkpoints, 0 by default: set it when training, "
                              f"e.g. train.keep_checkpoints={last}, or average checkpoints named one by one)")
    return found[-last:]


def average_checkpoints(paths: Sequence[str | Path], output: str | Path, *, flags: bool = False) -> Path:
    """Average the weights of checkpoints of one run (e.g. :func:`last_epoch_checkpoints`) into
    ``output``, a checkpoint that ``Translator.from_checkpoint`` loads; written atomically.
    ``output`` may be in the run folder under a name of its own (``avg.pt``), not one of ``paths``
    nor a name the trainer gives its checkpoints there or in another run's folder (``best.pt``,
    ``last.pt``, ``epoch*.pt``, which a resume or ``last_epoch_checkpoints`` would pick up). Errors name the arguments as keywords, or with
    ``flags`` as ``cometnmt average``'s ``-o``."""
    from cometnmt.training.checkpoint import (BEST_CHECKPOINT, EPOCH_CHECKPOINT_GLOB, LAST_CHECKPOINT, METRICS_FILE,
                                             average_checkpoints as average, save_checkpoint)

    if isinstance(paths, (str, Path)):
        raise CheckpointError("average_checkpoints takes a list of checkpoint paths")
    paths = list(paths)  # a generator is read once (it averaged nothing: "no checkpoints to average")
    twice = sorted({str(p) for i, p in enumerate(paths) if any(same_file(p, q) for j, q in enumerate(paths) if j != i)})
    if twice:
        raise CheckpointError(f"{', '.join(twice)}: given twice; each checkpoint would weigh double in the average")
    if Path(output).is_dir():  # before loading anything
        raise CheckpointError(f"{output}: is a directory, expected a file name to write")
    refuse_overwrite([("-o" if flags else "output", output)],
                     [("checkpoint" if flags else f"paths[{i}]", p) for i, p in enumerate(paths)], flags=flags,
                     error=CheckpointError)
    name, folder = Path(output).name, Path(output).parent
    if name in (BEST_CHECKPOINT, LAST_CHECKPOINT) or fnmatch(name, EPOCH_CHECKPOINT_GLOB):
        run = next((f"the folder of {p}" for p in paths if same_file(Path(p).parent, folder)), None)
        if run is None and any((folder / f).exists() for f in (LAST_CHECKPOINT, METRICS_FILE)):
            run = f"{folder}, another run's folder"  # its last.pt is what --resume continues from
        if run is not None:
            raise CheckpointError(f"{setting('output', output, flags, flag='-o')}: a name the trainer gives the run's own "
                                  f"checkpoints, in {run}; the average would replace one of them or be "
                                  "taken for one (by a resumed training, or an average of the last epochs): give it a "
                                  "name of its own such as avg.pt")
    save_checkpoint(average(paths), output)
    return Path(output)
