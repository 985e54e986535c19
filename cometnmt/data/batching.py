"""Token-budget batching with length buckets, and collation of id lists into padded tensors."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from cometnmt.data.vocab import BOS, EOS, PAD


@dataclass
class Batch:
    """Padded tensors of one batch (B batch, S source len, T target len)."""

    src: torch.Tensor  # B,S long, padded with PAD
    src_pad_mask: torch.Tensor  # B,S bool, True = padding
    tgt_in: torch.Tensor  # B,T long: BOS + y (padded)
    tgt_out: torch.Tensor  # B,T long: y + EOS (padded with PAD)
    indices: list[int]  # positions of these examples in the dataset
    n_src_tokens: int  # real (non-pad) source tokens
    n_tgt_tokens: int  # real tgt_out tokens (y + EOS)
    tags: dict[str, torch.Tensor] | None = None  # Transformer++: task -> B,S long tag ids (-100 = none)

    def __len__(self) -> int:
        return len(self.indices)

    def _map_tensors(self, fn) -> "Batch":
        """A copy with ``fn`` applied to every tensor field."""
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: fn(v) for k, v in tensors.items() if isinstance(v, torch.Tensor)}
        if self.tags is not None:
            out["tags"] = {k: fn(v) for k, v in self.tags.items()}
        return replace(self, **out)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """A copy on ``device``."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """A copy in pinned host memory (unchanged when CUDA is unavailable)."""
        if not torch.cuda.is_available():
            return self
        return self._map_tensors(lambda t: t.pin_memory())


def _pad(seqs: Sequence[Sequence[int]], width: int, fill: int = PAD) -> torch.Tensor:
    """Rows of ``seqs`` right-padded with ``fill`` to ``width``."""
    rows = [list(s) + [fill] * (width - len(s)) for s in seqs]
    return torch.tensor(rows, dtype=torch.long).view(len(seqs), width)  # B,W


def collate(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]] | None,
    indices: list[int],
    tags: dict[str, list[list[int]]] | None = None,
) -> Batch:
    """Pad a batch. The source is used as given; the target y becomes ``tgt_in = BOS+y`` and ``tgt_out = y+EOS``.

    ``tgt_ids=None`` (translation) gives empty (B,0) target tensors. ``tags`` (Transformer++: task ->
    one tag-id list per source, as long as it) are padded with -100, the ignored label.
    """
    n = len(src_ids)
    if len(indices) != n or (tgt_ids is not None and len(tgt_ids) != n):
        raise ValueError(
            f"collate: {n} sources, {len(indices)} indices, {None if tgt_ids is None else len(tgt_ids)} targets"
        )
    src = _pad(src_ids, max((len(s) for s in src_ids), default=0))  # B,S
    src_pad_mask = src.eq(PAD)  # B,S
    if tgt_ids is None:
        tgt_in = torch.empty((n, 0), dtype=torch.long)  # B,0
        tgt_out = torch.empty((n, 0), dtype=torch.long)  # B,0
        n_tgt = 0
    else:
        width = max((len(t) for t in tgt_ids), default=0) + 1
        tgt_in = _pad([[BOS] + list(t) for t in tgt_ids], width)  # B,T
        tgt_out = _pad([list(t) + [EOS] for t in tgt_ids], width)  # B,T
        n_tgt = sum(len(t) + 1 for t in tgt_ids)
    tag_tensors = None if tags is None else {k: _pad(v, src.size(1), fill=-100) for k, v in tags.items()}  # B,S each
    return Batch(src, src_pad_mask, tgt_in, tgt_out, list(indices), sum(len(s) for s in src_ids), n_tgt, tag_tensors)


def _row_lens(src_lens: list[int], tgt_lens: list[int] | None) -> tuple[list[int], list[int] | None]:
    """Tensor row lengths: the source as given, the target plus one (BOS/EOS)."""
    return list(src_lens), None if tgt_lens is None else [t + 1 for t in tgt_lens]


def _sorted_indices(
    src_rows: list[int], tgt_rows: list[int] | None, shuffle: bool, rng: random.Random, bucket_width: int
) -> list[int]:
    """Indices sorted by (src bucket, tgt bucket), ties broken randomly when shuffling, else by index."""
    tgt = tgt_rows if tgt_rows is not None else [0] * len(src_rows)
    tie = [rng.random() for _ in src_rows] if shuffle else list(range(len(src_rows)))
    return sorted(range(len(src_rows)), key=lambda i: (src_rows[i] // bucket_width, tgt[i] // bucket_width, tie[i]))


def _chunk(
    order: list[int], src_rows: list[int], tgt_rows: list[int] | None, max_tokens: int, max_sentences: int | None
) -> list[list[int]]:
    """Greedily cut ``order`` into batches with n * max row length <= max_tokens (and <= max_sentences)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        row = max(src_rows[i], tgt_rows[i] if tgt_rows is not None else 0)
        new_max = max(cur_max, row)
        full = max_sentences is not None and len(cur) >= max_sentences
        if cur and (full or (len(cur) + 1) * new_max > max_tokens):
            batches.append(cur)
            cur, new_max = [], row
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


def make_batches(
    src_lens: list[int],
    tgt_lens: list[int] | None,
    *,
    max_tokens: int,
    max_sentences: int | None = None,
    shuffle: bool,
    seed: int = 0,
    bucket_width: int = 1,
) -> list[list[int]]:
    """Group dataset indices into batches of at most ``max_tokens`` padded tokens on the longer side.

    Rows are the source length as given and the target length + 1 (BOS/EOS). Indices are sorted by
    length buckets (random tie-break when ``shuffle``), cut greedily (an over-long example gets its own
    batch), optionally capped at ``max_sentences``; with ``shuffle`` the batch order is shuffled.
    Deterministic for a given ``seed``.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, not {max_tokens}")
    if max_sentences is not None and max_sentences <= 0:
        raise ValueError(f"max_sentences must be positive, not {max_sentences}")
    if bucket_width <= 0:
        raise ValueError(f"bucket_width must be positive, not {bucket_width}")
    if tgt_lens is not None and len(tgt_lens) != len(src_lens):
        raise ValueError(f"{len(src_lens)} source lengths but {len(tgt_lens)} target lengths")
    src_rows, tgt_rows = _row_lens(src_lens, tgt_lens)
    order = _sorted_indices(src_rows, tgt_rows, shuffle, random.Random(seed), bucket_width)
    batches = _chunk(order, src_rows, tgt_rows, max_tokens, max_sentences)
    if shuffle:
        random.Random(seed).shuffle(batches)
    return batches


def padding_fraction(
    batches: list[list[int]], src_lens: list[int], tgt_lens: list[int] | None
) -> float:
    """Fraction of padded slots over all source (and target) tensors that ``collate`` would build."""
    src_rows, tgt_rows = _row_lens(src_lens, tgt_lens)
    slots = real = 0
    for batch in batches:
        for rows in (src_rows, tgt_rows):
            if rows is None or not batch:
                continue
            lens = [rows[i] for i in batch]
            slots += len(lens) * max(lens)
            real += sum(lens)
    return 0.0 if slots == 0 else 1.0 - real / slots
