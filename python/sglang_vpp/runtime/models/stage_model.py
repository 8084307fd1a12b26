"""``StageModel``: the part of a decoder that one rank holds, and the forward of one stage on one chunk.

Data flow for one COMPUTE action ``<stage>F<request>.<chunk>`` (``n`` tokens: the chunk, or
every part of a batched forward, ``ChunkSpec.parts``, one after another)::

    stage 0:      token ids [n] --embed_tokens--> hidden [n, H]
    every stage:  hidden --layers[layer_start:layer_end] (KV of (part's request, stage))--> hidden
    last stage:   hidden --norm--> final [n, H]  (--lm_head on each part's last token--> logits [V])

A rank materialises only what its stages need: the decoder layers of its stages, the embedding
if it runs stage 0, the final norm and ``lm_head`` if it runs the last stage (with the fold-back
layout rank 0 runs both). Parameter names equal transformers' (``model.layers.5.mlp...``), with
``layers`` a ``ModuleDict`` keyed by the *global* layer index, so a filtered HF state dict loads
with ``strict=True``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ...schedule import ChunkSpec, StageSpec
from .config import ModelConfig
from .kv_cache import StageKV
from .layers import DecoderLayer, RMSNorm, Segment, chunk_mask, rope_tables

__all__ = ["StageModel", "StageOutput"]


@dataclass
class StageOutput:
    """What one stage produces for one chunk."""

    hidden: torch.Tensor
    """``[c, H]``: the input of the next stage; on the last stage, the final-normed states."""
    logits: torch.Tensor | None = None
    """``[V]``: logits of the chunk's last token; only on the last stage for a request's last
    chunk (the first generated token comes from them)."""
    part_logits: tuple[torch.Tensor | None, ...] = ()
    """On the last stage, ``logits`` of each part of the forward (``ChunkSpec.parts`` order)."""


class _Inner(nn.Module):
    """Mirrors transformers' ``model.`` prefix (``model.embed_tokens``, ``model.layers``, ``model.norm``)."""

    def __init__(self, config: ModelConfig, layer_indices: list[int], has_embedding: bool, has_head: bool) -> None:
        super().__init__()
        if has_embedding:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleDict({str(i): DecoderLayer(config, i) for i in layer_indices})
        if has_head:
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class StageModel(nn.Module):
    """Layers ``layer_indices`` of ``config`` plus, if asked, the embedding and the head."""

    def __init__(
        self,
        config: ModelConfig,
        layer_indices: Iterable[int],
        has_embedding: bool,
        has_head: bool,
    ) -> None:
        super().__init__()
        self.config = config
        self.layer_indices = sorted(set(layer_indices))
        assert all(0 <= i < config.num_hidden_layers for i in self.layer_indices), self.layer_indices
        self.has_embedding, self.has_head = has_embedding, has_head
        self.model = _Inner(config, self.layer_indices, has_embedding, has_head)
        if has_head:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @classmethod
    def for_stages(cls, config: ModelConfig, stages: Iterable[StageSpec], num_stages: int) -> StageModel:
        """What a rank holding ``stages`` (of a pipeline of ``num_stages``) must materialise."""
        stages = list(stages)
        layers = [i for s in stages for i in range(s.layer_start, s.layer_end)]
        indices = {s.stage_index for s in stages}
        return cls(config, layers, has_embedding=0 in indices, has_head=num_stages - 1 in indices)

    def forward_stage(
        self,
        inputs: torch.Tensor,
        chunk: ChunkSpec,
        layer_start: int,
        layer_end: int,
        kv: StageKV | Sequence[StageKV],
        is_first: bool,
        is_last: bool,
    ) -> StageOutput:
        """Run layers ``[layer_start, layer_end)`` on one forward; ``kv``: the stage's KV of each
        part's request (one for an unbatched chunk). See the module docstring."""
        parts = chunk.parts
        kvs = [kv] if isinstance(kv, StageKV) else list(kv)
        assert len(kvs) == len(parts), (len(kvs), chunk)
        hidden = self.model.embed_tokens(inputs) if is_first else inputs
        segments, row = [], 0
        for part, part_kv in zip(parts, kvs):
            positions = torch.arange(part.start, part.end, device=hidden.device)
            rope = rope_tables(positions, self.config.rope_dim, self.config.rope_theta, hidden.dtype)
            mask = chunk_mask(part.start, part.num_tokens, hidden.device)
            segments.append(Segment(slice(row, row + part.num_tokens), part.start, rope, mask, part_kv))
            row += part.num_tokens
        assert row == hidden.shape[0], (row, tuple(hidden.shape), chunk)
        for index in range(layer_start, layer_end):
            hidden = self.model.layers[str(index)](hidden, segments)
        if not is_last:
            return StageOutput(hidden)
        final = self.model.norm(hidden)
        # lm_head over the whole forward, then each part's last row: the same matmul shape
        # transformers uses for one sequence.
        head = self.lm_head(final) if any(part.is_last for part in parts) else None
        logits = tuple(head[s.rows.stop - 1] if part.is_last else None for part, s in zip(parts, segments))
        return StageOutput(final, logits[0], logits)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
