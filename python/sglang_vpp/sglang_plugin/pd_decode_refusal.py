"""Fail a decode request whose prefill server SGLang finds incompatible, not the decode server.

On a decode server of a prefill-decode split, the first request from a new prefill server makes
the decode scheduler fetch that server's parallel info (``CommonKVManager.try_ensure_parallel_info``)
and check it against its own: page size, KV cache dtype, KV layout, attention TP sizes where a
pool cannot be re-sliced. A mismatch raises ``RuntimeError`` inside the scheduler's event loop,
which ends the whole decode server: every running request and every other prefill server's
traffic with it (measured: a decode server started with ``--kv-cache-dtype bf16`` behind a prefill
server at the default dtype dies on the first request).

The hook runs SGLang's ``DecodePreallocQueue._ensure_prefill_info`` once per bootstrap address,
so a mismatch of one address cannot hide another's answer, and turns that address's
``RuntimeError`` into a failed handshake for its requests: each receiver is aborted and SGLang's
message is recorded as the failure reason (after the abort, which records its own), so the
client's error carries it ("Decode handshake failed ... with exception <SGLang's message>") and
the decode server keeps serving. The next request from that address is checked again (a prefill
server can be replaced behind one address). One error line per address and message. The prefill
server is told each failed room (``pd_drop.tell_prefill``, off this loop), so it ends its side of
the request at once instead of at its bootstrap timeout: by one scheduler process per group of
ranks sharing requests (``_tells_prefill``), though every process fails the rooms locally.

The tokenizer's bootstrap guard (``pd_guard.py``) refuses the mismatches it can see with a 400
before the scheduler; this is the backstop for every check SGLang makes, current and future.

Data flow (every scheduler process of a ``--disaggregation-mode decode`` server)::

    DecodePreallocQueue._resolve_pending_reqs -> _ensure_prefill_info(self, addr_to_reqs)
        [AROUND hook] -> original(self, {addr: reqs}) per address
            RuntimeError -> receivers aborted, reason recorded, requests dropped from pending;
                            pp 0 / attention TP 0 / attention CP 0 only: the prefill server told
                            the rooms (pd_drop.tell_prefill, a thread)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_vpp.sglang_plugin import pd_drop

__all__ = ["ENSURE_PREFILL_INFO_TARGET", "install_decode_refusal_hook"]

logger = logging.getLogger(__name__)

ENSURE_PREFILL_INFO_TARGET = "sglang.srt.disaggregation.decode.DecodePreallocQueue._ensure_prefill_info"
_log_once = pd_drop.LogOnce(logger, logging.ERROR)
_log_once_quiet = pd_drop.LogOnce(logger, logging.DEBUG)


def ensure_prefill_info_per_address(original: Callable[..., Any], queue: Any,
                                    addr_to_reqs: dict[str, list[Any]]) -> tuple[dict[str, list[Any]], list[Any]]:
    """AROUND ``_ensure_prefill_info``: SGLang's answer per address; a mismatch fails that address's requests."""
    ready: dict[str, list[Any]] = {}
    remaining: list[Any] = []
    for addr, reqs in addr_to_reqs.items():
        try:
            addr_ready, addr_remaining = original(queue, {addr: reqs})
        except RuntimeError as exc:
            _fail_requests(queue, addr, reqs, str(exc))
            continue
        ready.update(addr_ready)
        remaining.extend(addr_remaining)
    return ready, remaining


def _fail_requests(queue: Any, addr: str, reqs: list[Any], reason: str) -> None:
    message = f"prefill server at bootstrap address {addr} cannot serve this decode server: {reason}"
    tells = _tells_prefill(queue.kv_manager)
    # Every process of the group fails the same rooms: the one that tells the prefill says why.
    (_log_once if tells else _log_once_quiet)((addr, reason), "sglang-vpp: %s; its requests fail, this decode "
                                              "server keeps serving", message)
    for decode_req in reqs:
        receiver = decode_req.kv_receiver
        if receiver is None:  # already failed and cleaned up by SGLang
            continue
        receiver.abort()
        queue.kv_manager.record_failure(decode_req.req.bootstrap_room, message)
    if tells:
        # The prefill server would hold these rooms for a decode side that never connects: tell it
        # (``addr`` is SGLang's "host:port", brackets around an IPv6 host), from a thread of its own.
        pd_drop.tell_prefill(addr, [decode_req.req.bootstrap_room for decode_req in reqs], message)


def _tells_prefill(kv_manager: Any) -> bool:
    """Whether this scheduler process tells the prefill server the rooms it failed.

    The processes of one attention-DP group (its attention TP and CP ranks, at every PP rank) hold
    the same requests: SGLang's request receiver, the process at PP rank 0, attention TP rank 0 and
    attention CP rank 0, hands each of its group's requests to the others. And SGLang's parallel-info
    check compares server-wide settings (page size, KV cache dtype and layout, attention TP sizes),
    so every process of the group fails the same rooms on the same mismatch: the receiver's post
    alone tells the prefill server every one of them, and the others' would only repeat it (each
    repeat makes the prefill server remember the room again). Each attention-DP group, and each
    replica under plain ``--dp-size``, has requests of its own and a receiver of its own.
    A manager without these ranks (not a ``CommonKVManager``) tells it: a repeat is harmless."""
    return (getattr(kv_manager, "pp_rank", 0) == 0 and getattr(kv_manager, "attn_tp_rank", 0) == 0
            and getattr(kv_manager, "attn_cp_rank", 0) == 0)


def install_decode_refusal_hook(server_args: Any) -> bool:
    """Register the hook on a decode server; return whether this process needs it."""
    if getattr(server_args, "disaggregation_mode", None) != "decode":
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(ENSURE_PREFILL_INFO_TARGET, ensure_prefill_info_per_address, HookType.AROUND)
    return True
