"""Token <-> id vocabulary with fixed special symbols."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from cometnmt.errors import DataError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


class Vocab:
    """Maps tokens to ids; ids 0-3 are always ``SPECIALS`` (PAD, UNK, BOS, EOS)."""

    def __init__(self, itos: list[str]) -> None:
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"vocabulary must start with the special tokens {SPECIALS}, got {itos[:4]}")
        if len(set(itos)) != len(itos):
            raise DataError("vocabulary has duplicate tokens")
        self.itos: list[str] = list(itos)
        self.stoi: dict[str, int] = {tok: i for i, tok in enumerate(self.itos)}

    @classmethod
    def build(
        cls, token_lists: Iterable[list[str]], min_freq: int = 1, max_size: int | None = None
    ) -> "Vocab":
        """Count tokens; keep those seen >= ``min_freq`` times, most frequent first (ties: by token).

        ``max_size`` caps the total size, the 4 special tokens included.
        """
        if max_size is not None and max_size < len(SPECIALS):
            raise ValueError(f"max_size must be at least {len(SPECIALS)} (the special tokens), not {max_size}")
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((tok for tok, n in counts.items() if n >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[: max_size - len(SPECIALS)]
        return cls(list(SPECIALS) + kept)

    def encode(self, tokens: list[str]) -> list[int]:
        """Ids of ``tokens``; unknown tokens map to UNK. No BOS/EOS is added."""
        get = self.stoi.get
        return [get(tok, UNK) for tok in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids``, stopping at the first EOS and skipping PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i not in (PAD, BOS):
                out.append(self.itos[i])
        return out

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        """Id of ``token`` (UNK when unknown)."""
        return self.stoi.get(token, UNK)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def to_dict(self) -> dict:
        """Plain-Python form for checkpoints."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocab":
        """Inverse of ``to_dict``."""
        itos = d.get("itos") if isinstance(d, dict) else None
        if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
            raise DataError("saved vocabulary is malformed: expected a dict with an 'itos' list of strings")
        return cls(itos)
