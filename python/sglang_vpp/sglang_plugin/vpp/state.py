"""Process-wide state of the VPP mode: the configuration, the layer layout and the stage context.

Data flow: ``install(server_args)`` stores a ``VppConfig``; the first model hook that learns the
layer count builds the fold-back ``Layout`` (``schedule.build_layout``) for this rank; the event
loop enters ``stage_context(s)`` around each virtual stage's forward, which every ownership view
reads (``is_first_rank`` / ``is_last_rank`` of the PP group, the forward's layer range).

[Note: stage context outside a forward]
Outside any stage context, rank 0 (owner of the first and the last virtual stage) looks both
first and last, and every other rank neither: at model construction rank 0 then builds the
embedding, the final norm and the LM head, and the others build only decoder layers. The context
variable is per thread; the forward runs in the scheduler thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Iterator

from sglang_vpp.heartbeat import DEFAULT_HEARTBEAT_S
from sglang_vpp.trace_records import cost_record
from sglang_vpp.schedule import (
    FOLDBACK_MODES,
    Controller,
    ControllerConfig,
    Fold,
    LayoutError,
    LayoutKind,
    Layout,
    PolicySpec,
    StageCostModel,
    build_controller,
    build_layout,
    check_num_ranks,
    get_policy,
    server_controller_config,
)
from sglang_vpp.schedule.auto_size import AutoChunker
from sglang_vpp.schedule.errors import CostModelError
from sglang_vpp.schedule.factory import CostChoice, choose_cost, read_cost_profile

from sglang_vpp.sglang_plugin.options import DEFAULT_COMM_TIMEOUT_S, layer_split_count_error, resolve_comm_timeout

from .errors import VppConfigError

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "VPP_MODES",
    "VppConfig",
    "VppState",
    "get_state",
    "set_state",
    "current_stage",
    "stage_context",
    "load_cost_profile",
]

VPP_MODES: tuple[str, ...] = tuple(str(mode) for mode in FOLDBACK_MODES)


@dataclass(frozen=True, slots=True)
class VppConfig:
    """What the user asked for; built from server arguments, touches nothing."""

    mode: str
    """One of ``VPP_MODES``."""
    pp_size: int
    """Physical pipeline ranks P; the layout has 2P virtual stages (2P-1 with a fused fold)."""
    layer_split: tuple[int, ...] | None = None
    """Per-virtual-stage layer counts (one per stage of the layout), or None for an even split."""
    fold: Fold = Fold.SPLIT
    """``--vpp-fold``: ``fused`` runs the last rank's two stages as one ([Note: fused fold])."""
    comm_timeout_s: float = DEFAULT_COMM_TIMEOUT_S
    """Longest wait for a peer's message before ``CommTimeoutError``."""
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    """An idle rank 0 sends a heartbeat down the pipeline this often (more often when a quarter of
    ``comm_timeout_s`` is shorter: ``LeaderLoop._idle_poll``), so an idle wait does not time out."""
    trace_dir: str | None = None
    """Directory for a Perfetto (Chrome JSON) trace per rank, or None."""
    max_in_flight: int | None = None
    """A fixed limit of micro-batches between stage 0 and the end of the last stage
    (``Controller``'s ``max_in_flight``: also the pack cap, and no deep window); None: the mode's
    ``default_in_flight_limit``."""
    cost_profile: str | None = None
    """Fitted cost model file for the controller's estimates (``--vpp-cost-profile``); None: the
    controller factory's estimate for the device and ``auto`` (``schedule.factory.choose_cost``)."""
    on_cpu: bool = False
    """``--device cpu`` (an input of the controller factory's estimate choice)."""
    auto_chunk: bool = False
    """``--chunked-prefill-size auto``: the controller's ``auto`` chunker sizes each request's
    chunks (at most SGLang's chunked-prefill size, the cap the launcher passed)."""

    def __post_init__(self) -> None:
        if self.mode not in VPP_MODES:
            raise VppConfigError(f"--pp-mode {self.mode!r} is not a VPP mode; expected one of {VPP_MODES}")
        try:
            check_num_ranks(self.pp_size, LayoutKind.FOLDBACK, "--pp-size")
        except LayoutError as error:
            raise VppConfigError(f"--pp-mode {self.mode}: {error}") from None
        count_error = layer_split_count_error(self.layer_split, self.pp_size, self.fold)
        if count_error is not None:
            raise VppConfigError(count_error)

    @property
    def policy(self) -> PolicySpec:
        return get_policy(self.mode)

    @classmethod
    def from_env(cls, mode: str, pp_size: int, layer_split: tuple[int, ...] | None,
                 fold: Fold = Fold.SPLIT) -> "VppConfig":
        """Knobs that are not server flags come from ``SGLANG_VPP_*`` environment variables."""
        trace_dir = os.environ.get("SGLANG_VPP_TRACE_DIR") or None
        max_in_flight = os.environ.get("SGLANG_VPP_MAX_IN_FLIGHT")
        return cls(
            mode=mode,
            pp_size=pp_size,
            layer_split=layer_split,
            fold=fold,
            comm_timeout_s=resolve_comm_timeout(None),
            heartbeat_s=float(os.environ.get("SGLANG_VPP_HEARTBEAT_S") or DEFAULT_HEARTBEAT_S),
            trace_dir=trace_dir,
            max_in_flight=int(max_in_flight) if max_in_flight else None,
        )


@dataclass
class VppState:
    """Per-process state; ``layout`` and ``rank`` are filled in as SGLang initialises."""

    config: VppConfig
    rank: int | None = None
    layout: Layout | None = None
    pp_group: object | None = None
    """SGLang's PP GroupCoordinator (start-up checks)."""
    comm: object | None = None
    """This rank's ``sglang_vpp.comm`` communicator ("fwd" and "bwd" groups to each neighbour)."""
    node_rank: int = 0
    """``--node-rank`` of this process (start-up logs say which node holds which stages)."""
    tp_agreement: object | None = None
    """``tp_agreement.TpAgreement`` of this stage's TP ranks (``SOLO`` at --tp-size 1)."""
    kv_pools_owned: int = 0
    """KV pools allocated through ``ownership`` (owned layers only); an allocation that leaves it
    unchanged went around the hooks, which ``ownership.around_alloc_memory_pool`` refuses."""
    cost_choice: CostChoice | None = None
    """The controller's estimate once chosen (``cost``)."""

    def ensure_layout(self, num_layers: int) -> Layout:
        """Build the fold-back layout the first time the layer count is known; check it after."""
        if self.layout is None:
            try:
                self.layout = build_layout(
                    self.config.pp_size, num_layers, "foldback",
                    list(self.config.layer_split) if self.config.layer_split else None,
                    self.config.fold,
                )
            except LayoutError as exc:
                raise VppConfigError(f"--pp-mode {self.config.mode}: {exc}") from exc
        elif self.layout.num_layers != num_layers:
            raise VppConfigError(
                f"--pp-mode {self.config.mode}: the model builds a second layer stack of {num_layers} "
                f"layers after one of {self.layout.num_layers}; models with several pipelined stacks "
                "(MTP, encoder-decoder) are not supported with VPP; use --pp-mode cpp"
            )
        return self.layout

    def cost(self) -> CostChoice:
        """The controller's estimate, as the controller factory chooses it from this server's
        device, ``auto`` and cost profile (``schedule.factory.choose_cost``); read once."""
        if self.cost_choice is None:
            assert self.layout is not None
            try:
                self.cost_choice = choose_cost(self.layout, on_cpu=self.config.on_cpu,
                                               auto_chunk=self.config.auto_chunk,
                                               profile_path=self.config.cost_profile)
            except CostModelError as exc:
                raise VppConfigError(_profile_refusal(exc)) from None
        return self.cost_choice

    def cost_model(self) -> StageCostModel:
        return self.cost().model

    def cost_source(self) -> str:
        """Where the controller's estimates come from, for the start-up log."""
        return self.cost().source

    def build_controller(self, chunk_size: int, decodes: bool = True) -> Controller:
        """This rank's controller; every rank builds an equal one (``controller_config``)."""
        return build_controller(self.controller_config(chunk_size, decodes))

    def controller_config(self, chunk_size: int, decodes: bool = True) -> ControllerConfig:
        """The server's controller configuration (``schedule.factory.server_controller_config``)
        with this server's mode, layout, estimate, window and ``auto``: chunks are ``chunk_size``
        (SGLang's --chunked-prefill-size), cut by the mode's chunker. ``decodes``: False on the
        prefill server of a prefill-decode split."""
        assert self.layout is not None
        return server_controller_config(self.config.policy, self.layout, chunk_size, self.cost_model(),
                                        max_in_flight=self.config.max_in_flight,
                                        auto_chunk=self.config.auto_chunk, decodes=decodes)

    def controller_inputs(self, controller: Controller) -> dict:
        """What ``check --trace`` needs to rebuild ``controller`` offline."""
        inputs = {
            "mode": self.config.mode,
            "pp_size": self.config.pp_size,
            "stage_layers": [stage.num_layers for stage in self.layout.stages],
            "max_in_flight": self.config.max_in_flight,
            "chunk_size": getattr(controller.chunker, "chunk_size", None),
            "cost": cost_record(controller.cost),
            "decodes": controller.decodes,
        }
        if self.layout.fold is Fold.FUSED:  # absent: split, as in traces written before the option
            inputs["fold"] = str(self.layout.fold)
        if isinstance(controller.chunker, AutoChunker):
            inputs["auto_chunk_cap"] = max(controller.chunker.sizer.candidates)
            inputs["auto_taper"] = controller.chunker.sizer.taper_for is not None
            inputs["auto_partial_fill"] = controller.chunker.sizer.partial_fill
        return inputs

    def owned_stages(self) -> tuple[int, ...]:
        assert self.layout is not None and self.rank is not None
        return self.layout.stages_of(self.rank)

    def owned_layers(self) -> frozenset[int]:
        assert self.layout is not None and self.rank is not None
        return frozenset(
            layer
            for stage in self.owned_stages()
            for layer in range(self.layout.stages[stage].layer_start, self.layout.stages[stage].layer_end)
        )

    def hull(self) -> tuple[int, int]:
        """First owned layer .. last owned layer + 1: what SGLang sees as this rank's range."""
        stages = [self.layout.stages[s] for s in self.owned_stages()]
        return min(s.layer_start for s in stages), max(s.layer_end for s in stages)


def load_cost_profile(path: str) -> StageCostModel:
    """The fitted cost model ``sglang-vpp bench --costs FILE`` wrote; VppConfigError if unreadable."""
    try:
        return read_cost_profile(path)
    except CostModelError as exc:
        raise VppConfigError(_profile_refusal(exc)) from None


def _profile_refusal(exc: CostModelError) -> str:
    return f"--vpp-cost-profile {exc} or leave the flag out"


_STATE: VppState | None = None
_STAGE: contextvars.ContextVar[int | None] = contextvars.ContextVar("sglang_vpp_stage", default=None)


def get_state() -> VppState | None:
    return _STATE


def set_state(state: VppState | None) -> None:
    global _STATE
    _STATE = state


def current_stage() -> int | None:
    return _STAGE.get()


@contextlib.contextmanager
def stage_context(stage: int) -> Iterator[None]:
    """Run the body as virtual stage ``stage`` (see [Note: stage context outside a forward])."""
    token = _STAGE.set(stage)
    try:
        yield
    finally:
        _STAGE.reset(token)
