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

A room that no prefill server ever serves cannot be told apart from one still on its way; SGLang's
own waiting timeout ends it. The warm-up address SGLang uses itself (``FAKE_BOOTSTRAP_HOST``) and
every non-decode server are left alone.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from typing import Any

from sglang_vpp.sglang_plugin.errors import InputRejectedError

__all__ = ["CONNECT_TIMEOUT_S", "check_bootstrap_address"]

CONNECT_TIMEOUT_S = 1.0
"""One probe of a new bootstrap address: the tokenizer's event loop waits this long at most."""
_MAX_ROOM = 2**63
_reachable: set[tuple[str, int]] = set()
_page_size_matched: set[tuple[str, int]] = set()
ROUTE_QUERY = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
"""SGLang's bootstrap server answers this with the prefill server's parallel info (page size included)."""


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
    if room is not None and (type(room) is not int or not 0 <= room < _MAX_ROOM):
        raise InputRejectedError(f"bootstrap_room must be an integer in [0, 2**63); got {room!r}")
    if port is None:
        return
    if type(port) is not int or not 0 < port < 65536:
        raise InputRejectedError(f"bootstrap_port must be a TCP port in 1..65535; got {port!r}")
    shown = f"[{host}]" if ":" in host else host
    # No proxy: the bootstrap server is dialled directly by the decode side, never through one.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    if (host, port) not in _reachable:
        _check_reachable(direct, host, port, shown)
    _check_page_size(direct, _decode_page_size(server_args), host, port, shown)


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
