"""The single-process reference forward: what every pipelined mode must reproduce.

Data flow: ``prompt_tokens(request, length, vocab, seed)`` gives each request its token ids (the
same function feeds stage 0 of the pipelined run) -> ``reference_forward`` runs the whole model
(every layer, embedding and head in one ``StageModel``) forward by forward in the planner's order
(a batched forward runs its requests together, attention per request) with the same KV cache
and mask code as the pipeline, or the whole prompt at once with
``chunk_size=None`` -> ``RequestOutput`` per request: the final-normed hidden states of every
token and the logits of the last token (the first generated token comes from them).

With the same forwards the pipelined run performs the same operations on the same
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

__all__ = ["ReferenceResult", "RequestOutput", "fixed_chunks", "max_abs_diff", "prepare_device", "prompt_tokens",
           "reference_device", "reference_forward",
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


def reference_device(device: str) -> str:
    """Where the single-process reference of a run on ``device`` (``cpu``, ``cuda``, ``npu``)
    runs: the CPU, or the first accelerator of the ranks' kind, whose kernels are the ranks'; a
    CPU reference of a GPU run would compare other kernels' rounding, which may differ by more
    than the bound (1e-5) made for the same arithmetic."""
    return "cpu" if str(device) == "cpu" else f"{device}:0"


def prepare_device(kind: str) -> None:
    """Make a device of ``kind`` (``cpu``, ``cuda``, ``npu``) usable for an exact fp32 run; the
    ranks and the reference both call this. An NPU is only known to torch once torch_npu is
    imported. fp32 means fp32 on a CUDA device: TF32 matmuls would make every run differ from
    its reference by ~1e-3."""
    if kind == "npu":
        import torch_npu  # noqa: F401
    elif kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@torch.inference_mode()
def reference_forward(
    source: ModelSource,
    lengths: Sequence[int],
    chunk_size: int | None = None,
    chunks: Sequence[ChunkSpec] | None = None,
    token_seed: int = 0,
    device: str | torch.device = "cpu",
) -> ReferenceResult:
    """Run each request through the whole model; ``chunks`` (a planner's sequence, batched
    forwards included) overrides the fixed ``chunk_size`` split.
    On a GPU/NPU ``device`` the costs are synchronised wall seconds; outputs come back on the CPU."""
    prepare_device(str(device).split(":")[0])
    device = torch.device(device)
    model = full_model(source).to(device)
    config = source.config
    cache = KVCache(token_dim=0 if config.is_mla else 1)
    planned = {c.request_index for chunk in chunks or () for c in chunk.parts}
    # The given forwards in their order (request-major, so every prefix is built before it is
    # read; a batched forward carries whole requests after its lead, the last perhaps a head
    # whose rest comes in a later forward), then any request left out in fixed chunks.
    forwards = list(chunks or ())
    forwards += [c for i, n in enumerate(lengths) if i not in planned for c in fixed_chunks(i, n, chunk_size)]
    tokens = {i: prompt_tokens(i, n, config.vocab_size, token_seed).to(device) for i, n in enumerate(lengths)}
    pieces: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(lengths))}
    logits: dict[int, torch.Tensor] = {}
    costs = []
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    for chunk in forwards:
        parts = chunk.parts
        inputs = [tokens[p.request_index][p.start : p.end] for p in parts]
        kvs = [cache.for_stage(p.request_index, 0, lengths[p.request_index]) for p in parts]
        start = clock()
        out = model.forward_stage(inputs[0] if len(inputs) == 1 else torch.cat(inputs), chunk, 0,
                                  config.num_hidden_layers, kvs, True, True)
        _synchronize(device)
        costs.append((chunk, clock() - start))
        row = 0
        for part, part_logits in zip(parts, out.part_logits):
            pieces[part.request_index].append(out.hidden[row : row + part.num_tokens])
            row += part.num_tokens
            if part_logits is not None:
                logits[part.request_index] = part_logits
            if part.is_last:
                cache.release(part.request_index, 0)
    outputs = []
    for request_index, length in enumerate(lengths):
        assert request_index in logits and sum(p.shape[0] for p in pieces[request_index]) == length, (
            request_index, length)
        outputs.append(RequestOutput(request_index, torch.cat(pieces[request_index]).cpu(),
                                     logits[request_index].cpu()))
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
