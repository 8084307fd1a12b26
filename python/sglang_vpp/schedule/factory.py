"""The one place a controller is built, for every executor and command.

``schedule``, ``check``, ``simulate``, ``bench`` (the reference runtime) and the SGLang plugin
all get their controller here, so a mode means the same thing everywhere: the chunker (fixed,
tapered for the pipeline depth, or the DCPP curve fitted on the cost estimate of stage 0 with
the policy's smoothing), the in-flight limit, the batching budget, the groups per link and the
cost estimate. An executor states only what differs in *its* world: the cost model it has, the
longest prompt it will see (the DCPP curve is fitted up to it), whether it can run several
requests in one forward, and whether its transport needs one direction per link. An executor
that has no cost model of its own (a server) states its device, whether chunks are ``auto``
and its cost profile, and ``choose_cost`` picks the estimate (``CostChoice``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .chunking import Chunker, DynamicChunker, FixedChunker, FlatCurveFallback, TaperedChunker
from .controller import Controller
from .cost import LinearAttentionCost, StageCostModel
from .cpu_cost import cpu_serving_cost
from .errors import ChunkingError, CostModelError, FlatCurveError, PolicyError
from .fitted_cost import FittedCostModel
from .ir import ChunkSpec
from .layout import Fold, Layout, LayoutKind, build_layout, parse_fold, stage_count
from .policies import PolicySpec, dcpp, get_policy, parse_policies, vpp_taper

__all__ = ["DEFAULT_COST_DESCRIPTION", "PARTIAL_FILL_NEEDS_BATCHING", "SERVER_NUM_GROUPS", "ControllerConfig", "CostChoice", "build_controller",
           "CLI_FILL_FLAGS", "CORE_FILL_ARGS", "check_partial_fill", "fills_batches", "choose_cost", "controller_config", "default_chunker", "mode_stages", "plan_stages", "policy_layout", "read_cost_profile",
           "server_controller_config", "tapered_chunker"]

SERVER_NUM_GROUPS = 2
"""Groups per link on an SGLang server, whatever the mode: its transport keeps a receive posted
on every link, so each link carries one direction (``sglang_plugin/vpp/transport.py``)."""


def policy_layout(policy: str | PolicySpec, num_ranks: int, num_layers: int, split: Sequence[int] | None = None,
                  fold: Fold | str = Fold.SPLIT) -> Layout:
    """The layout ``policy`` runs on: its layout kind, ``split`` layer counts per stage, and for a
    fold-back mode ``fold`` (``layout.py``, [Note: fused fold]). A contiguous mode has no fold and
    ignores it, so one ``--fold`` serves a matrix of modes. LayoutError for a bad value."""
    spec = policy if isinstance(policy, PolicySpec) else get_policy(policy)
    fold = parse_fold(fold)
    return build_layout(num_ranks, num_layers, spec.layout_kind, split,
                        fold if spec.layout_kind is LayoutKind.FOLDBACK else Fold.SPLIT)


def mode_stages(modes: str | Sequence[str | PolicySpec], num_ranks: int,
                fold: Fold | str = Fold.SPLIT) -> dict[str, int]:
    """Each of ``modes`` (a comma-separated text or a list) with the stages of its layout on
    ``num_ranks`` ranks, as ``policy_layout`` lays them out: how many counts a layer split of that
    mode takes. PolicyError for an unknown mode."""
    specs = parse_policies(modes) if isinstance(modes, str) else [
        m if isinstance(m, PolicySpec) else get_policy(m) for m in modes]
    fold = parse_fold(fold)
    return {str(spec.name): stage_count(spec.layout_kind, num_ranks,
                                        fold if spec.layout_kind is LayoutKind.FOLDBACK else Fold.SPLIT)
            for spec in specs}


def plan_stages(modes: str | Sequence[str | PolicySpec], num_ranks: int, fold: Fold | str = Fold.SPLIT) -> int:
    """Stages of the deepest layout among ``modes`` (``mode_stages``): what a run of these modes
    is weighed by in ``check_chunk_counts``. PolicyError for an unknown mode."""
    return max(mode_stages(modes, num_ranks, fold).values())


def tapered_chunker(chunk_size: int, layout: Layout) -> TaperedChunker:
    """vpp-taper's chunker: chunks of at most ``chunk_size`` planned for ``layout``'s depth
    (``policies/vpp_taper.py``); also the tapered cut ``auto`` weighs (``auto_size.py``). The
    depth is the method's stage count, whatever the fold: a fused fold keeps the 2P-1 window
    the cut fills ([Note: fused fold])."""
    return TaperedChunker(chunk_size, vpp_taper.TAPER_RATIO, vpp_taper.CHUNKS_PER_STAGE * layout.method_stages,
                          vpp_taper.MIN_BODY_TOKENS)


def default_chunker(policy: PolicySpec, chunk_size: int, layout: Layout, cost: StageCostModel | None,
                    max_length: int) -> Chunker:
    """Fixed chunks; for vpp-taper chunks planned for the pipeline depth; for dcpp a curve fitted
    on the cost estimate of stage 0 up to ``max_length`` tokens (as SGLang profiles prefill
    latency on PP rank 0 at start-up), smoothed by ``policies.dcpp.SMOOTH_FACTOR``. A fit that
    does not grow super-linearly gives fixed chunks (``FlatCurveFallback``), as SGLang serves when
    its fit fails, not an error: the executor reports the fallback's reason."""
    if policy.tapered_chunks:
        return tapered_chunker(chunk_size, layout)
    if not policy.dynamic_chunks:
        return FixedChunker(chunk_size)
    estimate = cost if cost is not None else LinearAttentionCost()
    stage = layout.stages[0]

    def latency(length: int) -> float:
        return estimate.stage_cost(stage, ChunkSpec(0, 0, 0, length))

    try:
        return DynamicChunker.from_latency_fn(latency, chunk_size, max(max_length, 2 * chunk_size),
                                              smooth_factor=dcpp.SMOOTH_FACTOR)
    except FlatCurveError as flat:
        # A measured estimate of a tiny model can be linear in length to within timing noise.
        return FlatCurveFallback(chunk_size, f"dcpp ran fixed {chunk_size}-token chunks (cpp in effect): {flat}")


@dataclass(frozen=True, slots=True)
class CostChoice:
    """The estimate a controller decides with, and where it comes from (for a log line)."""

    model: StageCostModel
    source: str


DEFAULT_COST_DESCRIPTION = ("with --chunked-prefill-size auto on --device cpu, the CPU estimate measured on the "
                            "tiny Qwen2 (schedule/cpu_cost.py); otherwise the analytic linear + attention estimate")
"""What ``choose_cost`` picks without a profile, in words: the ``--vpp-cost-profile`` help quotes it,
so a change to the choice below changes the help with it."""


def choose_cost(layout: Layout, *, on_cpu: bool, auto_chunk: bool, profile_path: str | None = None) -> CostChoice:
    """The estimate of an executor that has no cost model of its own (an SGLang server):

    - a fitted profile when it has one (``profile_path``, written by ``sglang-vpp bench --costs``);
    - on CPU with ``auto`` chunks, the measured CPU estimate (``cpu_cost.py``): only ``auto``
      weighs compute against per-forward costs, so only it needs real seconds;
    - else the analytic estimate, whose ratios are all admission and order read (fixed chunk
      sizes keep the estimate every packing test was written against).

    CostModelError when the profile cannot be read or was fitted for another layout or model."""
    if profile_path:
        profile = read_cost_profile(profile_path)
        try:
            profile.check_layout(layout)
        except CostModelError as exc:
            raise CostModelError(f"{profile_path!r} {exc}") from None
        return CostChoice(profile, f"fitted cost model from --vpp-cost-profile {profile_path}")
    if on_cpu and auto_chunk:
        return CostChoice(cpu_serving_cost(layout),
                          "the CPU estimate measured on the tiny Qwen2 (schedule/cpu_cost.py: compute plus the "
                          "loop's host time per forward; no --vpp-cost-profile, pass one for another model)")
    if auto_chunk:
        # It has no per-forward cost, so every extra chunk looks free to the auto planner.
        return CostChoice(LinearAttentionCost(),
                          "the analytic linear + attention estimate (no --vpp-cost-profile): it has no "
                          "per-forward cost, so --chunked-prefill-size auto will pick the smallest chunks; pass "
                          "--vpp-cost-profile FILE from 'sglang-vpp bench --costs FILE'")
    return CostChoice(LinearAttentionCost(), "the analytic linear + attention estimate (no --vpp-cost-profile)")


def read_cost_profile(path: str) -> FittedCostModel:
    """The fitted cost model in ``path``; CostModelError (the path, the cause, the fix) if unreadable."""
    try:
        return FittedCostModel.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CostModelError(f"{path!r} is not a readable fitted cost model ({exc}); write one with "
                             "'sglang-vpp bench --costs FILE'") from None


_NEEDS_BATCHING = ("{fill} needs {batching}: it starts a request in what a batch of whole requests leaves of "
                   "the budget, and without batching there is no batch")
CLI_FILL_FLAGS = ("--partial-fill", "--batch-requests")
"""The names an executor's command line gives partial fill and batching."""
CORE_FILL_ARGS = ("partial_fill", "batching=True")
"""The names a library caller of ``controller_config`` / ``build_schedule`` gives them."""
PARTIAL_FILL_NEEDS_BATCHING = _NEEDS_BATCHING.format(fill=CLI_FILL_FLAGS[0], batching=CLI_FILL_FLAGS[1])
"""The executors' refusal of partial fill without batching (the fill would do nothing)."""


def check_partial_fill(partial_fill: bool | None, batching: bool, error: type[ValueError] = ChunkingError,
                       names: tuple[str, str] = CORE_FILL_ARGS) -> None:
    """Partial fill needs batches to fill: the one check of ``controller_config`` and of the
    executors' configs, which pass their own ``error`` type and their flags' ``names``
    (``CLI_FILL_FLAGS``)."""
    if partial_fill and not batching:
        raise error(_NEEDS_BATCHING.format(fill=names[0], batching=names[1]))


def fills_batches(partial_fill: bool | None, batching: bool) -> bool:
    """Whether a planner's batches start the request that overflows them: as told, else (None)
    whenever it batches, as SGLang's prefill adder does. Every ``partial_fill`` that may be left
    None (the schedule core's, the runtime's and the simulator's configs) resolves here."""
    return batching if partial_fill is None else partial_fill


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Everything a controller is built from (``controller_config`` fills the defaults)."""

    policy: PolicySpec
    layout: Layout
    chunker: Chunker
    cost: StageCostModel
    max_in_flight: int | None = None
    """Micro-batches between entering stage 0 and leaving the last stage; None: the
    controller's default (``default_in_flight_limit``)."""
    num_groups: int | None = None
    """Groups per link (1 or 2); None: the policy's."""
    token_budget: int | None = None
    """Tokens one prefill forward may carry when whole requests are batched (SGLang's
    chunked-prefill size); None: one request per forward."""
    decodes: bool = True
    """Whether the executor decodes (False: the prefill server of a prefill-decode split)."""
    partial_fill: bool = False
    """A request that overflows ``token_budget`` starts in what is left of it, as SGLang's prefill
    adder does (``Controller.joining_tokens``); False: whole requests only."""

    def __post_init__(self) -> None:
        if self.layout.kind is not self.policy.layout_kind:
            raise PolicyError(
                f"mode {self.policy.name} needs a {self.policy.layout_kind} layout, got {self.layout.kind}"
            )
        # The limits are checked where they are used: ``Controller.__init__``.


def controller_config(policy: str | PolicySpec, layout: Layout, chunk_size: int, cost: StageCostModel | None,
                      max_length: int, *, batching: bool = True, max_in_flight: int | None = None,
                      num_groups: int | None = None, chunker: Chunker | None = None, auto_chunk: bool = False,
                      forward_batches: bool | None = None, decodes: bool = True,
                      auto_taper: bool = True, partial_fill: bool | None = None) -> ControllerConfig:
    """The configuration of ``policy``'s controller on ``layout`` with base chunk ``chunk_size``.

    ``cost``: the estimate the controller decides with (None: ``LinearAttentionCost``).
    ``max_length``: the longest prompt the executor will chunk (the DCPP fit's range).
    ``batching``: whole requests join a forward up to ``chunk_size`` tokens, as SGLang's prefill
    adder fills a batch; False for executors that run one request per forward.
    ``chunker``: replaces the policy's (tests and what-ifs only).
    ``auto_chunk``: the ``auto`` chunker (``auto_size.py``) picks each size among the candidates
    up to ``chunk_size``, planning with whole short requests batched when ``forward_batches``
    (default: ``batching``; an SGLang server batches although its controller does not form
    the batches).
    ``decodes``: False on a server that only prefills (no decode slots, ``decode_groups``).
    ``auto_taper``: ``auto`` also weighs the tapered cut where the mode allows (False: only the
    mode's own cut, as servers traced before the tapered cut was weighed chose).
    ``partial_fill``: with ``batching``, a request that overflows the budget starts in what is
    left of it (``ControllerConfig.partial_fill``); ``auto`` plans so. None: whenever there are
    batches (``fills_batches``). Told to fill without the batches (neither ``batching`` nor
    ``forward_batches``) it is refused (``check_partial_fill``)."""
    batches = batching if forward_batches is None else forward_batches
    batched = batching or batches  # the controller's own batches, or SGLang's
    partial_fill = fills_batches(partial_fill, batched)
    check_partial_fill(partial_fill, batched)
    spec = policy if isinstance(policy, PolicySpec) else get_policy(policy)
    estimate = cost if cost is not None else LinearAttentionCost()
    if chunker is None and auto_chunk:
        from .auto_size import auto_chunker  # auto_size plans with the planner, which imports this module

        chunker = auto_chunker(spec, layout, estimate, chunk_size, max_in_flight=max_in_flight, batch=batches,
                               taper=auto_taper, partial_fill=partial_fill)
    elif chunker is None:
        chunker = default_chunker(spec, chunk_size, layout, estimate, max_length)
    return ControllerConfig(spec, layout, chunker, estimate, max_in_flight, num_groups,
                            chunk_size if batching else None, decodes, partial_fill)


def server_controller_config(policy: str | PolicySpec, layout: Layout, chunk_size: int, cost: StageCostModel | None,
                             *, max_in_flight: int | None = None, auto_chunk: bool = False, decodes: bool = True,
                             auto_taper: bool = True, auto_partial_fill: bool = True) -> ControllerConfig:
    """The configuration of an SGLang server's controller (``VppState.build_controller``), and of
    every controller that stands for one: ``check --trace`` proves a server obeyed its controller
    only by rebuilding this same one from the trace (``serving.decision_replay``).

    What a server fixes: SGLang forms its own batches (the controller only sizes them), so the
    controller has no token budget of its own, while ``auto`` plans SGLang's batching: whole
    short requests, and with ``auto_partial_fill`` the head of the one that overflows (SGLang's
    adder truncates it to the budget left; ``ControllerConfig.partial_fill``);
    ``SERVER_NUM_GROUPS`` groups per link; and ``chunk_size`` (--chunked-prefill-size, the cap
    under ``auto``) stands for the longest prompt, which only the DCPP fit reads, and dcpp is no
    mode of the plugin. What varies, as in ``controller_config``: ``max_in_flight``,
    ``auto_chunk``, ``decodes`` (False: the prefill server of a prefill-decode split),
    ``auto_taper`` and ``auto_partial_fill`` (False: auto plans whole requests only, as servers
    traced before it planned the fill chose)."""
    return controller_config(policy, layout, chunk_size, cost, chunk_size, batching=False,
                             max_in_flight=max_in_flight, num_groups=SERVER_NUM_GROUPS, auto_chunk=auto_chunk,
                             forward_batches=True, decodes=decodes, auto_taper=auto_taper,
                             partial_fill=auto_chunk and auto_partial_fill)


def build_controller(config: ControllerConfig) -> Controller:
    """A fresh controller for ``config``; every rank of a pipeline builds an equal one."""
    return Controller(config.policy, config.layout, config.cost, config.max_in_flight,
                      token_budget=config.token_budget, chunker=config.chunker, num_groups=config.num_groups,
                      decodes=config.decodes, partial_fill=config.partial_fill)
