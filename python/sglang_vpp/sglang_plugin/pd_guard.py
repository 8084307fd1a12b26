"""Refuse a decode request whose bootstrap address cannot work, with a 400 instead of a 500.

On a decode server of a prefill-decode split, a request names the prefill server's bootstrap
address (``bootstrap_host``, ``bootstrap_port``) and a ``bootstrap_room``. Stock SGLang accepts
any value and only tries the address in the scheduler: an unreachable host or a closed port then
ends as HTTP 500 ("Decode handshake failed"). The guard, called from the input guard's hook
(``input_guard.check_request_tokens``), checks the values' types and ranges and asks each new
address for the bootstrap server's ``/health`` once (``CONNECT_TIMEOUT_S``; addresses that answered
are remembered, so the router's one address costs one probe per decode server) and raises
``InputRejectedError`` (400). A TCP connect alone is not enough: a network proxy may accept a
connection to any address.

The guard also reads the bootstrap server's parallel info (``/route``, what SGLang's decode
scheduler reads on its first request from that address) and refuses a prefill server whose
``--page-size`` differs from this server's: SGLang's own check raises in the decode scheduler,
which ends the whole decode server (every other request and prefill server with it). An address
whose page size matched is remembered; one that does not answer ``/route`` yet (a prefill server
still registering) is asked again on the next request.

A VPP prefill server on ``--device cpu`` refuses a decode server of another attention TP size
(``vpp/pd_prefill.py``: it fails the transfer, and Mooncake then marks the decode session failed,
so every later request of that decode server to that prefill server fails too). SGLang's
``/route`` names the prefill's attention TP size but not its pipeline mode or device, so the
plugin adds a route of its own to the prefill server's bootstrap server
(``after_setup_routes``, ``PLUGIN_ROUTE``): whether that server refuses, and its attention TP
size. The guard asks it again after ``ROUTE_ANSWER_TTL_S`` (a prefill server may be replaced
behind the same address; the probe blocks the tokenizer's loop for a round trip to the prefill
host, so not on every request) and refuses with 400, naming both sizes and the fix, before this decode server opens a session. A prefill server
without that route (stock SGLang, or no plugin) is left to its own rules; so is an MLA model,
whose latent cache takes Mooncake's whole-layer transfer at any TP size.

When the guard refuses a request for its prefill server's page size or attention TP size, it tells
that prefill server to drop the room (``pd_drop.tell_prefill``, from a thread: the router posts to
both servers and answers its client once both have, and the prefill server would hold the room
until its bootstrap timeout); ``after_setup_routes`` also adds the route that receives it
(``pd_drop.DROP_ROUTE``).

A room that no prefill server ever serves cannot be told apart from one still on its way; SGLang's
own waiting timeout ends it. The warm-up address SGLang uses itself (``FAKE_BOOTSTRAP_HOST``) and
every non-decode server are left alone.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from typing import Any

from sglang_vpp.sglang_plugin.errors import InputRejectedError
from sglang_vpp.sglang_plugin.pd_drop import is_room, room_range

__all__ = ["CONNECT_TIMEOUT_S", "PLUGIN_ROUTE", "SETUP_ROUTES", "after_setup_routes", "check_bootstrap_address",
           "check_prefill_room",
           "head_sliced_refusal", "refuses_other_attn_tp"]

CONNECT_TIMEOUT_S = 1.0
"""One probe of a new bootstrap address: the tokenizer's event loop waits this long at most."""
_reachable: set[tuple[str, int]] = set()
_page_size_matched: set[tuple[str, int]] = set()
ROUTE_ANSWER_TTL_S = 5.0
"""How long a prefill server's answer on ``PLUGIN_ROUTE`` is reused: the probe blocks the
tokenizer's event loop (every client of this decode server) for a round trip to the prefill host,
so it is not made per request; a prefill server replaced behind the same address is seen within
this time, and until then the prefill side's own refusal stands behind the guard."""
_route_answers: dict[tuple[str, int], tuple[float, bool, int | None]] = {}
ROUTE_QUERY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
"""SGLang's bootstrap server answers this with the prefill server's parallel info (page size included)."""
PLUGIN_ROUTE = "/sglang_vpp/pd"
"""The route ``after_setup_routes`` adds to a prefill server's bootstrap server."""
SETUP_ROUTES = "sglang.srt.disaggregation.common.conn.CommonKVBootstrapServer._setup_routes"
_MOONCAKE_BACKENDS = ("mooncake", "mooncake_tcp")
"""``--disaggregation-transfer-backend`` values served by Mooncake's KV manager (``mooncake_tcp`` stays
so in ServerArgs; SGLang resolves it to ``mooncake`` with the TCP transport forced)."""


def check_bootstrap_address(manager: Any, obj: Any) -> None:
    """Raise InputRejectedError for a decode request whose bootstrap address cannot work."""
    server_args = getattr(manager, "server_args", None)
    if getattr(server_args, "disaggregation_mode", None) != "decode":
        return
    host, port, room = (getattr(obj, name, None) for name in ("bootstrap_host", "bootstrap_port", "bootstrap_room"))
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST  # SGLang's warm-up host, never dialled

    if isinstance(host, list) or host is None or host == FAKE_BOOTSTRAP_HOST:
        return  # a batch is checked item by item; no host: SGLang's own rules apply
    if not isinstance(host, str):
        raise InputRejectedError(f"bootstrap_host must be a host name or address; got {host!r}")
    if room is not None and not is_room(room):
        raise InputRejectedError(f"bootstrap_room must be an integer in {room_range()}; got {room!r}")
    if port is None:
        return
    if type(port) is not int or not 0 < port < 65536:
        raise InputRejectedError(f"bootstrap_port must be a TCP port in 1..65535; got {port!r}")
    shown = f"[{host}]" if ":" in host else host
    # No proxy: the bootstrap server is dialled directly by the decode side, never through one.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    if (host, port) not in _reachable:
        _check_reachable(direct, host, port, shown)
    try:
        _check_page_size(direct, _decode_page_size(server_args), host, port, shown)
        _check_attn_tp(direct, manager, server_args, host, port, shown)
    except InputRejectedError as exc:
        # The prefill server would hold this room for a decode side that never connects: tell it.
        from sglang_vpp.sglang_plugin.pd_drop import tell_prefill

        tell_prefill(f"{shown}:{port}", [room], str(exc))
        raise


def check_prefill_room(manager: Any, obj: Any) -> None:
    """Raise InputRejectedError for a prefill request whose room SGLang's prefill scheduler cannot
    hold; it would raise there and end the server. A PP rank after the first replicates its KV
    sender's state to rank 0 keyed by the room, as msgpack (-2**63 up to 2**64 - 1), when the
    request arrives; every rank writes the room into its uint64 metadata buffer through a signed
    64-bit conversion (a negative room wraps, one from 2**63 raises) when it sends the last chunk
    to a decode server that bootstrapped it (one without the plugin, whose guard above refuses
    rooms outside [0, 2**63))."""
    if getattr(getattr(manager, "server_args", None), "disaggregation_mode", None) != "prefill":
        return
    room = getattr(obj, "bootstrap_room", None)
    if room is None or isinstance(room, list):
        return  # no room: SGLang answers 400 itself; a batch is checked item by item
    # SGLang's API schema types the room int64, though its HTTP server accepts any integer.
    if not is_room(room, signed=True):
        raise InputRejectedError(
            f"bootstrap_room must be an integer in {room_range(signed=True)} (64-bit signed); got {room!r}")


def _decode_page_size(server_args: Any) -> int | None:
    """This server's page size: ``--page-size`` when given; unset, SGLang resolves it in the
    scheduler (an attention backend may pick its own on GPU/NPU), but on ``--device cpu`` it stays
    SGLang's default, 1. None when it cannot be known here (then SGLang's own check decides)."""
    page_size = getattr(server_args, "page_size", None)
    if page_size is not None:
        return int(page_size)
    return 1 if getattr(server_args, "device", None) == "cpu" else None


def _check_reachable(direct: urllib.request.OpenerDirector, host: str, port: int, shown: str) -> None:
    try:
        with direct.open(f"http://{shown}:{port}/health", timeout=CONNECT_TIMEOUT_S) as response:
            answered = response.status == 200
    # URLError, timeouts, HTTP errors, a malformed host, an answer that is not HTTP
    except (OSError, ValueError, http.client.HTTPException) as exc:
        answered, why = False, str(exc)
    else:
        why = "" if answered else f"HTTP {response.status}"
    if not answered:
        raise InputRejectedError(
            f"the bootstrap server {host}:{port} is unreachable from this decode server ({why}); "
            "send the prefill server's host and --disaggregation-bootstrap-port (the router does)"
        )
    _reachable.add((host, port))


def _check_page_size(direct: urllib.request.OpenerDirector, page_size: Any, host: str, port: int,
                     shown: str) -> None:
    """Refuse a prefill server whose page size differs from this decode server's ``page_size``."""
    if page_size is None or (host, port) in _page_size_matched:
        return
    try:
        with direct.open(f"http://{shown}:{port}{ROUTE_QUERY}", timeout=CONNECT_TIMEOUT_S) as response:
            theirs = json.loads(response.read()).get("page_size")
            theirs = None if theirs is None else int(theirs)
    # 503 while the prefill server registers, or no parallel info: SGLang's handshake decides
    except (OSError, ValueError, TypeError, AttributeError, http.client.HTTPException):
        return
    if theirs is not None and theirs != int(page_size):
        raise InputRejectedError(
            f"the prefill server behind bootstrap {host}:{port} runs --page-size {theirs} but this decode "
            f"server runs --page-size {page_size}; start both servers with the same --page-size"
        )
    _page_size_matched.add((host, port))


def refuses_other_attn_tp(server_args: Any) -> bool:
    """Whether this server, as a PD prefill server, fails every transfer to a decode server of
    another attention TP size (``vpp/pd_prefill.around_send_kvcache_slice``, registered where this
    holds): a VPP prefill on ``--device cpu`` over Mooncake, whose head-sliced transfer stalled
    past Mooncake's progress bound on the CPU (docs/pd.md)."""
    from sglang_vpp.sglang_plugin.options import options_of

    return (getattr(server_args, "disaggregation_mode", None) == "prefill"
            and getattr(server_args, "device", None) == "cpu"
            and getattr(server_args, "disaggregation_transfer_backend", None) in _MOONCAKE_BACKENDS
            and options_of(server_args).is_vpp)


def head_sliced_refusal(prefill_tp: int, decode_tp: int) -> str:
    """The reason and the fix. Both sizes are attention TP sizes (``--tp-size``, divided by
    ``--dp-size`` under DP attention), which is what Mooncake compares."""
    return (
        f"a VPP prefill (--pp-mode vpp*) at attention TP size {prefill_tp} cannot serve a decode server "
        f"at attention TP size {decode_tp} on --device cpu: that KV takes Mooncake's head-sliced transfer "
        "(one transfer per token and layer), which stalled past Mooncake's 30 s progress bound on the CPU. "
        f"Start the decode server at attention TP size {prefill_tp} (--tp-size {prefill_tp} without DP "
        f"attention; with it, --tp-size / --dp-size = {prefill_tp})"
    )


def after_setup_routes(result: Any, server: Any) -> Any:
    """AFTER hook on ``CommonKVBootstrapServer._setup_routes``: add ``PLUGIN_ROUTE`` and
    ``pd_drop.DROP_ROUTE``. The bootstrap server runs in the launcher process, which published its
    ServerArgs before starting it; the answer is read when asked, and the attention TP size is the
    one the prefill ranks registered (None until the first one has)."""
    from aiohttp import web

    from sglang_vpp.sglang_plugin import pd_drop

    async def answer(request: Any) -> Any:
        from sglang.srt.runtime_context import get_server_args

        try:
            refuses = refuses_other_attn_tp(get_server_args())
        except (AttributeError, RuntimeError, ValueError):  # not published: say nothing it cannot know
            refuses = False
        return web.json_response({"refuses_other_attn_tp": refuses, "attn_tp_size": server.attn_tp_size})

    async def refused(request: Any) -> Any:
        try:
            room, reason = pd_drop.parse_drop(await request.json())
        except ValueError as exc:  # json.JSONDecodeError included
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"room": room, "scheduled": pd_drop.drop_room(room, reason)})

    server.app.router.add_get(PLUGIN_ROUTE, answer)
    server.app.router.add_post(pd_drop.DROP_ROUTE, refused)
    return result


def _decode_attn_tp_size(server_args: Any) -> int | None:
    """What this decode server registers with Mooncake as its attention TP size, or None."""
    from sglang.srt.runtime_context import derive_attn_tp_size

    try:
        return int(derive_attn_tp_size(tp_size=int(server_args.tp_size), attn_cp_size=int(server_args.attn_cp_size),
                                       attn_dp_size=int(server_args.attn_dp_size)))
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None


def _prefill_attn_tp_answer(direct: urllib.request.OpenerDirector, host: str, port: int,
                            shown: str) -> tuple[bool, int | None]:
    """(whether the prefill server refuses another attention TP size, its attention TP size) from
    ``PLUGIN_ROUTE``, reused for ``ROUTE_ANSWER_TTL_S``. A prefill server whose ranks have not
    registered yet is asked again on the next request."""
    now = time.monotonic()
    cached = _route_answers.get((host, port))
    if cached is not None and now - cached[0] < ROUTE_ANSWER_TTL_S:
        return cached[1], cached[2]
    try:
        with direct.open(f"http://{shown}:{port}{PLUGIN_ROUTE}", timeout=CONNECT_TIMEOUT_S) as response:
            info = json.loads(response.read())
            refuses = info.get("refuses_other_attn_tp") is True
            theirs = None if info.get("attn_tp_size") is None else int(info["attn_tp_size"])
    # 404: a prefill server without the plugin's route, which refuses nothing of this kind
    except (OSError, ValueError, TypeError, AttributeError, http.client.HTTPException):
        refuses, theirs = False, None
    else:
        if theirs is None:
            return refuses, theirs
    _route_answers[(host, port)] = (now, refuses, theirs)
    return refuses, theirs


def _check_attn_tp(direct: urllib.request.OpenerDirector, manager: Any, server_args: Any, host: str, port: int,
                   shown: str) -> None:
    """Refuse a prefill server that would fail every transfer to this decode server."""
    from sglang.srt.configs.model_config import AttentionArch

    if getattr(getattr(manager, "model_config", None), "attention_arch", None) == AttentionArch.MLA:
        return  # Mooncake sends a latent cache whole at any TP size
    decode_tp = _decode_attn_tp_size(server_args)
    if decode_tp is None:
        return
    refuses, theirs = _prefill_attn_tp_answer(direct, host, port, shown)
    if refuses and theirs is not None and theirs != decode_tp:
        raise InputRejectedError(
            f"the prefill server behind bootstrap {host}:{port} refuses this decode server: "
            + head_sliced_refusal(theirs, decode_tp)
        )
