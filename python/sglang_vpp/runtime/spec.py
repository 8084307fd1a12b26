"""``RunSpec``: everything one pipelined run needs, as plain picklable data.

Data flow: the bench (or a test) builds a ``RunSpec`` -> ``launcher.launch`` validates it and
pickles it to every rank process -> each rank rebuilds its layout, its share of the model and its
planner replica from it. Constructing a ``RunSpec`` touches nothing (no torch, no disk);
``RunSpec.check()`` validates what can be checked without the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum

from ..timeouts import COMM_TIMEOUT_S
from ..schedule import ChunkingError, Policy, PolicyError, check_chunk_size, check_num_requests
from ..schedule.factory import CLI_FILL_FLAGS, check_partial_fill
from .errors import RunConfigError

__all__ = ["BACKEND_FOR_DEVICE", "DEFAULT_MODES", "Device", "FaultKind", "FaultSpec", "RequestArrival", "RunSpec", "Timeouts",
           "check_pipeline_ranks"]


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"
    NPU = "npu"


#: The modes ``sglang-vpp bench`` runs by default: every policy but vpp-taper and vpp-stream
#: (``--modes`` adds them), which keeps the default CPU run at five modes x five repeats, several
#: minutes.
DEFAULT_MODES: tuple[str, ...] = tuple(p.value for p in Policy if p not in (Policy.VPP_TAPER, Policy.VPP_STREAM))

#: Communication backend (``sglang_vpp.comm`` registry name) per device.
BACKEND_FOR_DEVICE: dict[Device, str] = {Device.CPU: "gloo", Device.CUDA: "nccl", Device.NPU: "hccl"}


def check_pipeline_ranks(num_ranks: int, flag: str = "--pp") -> None:
    """A pipelined run takes at least 2 rank processes, whatever the mode: the one check of
    ``bench --pp`` and ``RunSpec``. ``flag`` names the count in the message."""
    if not isinstance(num_ranks, int) or num_ranks < 2:
        raise RunConfigError(f"{flag} must be >= 2 for a pipelined run, got {num_ranks!r}; the single-process "
                             f"reference is what {flag} 1 would compute")


@dataclass(frozen=True, slots=True)
class RequestArrival:
    """One prompt: its length and when it reaches rank 0, in seconds after the run starts."""

    length: int
    arrival_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 1:
            raise RunConfigError(f"request length must be an integer >= 1, got {self.length!r}")
        if self.arrival_s < 0:
            raise RunConfigError(f"request arrival must be >= 0 s, got {self.arrival_s!r}")


class FaultKind(StrEnum):
    KILL = "kill"  # SIGKILL the rank process: no goodbye, no traceback
    RAISE = "raise"  # raise inside the rank: a Python error with a traceback
    HANG = "hang"  # stop making progress (sleep): peers must time out


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Test hook: make ``rank`` fail after it has executed ``after_actions`` actions."""

    rank: int
    after_actions: int
    kind: FaultKind = FaultKind.KILL

    @classmethod
    def from_env(cls, text: str | None = None) -> FaultSpec | None:
        """``SGLANG_VPP_FAULT="rank=1,after=5,kind=kill"`` (how CLI tests inject a fault)."""
        text = os.environ.get("SGLANG_VPP_FAULT") if text is None else text
        if not text:
            return None
        try:
            fields = dict(part.split("=", 1) for part in text.split(","))
            return cls(int(fields["rank"]), int(fields.get("after", "0")), FaultKind(fields.get("kind", "kill")))
        except (KeyError, ValueError):
            raise RunConfigError(
                f"SGLANG_VPP_FAULT={text!r} is malformed; expected e.g. 'rank=1,after=5,kind=kill' "
                f"(kind: {', '.join(k.value for k in FaultKind)})"
            ) from None


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Every wait of a run is bounded by one of these (seconds)."""

    comm_s: float = COMM_TIMEOUT_S
    """One communication wait (a receive, a blocking send, the final drain of sends)."""
    control_s: float = 120.0
    """A follower rank waiting for the coordinator's next planning op."""
    startup_s: float = 120.0
    """Process start, ``init_process_group`` and communicator creation."""
    run_s: float = 1800.0
    """The whole run, start to last report; then every rank is stopped."""
    grace_s: float = 5.0
    """After a rank fails: how long the others get to report their own error before being killed."""


@dataclass(frozen=True)
class RunSpec:
    """One pipelined prefill run (see the module docstring)."""

    model: str
    """A preset name (``tiny-qwen3``) or a local Hugging Face directory."""
    mode: str
    """cpp, dcpp, vpp, vpp-async, vpp-pack, vpp-taper or vpp-stream."""
    num_ranks: int
    requests: tuple[RequestArrival, ...]
    chunk_size: int
    """Fixed chunk size (the base size for dcpp); with ``auto_chunk`` the largest allowed."""
    seed: int = 0
    """Weights seed (presets) and prompt token seed."""
    num_layers: int | None = None
    """Override the model's layer count (presets only)."""
    split: tuple[int, ...] | None = None
    """Per-stage layer counts; default: even split."""
    device: Device = Device.CPU
    backend: str | None = None
    """Comm backend name; default ``BACKEND_FOR_DEVICE[device]``."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    fault: FaultSpec | None = None
    planner_cost: object | None = None
    """A picklable ``StageCostModel`` for the planner's estimates (and dcpp's chunk curve);
    None: the schedule core's default ``LinearAttentionCost``."""
    prepost_recvs: bool = True
    """Async modes: post receives ahead (in link order) so a transfer overlaps compute."""
    collect_outputs: bool = True
    """Write the last stage's outputs (hidden states, logits) for comparison with the reference."""
    num_threads: int = 1
    """torch intra-op threads per rank; 1 makes thread CPU time equal the compute's CPU cost."""
    batch_requests: bool = True
    """Batch whole short requests into one forward up to ``chunk_size`` tokens (several
    sequences per forward, attention per sequence), as SGLang's prefill adder does and the
    simulator assumes; False: one request per forward."""
    partial_fill: bool | None = None
    """With ``batch_requests``: the request that overflows the budget starts in what is left of it
    (a head in the batch, its rest the request's next chunks, cut from the head's end), as
    SGLang's prefill adder does; False: whole requests only; None: whenever requests are batched
    (``factory.fills_batches``)."""
    auto_chunk: bool = False
    """Cut each request at the size the controller's ``auto`` chunker picks for it
    (``schedule/auto_size.py``) from the planner's cost estimate."""
    fold: str = "split"
    """A fold-back mode's fold: ``split`` or ``fused`` (``schedule/layout.py``, [Note: fused fold])."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", Device(self.device))
        object.__setattr__(self, "requests", tuple(self.requests))

    def layout(self, num_layers: int):
        """The layout every rank and the bench build for a model of ``num_layers`` layers
        (LayoutError when it does not fit)."""
        from ..schedule import policy_layout

        return policy_layout(self.mode, self.num_ranks, num_layers, self.split, self.fold)

    @property
    def backend_name(self) -> str:
        return self.backend or BACKEND_FOR_DEVICE[self.device]

    @property
    def max_length(self) -> int:
        return max(r.length for r in self.requests)

    def check(self) -> None:
        """Validate what needs no model (the launcher also checks the layout against the model)."""
        from ..schedule import get_policy

        try:
            get_policy(self.mode)
        except PolicyError as error:
            raise RunConfigError(str(error)) from None
        check_pipeline_ranks(self.num_ranks)
        try:
            check_num_requests(len(self.requests), "--requests")
            check_chunk_size(self.chunk_size, "--chunk-size")
        except ChunkingError as error:
            raise RunConfigError(str(error)) from None
        check_partial_fill(self.partial_fill, self.batch_requests, RunConfigError, CLI_FILL_FLAGS)
        from ..schedule import LayoutError, parse_fold

        try:
            parse_fold(self.fold)
        except LayoutError as error:
            raise RunConfigError(f"--fold: {error}") from None
        if self.fault is not None and not 0 <= self.fault.rank < self.num_ranks:
            raise RunConfigError(f"fault rank {self.fault.rank} is not in 0..{self.num_ranks - 1}")
