"""KV cache for chunked prefill: one buffer pair per (request, stage, layer).

Data flow: a stage's first chunk of a request creates ``KVCache.for_stage(request, stage)``;
each layer's attention calls ``LayerKV.append(start, a, b)`` with the chunk's new entries and gets
back views of the whole prefix ``[0, start + c)`` to attend over. The buffers are allocated once
per request at its full length (known when it is submitted), so appending a chunk copies only
the chunk, not the prefix. ``KVCache.release`` frees a request's buffers on a stage after its
last chunk has run there.

What is cached: GQA layers store keys and values ``[kv_heads, tokens, head_dim]`` (after RoPE);
MLA layers store the normalised latent ``[tokens, kv_lora_rank]`` and the rotary key
``[tokens, qk_rope_head_dim]``.

Chunks of a request must reach a stage in order (the schedule core guarantees it: every stage
processes chunks in one global order); ``append`` asserts it, so an executor bug that reorders
chunks fails loudly instead of attending to a hole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["KVCache", "LayerKV", "StageKV"]


@dataclass
class LayerKV:
    """Two growing buffers (``a``, ``b``) along ``token_dim``, preallocated to ``capacity`` tokens."""

    capacity: int
    token_dim: int
    """1 for GQA (``[heads, tokens, d]``), 0 for MLA (``[tokens, width]``)."""
    length: int = 0
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None

    def append(self, start: int, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert start == self.length, f"chunk starts at {start} but the cache holds {self.length} tokens"
        count = a.shape[self.token_dim]
        end = start + count
        assert end <= self.capacity, f"chunk ends at {end}, beyond the request length {self.capacity}"
        if self.a is None:
            self.a = a.new_empty(self._full_shape(a))
            self.b = b.new_empty(self._full_shape(b))
        assert self.b is not None
        self.a.narrow(self.token_dim, start, count).copy_(a)
        self.b.narrow(self.token_dim, start, count).copy_(b)
        self.length = end
        return self.a.narrow(self.token_dim, 0, end), self.b.narrow(self.token_dim, 0, end)

    def _full_shape(self, t: torch.Tensor) -> tuple[int, ...]:
        shape = list(t.shape)
        shape[self.token_dim] = self.capacity
        return tuple(shape)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, self.b) if t is not None)


@dataclass
class StageKV:
    """The layers of one stage for one request."""

    capacity: int
    token_dim: int
    layers: dict[int, LayerKV] = field(default_factory=dict)

    def layer(self, layer_index: int) -> LayerKV:
        if layer_index not in self.layers:
            self.layers[layer_index] = LayerKV(self.capacity, self.token_dim)
        return self.layers[layer_index]


class KVCache:
    """All KV of one rank (or of the single-process reference), keyed by (request, stage)."""

    def __init__(self, token_dim: int) -> None:
        self.token_dim = token_dim
        self._stages: dict[tuple[int, int], StageKV] = {}
        self.peak_bytes = 0

    def for_stage(self, request_index: int, stage_index: int, capacity: int) -> StageKV:
        key = (request_index, stage_index)
        if key not in self._stages:
            self._stages[key] = StageKV(capacity, self.token_dim)
        return self._stages[key]

    def release(self, request_index: int, stage_index: int) -> None:
        self.peak_bytes = max(self.peak_bytes, self.num_bytes)
        self._stages.pop((request_index, stage_index), None)

    @property
    def num_bytes(self) -> int:
        return sum(layer.num_bytes for stage in self._stages.values() for layer in stage.layers.values())
