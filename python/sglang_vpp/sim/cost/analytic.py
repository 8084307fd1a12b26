"""``AnalyticCostModel``: stage time from FLOPs and bytes of a ``ModelSpec`` on a ``HardwareSpec``.

For a stage holding layers ``[start, end)`` and a chunk of ``c`` tokens after a prefix of ``L``:

- linear (projections, dense FFN or the *active* experts, router): ``c * F_lin`` FLOPs at
  ``linear_efficiency * eff(c)``, or the weight bytes the chunk touches over HBM bandwidth when that
  is slower (small chunks are memory bound; MoE chunks touch ``E (1 - (1 - k/E)^c)`` experts);
- attention: query-key pairs times FLOPs per pair. Dense: the schedule core's ``causal_pairs``
  (``attention_work`` over a batched forward's requests). DSA: each query attends
  ``min(position + 1, top_k)`` keys, plus the indexer that scores every causal pair with its own
  small heads;
- ``eff(c) = c / (c + half_efficiency_tokens)``: kernels lose efficiency on small chunks, which is
  what makes DCPP's fragmentation cost compute;
- a fixed device cost per layer (launches, norms) and host time during which the device idles
  (``StageTime.overhead_s``, charged as the ``scheduling_gap`` idle cause on every stage
  compute): a scheduler iteration (batch set-up) before a rank's first forward of a
  micro-batch, and a smaller ``revisit_overhead_s`` before a fold-back rank's second forward of
  it (``StageSpec.visit``), which reuses that set-up, as the SGLang mode's stage runner does;
- TP collectives (see the method doc's modelling hint): ``tp_collectives_per_layer`` all-reduces
  per layer per chunk, each ``latency + exposed * 2 (n - 1)/n * c * hidden * bytes / bandwidth``
  (``tp_exposed_fraction`` of the bandwidth term is on the critical path, the latency always is).
  Their count grows with the number of chunks.

A pipeline hop moves ``pp_tensors * c * hidden * activation_bytes`` at ``pp_bytes_per_s`` plus
``pp_latency_s``. All layer sums are precomputed per stage so ``stage_cost`` is O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...schedule import ChunkSpec, StageSpec, attention_work, causal_pairs
from ..errors import CostModelError
from ..hardware_spec import HardwareSpec
from ..model_spec import ModelSpec
from .base import BreakdownCostModel, StageTime

__all__ = ["AnalyticCostModel", "sparse_pairs"]


def sparse_pairs(tokens: int, prefix: int, top_k: int) -> float:
    """Pairs when each query at position p attends ``min(p + 1, top_k)`` keys (DSA)."""
    first, last = prefix + 1, prefix + tokens  # keys visible to the first and last query
    if last <= top_k:
        return causal_pairs(tokens, prefix)
    if first >= top_k:
        return float(tokens) * top_k
    below = causal_pairs(top_k - prefix, prefix)  # queries before position top_k: not capped
    return below + (last - top_k) * top_k


@dataclass(frozen=True, slots=True)
class _StageSums:
    num_layers: int
    linear_flops_per_token: float
    attention_flops_per_pair: float
    indexer_flops_per_pair: float
    dense_weight_bytes: float
    moe_layers: int


@dataclass(frozen=True)
class AnalyticCostModel(BreakdownCostModel):
    model: ModelSpec
    hardware: HardwareSpec
    tp_size: int | None = None
    """Chips per pipeline rank; defaults to ``hardware.tp_size``."""
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _sums_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from ..physical_ranges import PHYSICAL_RANGES

        most = int(PHYSICAL_RANGES["hardware"]["tp_size"].high)  # what a hardware preset's tp_size may be
        if self.tp_size is not None and not 1 <= self.tp_size <= most:
            bound = ">= 1 chip" if self.tp_size < 1 else f"at most {most} chips"
            raise CostModelError(f"--tp must be {bound} per pipeline rank, got {self.tp_size}; "
                                 f"omit it for the hardware preset's {self.hardware.tp_size}")

    @property
    def tp(self) -> int:
        return self.tp_size if self.tp_size is not None else self.hardware.tp_size

    def _sums(self, stage: StageSpec) -> _StageSums:
        key = (stage.layer_start, stage.layer_end)
        sums = self._sums_cache.get(key)
        if sums is None:
            m = self.model
            layers = range(stage.layer_start, stage.layer_end)
            assert stage.layer_end <= m.num_layers, (stage, m.num_layers)
            dense = [l for l in layers if not m.is_moe_layer(l)]
            sums = _StageSums(
                num_layers=stage.num_layers,
                linear_flops_per_token=sum(m.linear_flops_per_token(l) for l in layers),
                attention_flops_per_pair=m.attention_flops_per_pair() * stage.num_layers,
                indexer_flops_per_pair=m.indexer_flops_per_pair() * stage.num_layers,
                dense_weight_bytes=sum(m.weight_bytes_per_chunk(l, 1) for l in dense),
                moe_layers=stage.num_layers - len(dense),
            )
            self._sums_cache[key] = sums
        return sums

    def stage_breakdown(self, stage: StageSpec, chunk: ChunkSpec) -> StageTime:
        # The planner (estimate) and the engine ask the same questions: memoise them.
        key = (stage.layer_start, stage.layer_end, stage.visit, chunk.num_tokens, chunk.start,
               tuple((part.num_tokens, part.start) for part in chunk.batch))
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) > 500_000:
                self._cache.clear()
            cached = self._cache[key] = self._breakdown(stage, chunk)
        return cached

    def _breakdown(self, stage: StageSpec, chunk: ChunkSpec) -> StageTime:
        m, hw, tp = self.model, self.hardware, self.tp
        sums = self._sums(stage)
        # A batched forward runs its linear layers, weight streaming and TP collectives once on
        # the total tokens; attention (and the DSA indexer) per request over its own prefix.
        c = chunk.total_tokens
        flops_per_s = hw.peak_flops * tp
        scale = c / (c + hw.half_efficiency_tokens)
        # Linear part: compute bound unless the weights a chunk touches take longer to stream.
        linear_math = c * sums.linear_flops_per_token / (flops_per_s * hw.linear_efficiency * scale)
        weight_bytes = sums.dense_weight_bytes
        if sums.moe_layers:
            weight_bytes += sums.moe_layers * m.weight_bytes_per_chunk(m.num_layers - 1, c)
        linear = max(linear_math, weight_bytes / (hw.hbm_bytes_per_s * tp))
        dense_pairs = attention_work(chunk)
        if m.sparse_top_k:
            pairs = sum(sparse_pairs(part.num_tokens, part.start, m.sparse_top_k) for part in chunk.parts)
            indexer = dense_pairs * sums.indexer_flops_per_pair / (flops_per_s * hw.indexer_efficiency * scale)
        else:
            pairs, indexer = dense_pairs, 0.0
        attention = pairs * sums.attention_flops_per_pair / (flops_per_s * hw.attention_efficiency * scale)
        compute = linear + attention + indexer + sums.num_layers * hw.layer_overhead_s
        tp_comm = 0.0
        if tp > 1:
            message = c * m.hidden_bytes_per_token()
            # The bandwidth term can hide behind math (``tp_exposed_fraction``); the fixed
            # per-collective latency cannot: it is paid once per layer per chunk, so it is what
            # grows with the number of chunks.
            transfer = 2 * (tp - 1) / tp * message / hw.tp_bytes_per_s
            one = hw.tp_latency_s + hw.tp_exposed_fraction * transfer
            tp_comm = one * m.tp_collectives_per_layer * sums.num_layers
        host = hw.chunk_overhead_s if stage.visit == 0 else hw.revisit_overhead_s
        return StageTime(compute, tp_comm, host)

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        hw = self.hardware
        size = hw.pp_tensors * chunk.total_tokens * self.model.hidden_bytes_per_token()
        return hw.pp_latency_s + size / hw.pp_bytes_per_s

    def describe(self) -> str:
        return f"analytic({self.model.name} on {self.hardware.name}, tp={self.tp})"
