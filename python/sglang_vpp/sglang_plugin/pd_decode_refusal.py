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
the request at once instead of at its bootstrap timeout.

The tokenizer's bootstrap guard (``pd_guard.py``) refuses the mismatches it can see with a 400
before the scheduler; this is the backstop for every check SGLang makes, current and future.

Data flow (every scheduler process of a ``--disaggregation-mode decode`` server)::

    DecodePreallocQueue._resolve_pending_reqs -> _ensure_prefill_info(self, addr_to_reqs)
        [AROUND hook] -> original(self, {addr: reqs}) per address
            RuntimeError -> receivers aborted, reason recorded, requests dropped from pending,
                            the prefill server told the rooms (pd_drop.tell_prefill, a thread)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["ENSURE_PREFILL_INFO_TARGET", "install_decode_refusal_hook"]

logger = logging.getLogger(__name__)

ENSURE_PREFILL_INFO_TARGET = "sglang.srt.disaggregation.decode.DecodePreallocQueue._ensure_prefill_info"
_logged: set[tuple[str, str]] = set()


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
    if (addr, reason) not in _logged:
        _logged.add((addr, reason))
        logger.error("sglang-vpp: %s; its requests fail, this decode server keeps serving", message)
    for decode_req in reqs:
        receiver = decode_req.kv_receiver
        if receiver is None:  # already failed and cleaned up by SGLang
            continue
        receiver.abort()
        queue.kv_manager.record_failure(decode_req.req.bootstrap_room, message)
    # The prefill server would hold these rooms for a decode side that never connects: tell it
    # (``addr`` is SGLang's "host:port", brackets around an IPv6 host), from a thread of its own.
    from sglang_vpp.sglang_plugin.pd_drop import tell_prefill

    tell_prefill(addr, [decode_req.req.bootstrap_room for decode_req in reqs], message)


def install_decode_refusal_hook(server_args: Any) -> bool:
    """Register the hook on a decode server; return whether this process needs it."""
    if getattr(server_args, "disaggregation_mode", None) != "decode":
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(ENSURE_PREFILL_INFO_TARGET, ensure_prefill_info_per_address, HookType.AROUND)
    return True
