"""Fold-back layer ownership inside SGLang: rank r holds virtual stages r and 2P-1-r.

Job: make SGLang's model runner build, load, and cache only the layers of this rank's two
virtual stages, and run one virtual stage per forward. Every change is a hook on SGLang
(registered by ``vpp.install``, listed in ``hook_targets.py``); no SGLang code is copied.

Data flow at start-up (all in the scheduler process of each PP rank):

    initialize_model_parallel --after--> PP group gets a stage view; comm communicator ("fwd"/"bwd") created
    get_pp_indices / make_layers --around--> layout built from num_hidden_layers; each owned
        stage built in its own layer stack; the rest PPMissingLayer; the hull reported as range
    DefaultModelLoader._get_all_weights --around--> weights of unowned layers dropped
    DefaultPoolConfigurator._compute_cell_size --around--> KV bytes per token count owned layers
    ModelRunner.load_model --after--> model class checked, no DSA index-key cache (SGLang would
        allocate it for the whole hull), no graph capture left on (SGLang's
        resolved setting: a captured graph would replay the whole hull), layer-range holder located
    MHATokenToKVPool._create_buffers_normal / MLATokenToKVPool._create_buffers --around--> real
        K/V only for owned layers, zero-row placeholders for the unowned layers inside the hull
    ModelRunner.alloc_memory_pool --around--> refused when its pool allocated around those hooks

At run time ``forward_range(runner, stage)`` sets the model's ``start_layer``/``end_layer`` to
the stage's range for one forward (models loop ``range(self.start_layer, self.end_layer)``),
and ``stage_context`` (state.py) flips the PP group's first/last view.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch

from .errors import VppConfigError
from .sparse_attention import sparse_attention_refusal, uses_sparse_attention_cache
from .state import current_stage, get_state

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_MODEL_CLASSES",
    "after_initialize_model_parallel",
    "around_get_pp_indices",
    "around_make_layers",
    "around_get_all_weights",
    "around_compute_cell_size",
    "around_create_buffers_normal",
    "around_create_mla_buffers",
    "around_alloc_memory_pool",
    "after_load_model",
    "graph_capture_left_on",
    "forward_range",
    "layer_holder",
]

SUPPORTED_MODEL_CLASSES = frozenset(
    {
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "Glm4MoeForCausalLM",
    }
)
"""Classes whose forward loops ``range(self.model.start_layer, self.model.end_layer)`` and whose
first/last decisions all go through the PP group; others are refused at start-up."""

_FORCED_RANGE: list[tuple[int, int]] = []
"""Stack of ranges ``get_pp_indices`` must return while ``around_make_layers`` builds a stage."""


# ---------------------------------------------------------------- the PP group's stage view
def _view_is_first(group: Any) -> bool:
    stage = current_stage()
    if stage is None:  # [Note: stage context outside a forward]
        return group.rank_in_group == 0
    return stage == 0


def _view_is_last(group: Any) -> bool:
    stage = current_stage()
    if stage is None:
        return group.rank_in_group == 0
    state = get_state()
    assert state is not None and state.layout is not None
    return stage == state.layout.last_stage


def _install_stage_view(group: Any) -> None:
    """Give the live PP group a stage-aware first/last view.

    Models keep a reference to the group from construction, so the view changes the object's
    class instead of replacing the object.
    """
    base = type(group)
    if getattr(base, "_sglang_vpp_view", False):
        return
    view = type(
        f"Vpp{base.__name__}",
        (base,),
        {
            "_sglang_vpp_view": True,
            "is_first_rank": property(_view_is_first),
            "is_last_rank": property(_view_is_last),
        },
    )
    group.__class__ = view


def after_initialize_model_parallel(result: Any, *args: Any, **kwargs: Any) -> None:
    """Stage view on ``_PP``; create the communicator (collective: same order on all ranks)."""
    state = get_state()
    if state is None:
        return None
    from sglang.srt.distributed import parallel_state as ps

    pp = ps._PP
    if pp is None or pp.world_size != state.config.pp_size:
        raise VppConfigError(
            f"--pp-mode {state.config.mode}: expected a PP group of {state.config.pp_size} ranks, "
            f"got {None if pp is None else pp.world_size}"
        )
    state.rank = pp.rank_in_group
    _install_stage_view(pp)
    state.pp_group = pp
    # [Note: direction groups] the loop's point-to-point traffic goes through sglang_vpp.comm: one
    # communicator with a "fwd" and a "bwd" group per neighbour pair (distinct communicators, so
    # a fold-back transfer never queues behind a forward-sweep transfer), backend from the device.
    # [Note: TP pipelines] with --tp-size T there are T pipelines, one per TP index; both the
    # communicator's links and the TP agreement groups are created collectively over the world.
    from .tp_agreement import SOLO, all_pp_pairs, open_tp_agreement
    from .transport import open_communicator

    world = ps.get_world_group().cpu_group
    timeout = state.config.comm_timeout_s
    state.comm = open_communicator(pp.device, list(pp.ranks), timeout, all_pairs=all_pp_pairs(world, pp.ranks))
    tp = ps.get_tp_group()
    state.tp_agreement = open_tp_agreement(world, tp.ranks, timeout) if tp.world_size > 1 else SOLO
    return None


# ---------------------------------------------------------------- layers
def around_get_pp_indices(original, num_hidden_layers: int, pp_rank: int, pp_size: int):
    if _FORCED_RANGE:
        return _FORCED_RANGE[-1]
    state = get_state()
    if state is None or pp_size != state.config.pp_size or state.rank is None:
        return original(num_hidden_layers, pp_rank, pp_size)
    state.ensure_layout(num_hidden_layers)
    if pp_rank != state.rank:
        raise VppConfigError(f"get_pp_indices asked for rank {pp_rank} on rank {state.rank}")
    return state.hull()


def around_make_layers(original, num_hidden_layers, layer_fn, pp_rank=None, pp_size=None, *args, **kwargs):
    """Build each owned stage in its own layer stack; report the hull as (start, end)."""
    state = get_state()
    if state is None or pp_rank is None or pp_size is None or pp_size != state.config.pp_size:
        return original(num_hidden_layers, layer_fn, pp_rank, pp_size, *args, **kwargs)
    from sglang.srt.layers.utils import PPMissingLayer

    layout = state.ensure_layout(num_hidden_layers)
    return_tuple = kwargs.get("return_tuple", args[1] if len(args) > 1 else False)
    modules: list[torch.nn.Module] = [PPMissingLayer(return_tuple=return_tuple) for _ in range(num_hidden_layers)]
    for stage in state.owned_stages():
        spec = layout.stages[stage]
        _FORCED_RANGE.append((spec.layer_start, spec.layer_end))
        try:
            built, start, end = original(num_hidden_layers, layer_fn, pp_rank, pp_size, *args, **kwargs)
        finally:
            _FORCED_RANGE.pop()
        assert (start, end) == (spec.layer_start, spec.layer_end), (start, end, spec)
        for index in range(start, end):
            modules[index] = built[index]
    hull_start, hull_end = state.hull()
    logger.info(
        "VPP node %s holds virtual stages %s: pp rank %d (global rank %d) builds layers %s of %d; hull [%d, %d)",
        state.node_rank, state.owned_stages(), state.rank, torch.distributed.get_rank(),
        sorted(state.owned_layers()), num_hidden_layers, hull_start, hull_end,
    )  # fmt: skip
    return torch.nn.ModuleList(modules), hull_start, hull_end


def around_get_all_weights(original, self, model_config, model):
    """Drop checkpoint tensors of decoder layers this rank does not own (before any copy)."""
    state = get_state()
    weights = original(self, model_config, model)
    if state is None or state.layout is None or state.rank is None:
        yield from weights
        return
    from sglang.srt.layers.utils import get_layer_id

    owned = state.owned_layers()
    for name, tensor in weights:
        layer_id = get_layer_id(name)
        if layer_id is not None and layer_id not in owned:
            continue
        yield name, tensor


def around_compute_cell_size(original, self, kvc, num_layers, *args, **kwargs):
    """KV bytes per token: count the owned layers, not the hull."""
    state = get_state()
    if state is not None and state.layout is not None and state.rank is not None:
        start, end = state.hull()
        if num_layers == end - start:
            num_layers = len(state.owned_layers())
    return original(self, kvc, num_layers, *args, **kwargs)


def _allocate_owned(original, pool: Any, buffer_names: tuple[str, ...]) -> None:
    """Run the pool's own allocation for the owned layers only, then put zero-row placeholders
    (never read or written) where the hull's unowned layers sit, so SGLang's
    ``layer_id - start_layer`` indexing stays valid; log what this rank holds."""
    state = get_state()
    assert state is not None
    owned = state.owned_layers()
    keep = [layer in owned for layer in range(pool.start_layer, pool.start_layer + pool.layer_num)]
    if all(keep):
        original(pool)
    else:
        full = pool.layer_num
        pool.layer_num = sum(keep)
        try:
            original(pool)
        finally:
            pool.layer_num = full
        for name in buffer_names:
            real = iter(getattr(pool, name))
            empty = (0, *getattr(pool, name)[0].shape[1:])
            setattr(pool, name, [
                next(real) if kept else torch.empty(empty, dtype=pool.store_dtype, device=pool.device) for kept in keep
            ])  # fmt: skip
    num_bytes = sum(t.numel() * t.element_size() for name in buffer_names for t in getattr(pool, name))
    state.kv_pools_owned += 1
    _log_kv_allocation(state, pool, num_bytes)


def around_create_buffers_normal(original, self):
    """MHA pools: K and V for owned layers only (``_allocate_owned``)."""
    state = get_state()
    if state is None or state.layout is None or state.rank is None:
        return original(self)
    if getattr(self, "kv_cache_layout", "nhd") != "nhd":
        raise VppConfigError(
            f"--pp-mode {state.config.mode} supports the NHD KV layout only, got {self.kv_cache_layout!r}; "
            "unset SGLANG_USE_HND_KVCACHE / the AITER layout"
        )
    _allocate_owned(original, self, ("k_buffer", "v_buffer"))
    return None


def around_create_mla_buffers(original, self):
    """MLA (DeepSeek) pools: one latent buffer per layer, for owned layers only."""
    state = get_state()
    if state is None or state.layout is None or state.rank is None:
        return original(self)
    _allocate_owned(original, self, ("kv_buffer",))
    return None


def _log_kv_allocation(state: Any, pool: Any, num_bytes: int) -> None:
    """Per rank: owned layers and KV token capacity, next to what a contiguous split would hold
    (the schedule core's even contiguous layout; SGLang's own split may place a remainder layer
    on another rank)."""
    from sglang_vpp.schedule import build_layout

    layout = state.layout
    owned = sorted(state.owned_layers())
    stock = build_layout(layout.num_ranks, layout.num_layers, "contiguous").stages[state.rank]
    per_layer = num_bytes / max(1, len(owned))
    logger.info(
        "VPP KV rank %d (node %s): layers %s (%d of %d), %d token slots, %.2f MiB; a contiguous PP split "
        "(stock PP's layout) on this rank: layers [%d, %d) (%d), %.2f MiB for the same slots",
        state.rank, state.node_rank, owned, len(owned), layout.num_layers, pool.size, num_bytes / 2**20,
        stock.layer_start, stock.layer_end, stock.num_layers, per_layer * stock.num_layers / 2**20,
    )  # fmt: skip


# ---------------------------------------------------------------- model checks and forward range
def layer_holder(model: torch.nn.Module) -> torch.nn.Module:
    """The submodule that owns ``layers`` and the ``start_layer``/``end_layer`` loop bounds."""
    inner = getattr(model, "model", None)
    if inner is not None and all(hasattr(inner, a) for a in ("layers", "start_layer", "end_layer")):
        return inner
    raise VppConfigError(
        f"--pp-mode vpp*: model class {type(model).__name__} has no `.model` with layers/start_layer/"
        f"end_layer; supported classes: {sorted(SUPPORTED_MODEL_CLASSES)}. Use --pp-mode cpp for this model."
    )


def graph_capture_left_on() -> str:
    """What of SGLang's published (resolved) graph settings would still capture: empty if none."""
    from sglang.srt.model_executor.cuda_graph_config import check_cuda_graph_backend
    from sglang.srt.runtime_context import get_flags

    on = [f"{phase} graphs" for phase in ("decode", "prefill") if not check_cuda_graph_backend(phase, "disabled")]
    if get_flags().capture.enable_torch_compile:
        on.append("torch.compile")
    return ", ".join(on)


def around_alloc_memory_pool(original: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    """Refuse a KV pool whose buffers were not allocated through the ownership hooks (a pool
    class of another device, quantized KV buffers, one SGLang adds later): it holds every layer
    of the hull in memory ``around_compute_cell_size`` sized for the owned layers, refused before
    any request is served."""
    state = get_state()
    before = state.kv_pools_owned if state is not None else 0
    result = original(runner, *args, **kwargs)
    if state is None or getattr(runner, "is_draft_worker", False) or state.kv_pools_owned > before:
        return result
    pool = type(getattr(runner, "token_to_kv_pool", None)).__name__
    raise VppConfigError(
        f"--pp-mode {state.config.mode}: SGLang's KV pool {pool} allocated its buffers by code the plugin "
        "does not hook (a pool class of another device, or quantized KV buffers), so it holds every layer of "
        "the rank's range in memory sized for the owned layers; the plugin allocates the owned layers through "
        "MHATokenToKVPool._create_buffers_normal and MLATokenToKVPool._create_buffers. Use another "
        "--kv-cache-dtype, or --pp-mode cpp / dcpp."
    )


def after_load_model(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """Refuse models the fold-back forward cannot drive, before any request is served."""
    state = get_state()
    if state is None or getattr(runner, "is_draft_worker", False):
        return None
    model = runner.model
    name = type(model).__name__
    if name not in SUPPORTED_MODEL_CLASSES:
        raise VppConfigError(
            f"--pp-mode {state.config.mode} does not support model class {name}; supported: "
            f"{sorted(SUPPORTED_MODEL_CLASSES)}. Use --pp-mode cpp for this model."
        )
    if uses_sparse_attention_cache(runner.model_config.hf_config):
        raise VppConfigError(sparse_attention_refusal(state.config.mode, name))
    left_on = graph_capture_left_on()
    if left_on:
        raise VppConfigError(
            f"--pp-mode {state.config.mode}: SGLang would capture graphs ({left_on}), which replay the rank's "
            "whole layer range while a VPP rank runs each of its two stages as its own forward; the launcher "
            "turns capture off (--cuda-graph-backend-decode/-prefill disabled): start the server with "
            "sglang.launch_server, the plugin loaded, and no graph setting"
        )
    holder = layer_holder(model)
    if state.layout is None or (holder.start_layer, holder.end_layer) != state.hull():
        raise VppConfigError(
            f"--pp-mode {state.config.mode}: model {name} did not build its layers through make_layers "
            f"(range {holder.start_layer}..{holder.end_layer}); use --pp-mode cpp for this model."
        )
    return None


@contextlib.contextmanager
def forward_range(model: torch.nn.Module, stage: int) -> Iterator[None]:
    """Make the model's layer loop run exactly the layers of virtual stage ``stage``."""
    state = get_state()
    assert state is not None and state.layout is not None
    spec = state.layout.stages[stage]
    holder = layer_holder(model)
    saved = holder.start_layer, holder.end_layer
    holder.start_layer, holder.end_layer = spec.layer_start, spec.layer_end
    try:
        yield
    finally:
        holder.start_layer, holder.end_layer = saved
