"""The single-process reference forward: what every pipelined mode must reproduce.

Data flow: ``prompt_tokens(request, length, vocab, seed)`` gives each request its token ids (the
same function feeds stage 0 of the pipelined run) -> ``reference_forward`` runs the whole model
(every layer, embedding and head in one ``StageModel``) request by request, chunk by chunk with
the same KV cache and mask code as the pipeline, or the whole prompt at once with
``chunk_size=None`` -> ``RequestOutput`` per request: the final-normed hidden states of every
token and the logits of the last token (the first generated token comes from them).

With the same chunk boundaries the pipelined run performs the same operations on the same
shapes, so on one thread its output is bit-identical; against ``chunk_size=None`` the chunked
forward differs only by float rounding (``within_fp32_rounding``). The per-chunk thread CPU times of
the chunked forward are a calibration sample of the whole model (``chunk_costs``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..schedule import ChunkSpec
from .models import KVCache, ModelSource, full_model

__all__ = ["ReferenceResult", "RequestOutput", "fixed_chunks", "max_abs_diff", "prompt_tokens", "reference_forward",
           "within_fp32_rounding"]

FP32_ROUNDING_REL = 1e-5
"""How far two correct fp32 forwards with different reduction orders (chunked vs whole prompt, ours
vs transformers) may differ, relative to the largest output magnitude: about 100 ulps. The matmul
shapes differ, so the CPU kernels block and accumulate differently, and by how much depends on the
instruction set: the same tiny-model logits (|x| ~ 5) differ by 1e-6 on an AVX2 host and by
1.5e-5 on an AVX-512 one."""


@dataclass
class RequestOutput:
    request_index: int
    hidden: torch.Tensor
    """``[length, H]``: final-normed hidden states of every prompt token."""
    logits: torch.Tensor
    """``[V]``: logits of the last prompt token."""


@dataclass
class ReferenceResult:
    outputs: list[RequestOutput]
    chunk_costs: list[tuple[ChunkSpec, float]] = field(default_factory=list)
    """(chunk, thread CPU seconds of the whole model on it), chunked mode only."""


def prompt_tokens(request_index: int, length: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Deterministic token ids of request ``request_index`` (shared by every rank and the reference)."""
    gen = torch.Generator().manual_seed(1_000_003 * (seed + 1) + request_index)
    return torch.randint(0, vocab_size, (length,), generator=gen, dtype=torch.int64)


def fixed_chunks(request_index: int, length: int, chunk_size: int | None) -> list[ChunkSpec]:
    size = length if chunk_size is None else chunk_size
    starts = list(range(0, length, size))
    return [
        ChunkSpec(request_index, i, s, min(size, length - s), is_last=s + size >= length)
        for i, s in enumerate(starts)
    ]


@torch.inference_mode()
def reference_forward(
    source: ModelSource,
    lengths: Sequence[int],
    chunk_size: int | None = None,
    chunks: Sequence[ChunkSpec] | None = None,
    token_seed: int = 0,
    device: str | torch.device = "cpu",
) -> ReferenceResult:
    """Run each request through the whole model; ``chunks`` overrides the fixed ``chunk_size`` split.
    On a GPU/NPU ``device`` the costs are synchronised wall seconds; outputs come back on the CPU."""
    device = torch.device(device)
    model = full_model(source).to(device)
    config = source.config
    cache = KVCache(token_dim=0 if config.is_mla else 1)
    by_request: dict[int, list[ChunkSpec]] = {}
    if chunks is not None:
        for chunk in chunks:
            by_request.setdefault(chunk.request_index, []).append(chunk)
    outputs, costs = [], []
    for request_index, length in enumerate(lengths):
        plan = by_request.get(request_index) or fixed_chunks(request_index, length, chunk_size)
        tokens = prompt_tokens(request_index, length, config.vocab_size, token_seed).to(device)
        kv = cache.for_stage(request_index, 0, length)
        pieces, logits = [], None
        for chunk in sorted(plan, key=lambda c: c.chunk_index):
            clock = time.thread_time if device.type == "cpu" else time.perf_counter
            start = clock()
            out = model.forward_stage(
                tokens[chunk.start : chunk.end], chunk, 0, config.num_hidden_layers, kv, True, True
            )
            _synchronize(device)
            costs.append((chunk, clock() - start))
            pieces.append(out.hidden)
            logits = out.logits if out.logits is not None else logits
        assert logits is not None and sum(p.shape[0] for p in pieces) == length, (request_index, length)
        outputs.append(RequestOutput(request_index, torch.cat(pieces).cpu(), logits.cpu()))
        cache.release(request_index, 0)
    return ReferenceResult(outputs, costs if chunk_size is not None or chunks is not None else [])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def within_fp32_rounding(diff: float, *references: torch.Tensor) -> bool:
    """True when ``diff`` is float rounding for outputs of the magnitude of ``references``."""
    scale = max([1.0] + [t.abs().max().item() for t in references if t.numel()])
    return diff <= FP32_ROUNDING_REL * scale


def max_abs_diff(got: Sequence[RequestOutput], want: Sequence[RequestOutput]) -> float:
    """Largest absolute difference over every request's hidden states and last-token logits."""
    assert len(got) == len(want), (len(got), len(want))
    worst = 0.0
    for a, b in zip(sorted(got, key=lambda o: o.request_index), sorted(want, key=lambda o: o.request_index)):
        assert a.request_index == b.request_index and a.hidden.shape == b.hidden.shape, (a.request_index, b.request_index)
        worst = max(worst, (a.hidden - b.hidden).abs().max().item(), (a.logits - b.logits).abs().max().item())
    return worst
