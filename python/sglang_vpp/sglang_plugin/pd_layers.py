"""KV layers of a prefill-decode split registered and paired by global layer id.

SGLang pairs a prefill rank's KV entries with the decode server's by position unless both
peers publish global layer ids (``kv_args.kv_layer_ids``); then ``build_transfer_entry_pairs``
pairs by id (Mooncake, NIXL, Mori). A fold-back (VPP) prefill rank owns two layer ranges, which
no positional mapping expresses, so with the plugin installed every PD server publishes ids:

    build_kv_layer_ids            AROUND  plain MHA / MLA pools: the global id of every
                                          registered entry (SGLang returns [] for them)
    MHATokenToKVPool.get_contiguous_buf_infos, MLATokenToKVPool.get_contiguous_buf_infos
                                  AROUND  a VPP rank registers only the layers it owns (the
                                          zero-row placeholders of its hull are left out; the
                                          MLA infos are computed on the owned latents alone)
    MooncakeKVManager.send_kvcache AROUND the pairing checked before any byte moves: a peer
                                          without ids, or without a layer this rank sends,
                                          fails that request with the reason and the fix

Data flow: both servers build ``kv_args`` at start-up (prefill: one per PP rank; decode: all
layers at --pp-size 1) -> the decode server publishes its ids with its registration -> the
prefill's transfer worker pairs each of its entries with the decode entry of the same layer id
(K with K, V with V: ids repeat per group and pair in order).

A decode server with ids serves a prefill server at --pp-size 1 with or without ids (SGLang
falls back to positions there) and any prefill server with the plugin. A prefill server at
--pp-size > 1 WITHOUT the plugin against a decode server with it, or a VPP prefill against a
decode server without it, is refused per request (the check above), never paired by position.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

logger = logging.getLogger(__name__)

__all__ = ["PD_LAYER_HOOK_TARGETS", "register_pd_layer_hooks", "registered_layer_ids", "pairing_problem"]

_S = "sglang.srt."
BUILD_IDS = _S + "disaggregation.utils.build_kv_layer_ids"
MHA_INFOS = _S + "mem_cache.memory_pool.MHATokenToKVPool.get_contiguous_buf_infos"
MLA_INFOS = _S + "mem_cache.memory_pool.MLATokenToKVPool.get_contiguous_buf_infos"
SEND_KVCACHE = _S + "disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache"
PD_LAYER_HOOK_TARGETS = (BUILD_IDS, MHA_INFOS, MLA_INFOS, SEND_KVCACHE)


def _owned_layers() -> frozenset[int] | None:
    """This rank's layers under a VPP mode; None otherwise (every layer of the pool's range)."""
    from sglang_vpp.sglang_plugin.vpp.state import get_state

    state = get_state()
    if state is None or state.layout is None or state.rank is None:
        return None
    return state.owned_layers()


def _entry_layers(pool: Any) -> list[int]:
    """The global layer id of each per-layer buffer of one group (K, V or the MLA latent)."""
    return [int(pool.start_layer) + i for i in range(int(pool.layer_num))]


def _keep_mask(pool: Any, num_entries: int) -> list[bool]:
    layers = _entry_layers(pool)
    owned = _owned_layers()
    if owned is None or not layers or num_entries % len(layers):
        return [True] * num_entries
    return [layers[i % len(layers)] in owned for i in range(num_entries)]


def registered_layer_ids(pool: Any) -> list[int]:
    """Global layer id of every entry ``get_contiguous_buf_infos`` registers for ``pool``."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    layers = _entry_layers(pool)
    ids = layers * (2 if isinstance(pool, MHATokenToKVPool) else 1)
    return [layer for layer, kept in zip(ids, _keep_mask(pool, len(ids))) if kept]


def around_build_kv_layer_ids(original, *args: Any, **kwargs: Any) -> list[int]:
    """Ids for the plain pools SGLang leaves without them (no draft model: its band is SGLang's)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    ids = original(*args, **kwargs)
    pool = kwargs.get("token_to_kv_pool")
    if ids or kwargs.get("draft_token_to_kv_pool") is not None:
        return ids
    if type(pool) not in (MHATokenToKVPool, MLATokenToKVPool):
        return ids
    return registered_layer_ids(pool)


def around_get_contiguous_buf_infos(original, self: Any) -> tuple[list, list, list]:
    """Under VPP, only the owned layers' buffers (placeholders hold no KV and must not be sent)."""
    if hasattr(self, "kv_buffer") and not all(keep := _keep_mask(self, int(self.layer_num))):
        return _owned_mla_infos(original, self, keep)
    ptrs, lens, item_lens = original(self)
    keep = _keep_mask(self, len(ptrs))
    if all(keep):
        return ptrs, lens, item_lens
    pick = lambda values: [v for v, kept in zip(values, keep) if kept]  # noqa: E731
    return pick(ptrs), pick(lens), pick(item_lens)


def _owned_mla_infos(original, pool: MLATokenToKVPool, keep: list[bool]) -> tuple[list, list, list]:
    """SGLang's MLA infos read row 0 of every layer's latent buffer, which a zero-row placeholder
    lacks: run them on the owned layers' buffers alone (one entry per layer, in layer order)."""
    buffers, num_layers = pool.kv_buffer, pool.layer_num
    pool.kv_buffer = [buffer for buffer, kept in zip(buffers, keep) if kept]
    pool.layer_num = len(pool.kv_buffer)
    try:
        return original(pool)
    finally:
        pool.kv_buffer, pool.layer_num = buffers, num_layers


def pairing_problem(src_ids: list[int], dst_ids: list[int], num_src: int, num_dst: int,
                    prefill_pp_size: int) -> str | None:
    """Why this prefill rank's entries cannot be paired with a decode peer's, or None."""
    from sglang.srt.disaggregation.utils import build_transfer_entry_pairs

    try:
        build_transfer_entry_pairs(src_ids, dst_ids, num_src, num_dst,
                                   allow_positional_fallback=prefill_pp_size == 1)
    except RuntimeError as exc:
        return (
            f"KV layers cannot be paired with the decode server ({exc}). A VPP prefill needs a "
            "decode server with the sglang-vpp plugin installed (it publishes global layer ids) at "
            "--pp-size 1; a prefill at --pp-size > 1 without the plugin cannot serve a decode server "
            "with it: install the plugin on both servers"
        )
    return None


def around_send_kvcache(original, self: Any, mooncake_session_id: str, prefill_kv_indices: Any,
                        dst_kv_ptrs: list, *args: Any, **kwargs: Any) -> int:
    """Check the pairing first: a mismatch fails the request (-1) with the reason, where
    SGLang's own check would end the transfer thread and, without ids, pair by position."""
    dst_ids = list(kwargs.get("dst_layer_ids") or [])
    src_ids = list(self.kv_args.kv_layer_ids or [])
    problem = pairing_problem(src_ids, dst_ids, len(self.kv_args.kv_data_ptrs), len(dst_kv_ptrs),
                              int(self.pp_size))
    if problem is not None:
        logger.error("sglang-vpp: %s", problem)
        return -1
    return original(self, mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, *args, **kwargs)


def register_pd_layer_hooks(server_args: Any) -> bool:
    """Register the hooks above in the scheduler process of a PD server; return whether it is one."""
    if getattr(server_args, "disaggregation_mode", None) not in ("prefill", "decode"):
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(BUILD_IDS, around_build_kv_layer_ids, HookType.AROUND)
    register_hook(MHA_INFOS, around_get_contiguous_buf_infos, HookType.AROUND)
    register_hook(MLA_INFOS, around_get_contiguous_buf_infos, HookType.AROUND)
    if server_args.disaggregation_mode == "prefill":
        register_hook(SEND_KVCACHE, around_send_kvcache, HookType.AROUND)
    return True
