"""What does ``--replace-unk`` gain, and is it the copies or only the missing ``<unk>``?

sacreBLEU's tokenizer reads the text ``<unk>`` as three tokens (``<``, ``unk``, ``>``), none of which
match a reference, so any change that writes one word in its place raises BLEU whether or not the word
is right. This script translates a split of the checkpoint's own data once (its decode config) and
scores three versions of the same outputs with ``cometnmt.score``:

* ``as written``: ``<unk>`` as the model writes it;
* ``placeholder``: the word ``UNK`` in its place (the control: one unmatched word);
* ``replace_unk``: the source word the decoder attends to most (``decode.replace_unk``);

and counts how many copied words occur in their reference (lowercased, split on spaces after
punctuation is taken off). docs/translation.md's table came from

    python scripts/replace_unk_effect.py runs/multi30k/comet/best.pt --splits valid test [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import cometnmt
from cometnmt.data.pipeline import anchor_paths, read_split
from cometnmt.data.vocab import UNK
from cometnmt.inference import Translator

_WORD_EDGES = re.compile(r"[^\w'-]+")


def effect(translator: Translator, split: str, limit: int | None = None) -> dict:
    corpus = read_split(anchor_paths(translator.cfg.data, translator.workdir), split)
    src, refs = corpus.src[:limit], corpus.tgt[:limit]
    plain = [r[0] for r in translator.translate(src, progress=True)]
    copied = [r[0] for r in translator.translate(src, replace_unk=True)]
    unk, detok = translator.codec.tgt_vocab.itos[UNK], translator.codec.tgt_tok.detokenize
    versions = {
        "as written": [h.text for h in plain],
        "placeholder": [detok(["UNK" if t == unk else t for t in h.tokens]) for h in plain],
        "replace_unk": [h.text for h in copied],
    }
    found = total = 0
    for p, c, ref in zip(plain, copied, refs):
        words = set(_WORD_EDGES.sub(" ", ref.lower()).split())
        for before, after in zip(p.tokens, c.tokens):
            if before == unk:
                total += 1
                found += after.lower() in words
    lang = translator.cfg.data.tgt_lang
    scores = {name: cometnmt.score(hyps, refs, lang=lang, lowercase=translator.cfg.data.lowercase)
              for name, hyps in versions.items()}
    return {"split": split, "sentences": len(src), "unk_tokens": total,
            "output_tokens": sum(len(h.tokens) for h in plain), "copies_in_reference": found,
            "scores": {name: {k: s[k] for k in ("bleu", "chrf", "paper_bleu") if s.get(k) is not None}
                       for name, s in scores.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--splits", nargs="+", default=["valid"], choices=["train", "valid", "test"])
    p.add_argument("--limit", type=int, help="only the first N sentences of each split")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    translator = Translator.from_checkpoint(args.checkpoint, args.device)
    results = [effect(translator, split, args.limit) for split in args.splits]
    for r in results:
        print(f"{r['split']}: {r['sentences']} sentences, {r['unk_tokens']} <unk> of {r['output_tokens']} output tokens, "
              f"{r['copies_in_reference']} copies found in their reference")
        for name, s in r["scores"].items():
            print(f"  {name:12s} " + "  ".join(f"{k} {v:.2f}" for k, v in s.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
