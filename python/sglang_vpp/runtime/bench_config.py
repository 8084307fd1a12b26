"""``BenchConfig``: what ``sglang-vpp bench`` runs, and the one place its defaults live.

Torch-free on purpose: ``cli/bench_cmd.py`` builds its option defaults from ``BenchConfig()`` when
the CLI starts, before any command imports torch; ``bench.py`` runs the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..schedule.factory import fills_batches
from .spec import DEFAULT_MODES, Device, FaultSpec, RequestArrival, RunSpec, Timeouts

__all__ = ["REPEAT_UNIT", "BenchConfig"]

REPEAT_UNIT = "runs per mode"
"""What one ``BenchConfig.repeat`` (``--repeat``) is, in its range message (``verdict.check_repeats``)."""


@dataclass(frozen=True)
class BenchConfig:
    """What ``sglang-vpp bench`` runs (CLI flags map one to one and take their defaults from here)."""

    model: str = "tiny-qwen3"
    """Preset name or local Hugging Face directory."""
    num_ranks: int = 2
    seq_len: int = 8192
    """Prompt length of every request (tokens)."""
    chunk_size: int = 512
    modes: tuple[str, ...] = DEFAULT_MODES
    num_requests: int = 2
    arrival_interval_s: float = 0.0
    """Request i reaches rank 0 at ``i * arrival_interval_s`` seconds (0: all queued at start)."""
    repeat: int = 5
    """Runs per mode: >= 2 for a verdict (ranges over repeats); 5 keeps it stable on a shared host."""
    device: Device = Device.CPU
    backend: str | None = None
    seed: int = 0
    num_layers: int | None = None
    split: tuple[int, ...] | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    fault: FaultSpec | None = None
    """Test hook: make one rank fail (the CLI reads ``SGLANG_VPP_FAULT``)."""
    profile_planner: bool = True
    """Give the planner (and dcpp's chunk curve) a cost estimate profiled on this model at start-up
    (``profile.profiled_cost_model``), as SGLang's dynamic chunking profiles rank 0; False: the
    schedule core's generic ``LinearAttentionCost``."""
    auto_chunk: bool = False
    """``--chunk-size auto``: the controller picks each request's chunk size and the batch budget
    (``chunk_size`` is the largest it may pick, ``auto_size.AUTO_CAP``); ``RunSpec.auto_chunk``."""
    batch_requests: bool = True
    """``--batch-requests/--no-batch-requests``: ``RunSpec.batch_requests``."""
    partial_fill: bool | None = None
    """``--partial-fill/--no-partial-fill``: ``RunSpec.partial_fill``. None: whenever requests are
    batched (``fills``), as SGLang's prefill adder fills a batch and ``simulate`` does by default."""
    fold: str = "split"
    """``--fold``: ``RunSpec.fold``."""

    @property
    def fills(self) -> bool:
        """Whether a batch starts the request that overflows it: as told, else with the batches.
        Told to fill without batches, ``RunSpec`` refuses (there is no batch to fill)."""
        return fills_batches(self.partial_fill, self.batch_requests)

    def run_spec(self, mode: str, planner_cost: Any = None) -> RunSpec:
        requests = tuple(RequestArrival(self.seq_len, i * self.arrival_interval_s) for i in range(self.num_requests))
        return RunSpec(model=self.model, mode=mode, num_ranks=self.num_ranks, requests=requests,
                       chunk_size=self.chunk_size, seed=self.seed, num_layers=self.num_layers, split=self.split,
                       device=self.device, backend=self.backend, timeouts=self.timeouts, fault=self.fault,
                       planner_cost=planner_cost, auto_chunk=self.auto_chunk, batch_requests=self.batch_requests,
                       partial_fill=self.fills, fold=self.fold)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["device"] = str(self.device)
        data["partial_fill"] = self.fills  # what ran, not how it was asked
        data.pop("fault")
        return data
