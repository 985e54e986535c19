"""An ensemble of trained models that share one vocabulary, decoded as one model.

Each step averages the members' next-token probabilities (in log space: log of the mean of their
softmaxes, as fairseq's ensemble does), so greedy and beam search, n-best lists and length
penalties work unchanged through the :class:`~cometnmt.models.base.Seq2Seq` protocol. Members may
be of different architectures (a COMET and a Transformer, say) and keep their own caches and
reordering. Inference only: an ensemble is not trained.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cometnmt.models.base import Seq2Seq, State


class Ensemble(Seq2Seq):
    def __init__(self, members: list[Seq2Seq]) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two models")
        super().__init__(members[0].pad_id)
        self.members = nn.ModuleList(members)

    def position_limit(self) -> Optional[int]:
        limits = [m.position_limit() for m in self.members]
        return min((x for x in limits if x is not None), default=None)

    def _mean(self, logits: list[torch.Tensor]) -> torch.Tensor:
        """log of the mean of the members' probabilities."""
        logp = torch.stack([F.log_softmax(x.float(), dim=-1) for x in logits])
        return torch.logsumexp(logp, dim=0) - math.log(len(logits))

    def encode(self, src: torch.Tensor, src_pad_mask: torch.Tensor) -> State:
        return {"members": [m.encode(src, src_pad_mask) for m in self.members]}

    def decode(self, tgt_in: torch.Tensor, memory: State) -> torch.Tensor:
        return self._mean([m.decode(tgt_in, mem) for m, mem in zip(self.members, memory["members"])])

    def init_state(self, memory: State) -> State:
        return {"members": [m.init_state(mem) for m, mem in zip(self.members, memory["members"])]}

    def step(self, tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        out = [m.step(tokens, s) for m, s in zip(self.members, state["members"])]
        return self._mean([logits for logits, _ in out]), {"members": [s for _, s in out]}

    def reorder(self, state: State, index: torch.Tensor) -> State:
        return {"members": [m.reorder(s, index) for m, s in zip(self.members, state["members"])]}

    def forward(self, src, src_pad_mask, tgt_in):  # pragma: no cover - inference only
        raise RuntimeError("an Ensemble decodes trained models; it is not trained")
