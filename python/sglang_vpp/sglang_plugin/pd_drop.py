"""A decode server's refusal of a PD request ends that request on its prefill server too, at once.

SGLang's router (``sglang-router``, PD mode) posts each request to the prefill and the decode server
at once and answers its client when both have answered. When the decode server refuses a request
(the bootstrap guard's 400, ``pd_guard.py``; the decode scheduler's backstop, ``pd_decode_refusal.py``),
the prefill server would keep it in its bootstrap queue for a decode side that never connects, until
``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s by default), and the router's client would wait
that long for an answer known at once. So the decode side tells the prefill server's bootstrap server
which room it refused and why (``tell_prefill``, ``DROP_ROUTE``, from a background thread: never on the
decode tokenizer's or scheduler's loop), and the prefill side ends that room's request with a 400
carrying the decode server's reason (``drop_room``).

Prefill side: the route runs on the bootstrap server's own thread and event loop, in the process of
the TokenizerManager that started it; the abort is scheduled on the manager's event loop (its state
and ZMQ sockets belong to that loop's thread) and there does what ``/abort_request`` does
(``TokenizerManager.abort_request``: the scheduler frees the request's KV) and then answers the
client with the reason (``_handle_abort_req`` with a 400 finish reason). The router posts to both
servers at once, so the refusal can arrive before the prefill server has the request: every refused
room is remembered (``REFUSED_TTL_S``, at most ``REFUSED_MAX`` rooms) until its request is ended or
refused, and the input guard answers a request of a remembered room 400 (``check_refused_room``). A request already past the guard but not
yet dispatched to the scheduler is looked for again (``RETRY_DELAYS_S``). The manager is the one the
input guard saw (SGLang's warm-up request passes it before any client's); a server run with
several tokenizer workers (whose bootstrap server lives in another process than they do) keeps
its own behaviour.

A prefill server without the plugin answers the POST 404 and keeps its own behaviour. Nothing here
raises into SGLang's loops: a failed POST, or a drop that cannot be scheduled, is logged once per
address and cause. A client that chose its own rid is not ended when another request's rid starts
with it (SGLang's scheduler aborts by rid prefix): that one keeps the bootstrap timeout.

Data flow::

    decode tokenizer (pd_guard refusal) / decode scheduler (pd_decode_refusal._fail_requests)
      tell_prefill("host:port", rooms, reason)  -> daemon thread: POST DROP_ROUTE per room
    prefill launcher, bootstrap server thread
      POST DROP_ROUTE {"room", "reason"}  (after_setup_routes adds it)
        -> drop_room: remembered; call_soon_threadsafe(manager.event_loop, _drop_on_loop)
    prefill tokenizer loop
      _drop_on_loop: each dispatched state of that room -> abort_request(rid); _handle_abort_req(400, reason)
      input guard (check_refused_room): a remembered room -> InputRejectedError (400)
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections import OrderedDict
from typing import Any, Hashable, Iterable

from sglang_vpp.sglang_plugin.errors import InputRejectedError

__all__ = ["DROP_ROUTE", "REFUSED_MAX", "REFUSED_TTL_S", "ROOM_LIMIT", "LogOnce", "RefusedRooms", "check_refused_room",
           "drop_room", "is_room", "parse_drop", "remember_manager", "room_range", "tell_prefill"]

logger = logging.getLogger(__name__)

DROP_ROUTE = "/sglang_vpp/pd/refused"
"""The POST route ``pd_guard.after_setup_routes`` adds to a prefill server's bootstrap server."""
REFUSED_TTL_S = 10.0
"""How long a refused room whose request has not arrived is remembered: the router posts to both
servers at once, so the prefill server receives the request within moments of the decode server's
refusal. A room is forgotten as soon as its request is ended or refused (``RefusedRooms.forget``),
so a client that reuses a room later (a retry against a mended decode server) is not refused for it."""
REFUSED_MAX = 4096
"""At most this many rooms are remembered (the oldest go first): the memory stays bounded under a
flood of refusals."""
POST_TIMEOUT_S = 2.0
"""One POST to a prefill server's bootstrap server (off every SGLang loop)."""
RETRY_DELAYS_S = (0.2, 0.5, 1.0, 2.0)
"""When a request of the room is past the input guard but not yet dispatched to the scheduler (it
cannot be aborted there yet), it is looked for again after each of these delays."""
MAX_REASON_CHARS = 4000
ROOM_LIMIT = 2**63
"""A bootstrap room is an integer in [0, ROOM_LIMIT) (SGLang draws them as random 63-bit numbers);
a prefill server can hold any signed 64-bit one, [-ROOM_LIMIT, ROOM_LIMIT)."""


def is_room(value: Any, signed: bool = False) -> bool:
    """Whether ``value`` is a bootstrap room in [0, ROOM_LIMIT), or with ``signed`` in
    [-ROOM_LIMIT, ROOM_LIMIT) (a bool is not)."""
    return type(value) is int and (-ROOM_LIMIT if signed else 0) <= value < ROOM_LIMIT


def room_range(signed: bool = False) -> str:
    """The range ``is_room(value, signed)`` accepts, as a refusal spells it (``[0, 2**63)``)."""
    bits = ROOM_LIMIT.bit_length() - 1
    return f"[{f'-2**{bits}' if signed else 0}, 2**{bits})"


class RefusedRooms:
    """Refused rooms and their reasons, bounded in time and count; safe across threads (written on
    the bootstrap server's thread, read on the tokenizer's)."""

    def __init__(self, ttl_s: float = REFUSED_TTL_S, max_rooms: int = REFUSED_MAX) -> None:
        self.ttl_s, self.max_rooms = ttl_s, max_rooms
        self._rooms: OrderedDict[int, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, room: int, reason: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._rooms.pop(room, None)
            self._rooms[room] = (now + self.ttl_s, reason)
            self._expire(now)
            while len(self._rooms) > self.max_rooms:
                self._rooms.popitem(last=False)

    def reason(self, room: int, now: float | None = None) -> str | None:
        """The reason a room was refused within the time bound, else None."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            entry = self._rooms.get(room)
        return None if entry is None else entry[1]

    def forget(self, room: int) -> None:
        with self._lock:
            self._rooms.pop(room, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rooms)

    def _expire(self, now: float) -> None:
        while self._rooms:  # insertion order is expiry order (one TTL for all)
            room, (expires, _) = next(iter(self._rooms.items()))
            if expires > now:
                return
            del self._rooms[room]


class LogOnce:
    """``logger`` at ``level``, one line per key for the life of the process: a refusal or a failed
    POST repeats with each request, and its cause is said once. Safe across threads."""

    def __init__(self, log: logging.Logger, level: int) -> None:
        self._log, self._level = log, level
        self._keys: set[Hashable] = set()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, message: str, *args: Any) -> bool:
        """Log ``message % args`` unless ``key`` was logged already; whether it was logged now."""
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
        self._log.log(self._level, message, *args)
        return True


_refused = RefusedRooms()
_manager: Any = None
_log_once = LogOnce(logger, logging.WARNING)


def _client_message(reason: str) -> str:
    return f"the decode server refused this request: {reason}"


def remember_manager(manager: Any) -> None:
    """Called by the input guard on a prefill server: the TokenizerManager whose requests a drop ends."""
    global _manager
    _manager = manager


def check_refused_room(manager: Any, obj: Any) -> None:
    """Input guard, prefill servers only: refuse a request whose room the decode side already refused."""
    if getattr(getattr(manager, "server_args", None), "disaggregation_mode", None) != "prefill":
        return
    remember_manager(manager)
    room = getattr(obj, "bootstrap_room", None)
    if type(room) is not int:
        return  # a batch is checked item by item; no room: nothing was refused
    reason = _refused.reason(room)
    if reason is not None:
        _refused.forget(room)  # the one request the refusal was for
        raise InputRejectedError(_client_message(reason))


def parse_drop(body: Any) -> tuple[int, str]:
    """(room, reason) of a POST body, or ValueError saying what is wrong."""
    if not isinstance(body, dict):
        raise ValueError('the body must be a JSON object {"room": int, "reason": str}')
    room, reason = body.get("room"), body.get("reason")
    if not is_room(room):
        raise ValueError(f"room must be an integer in {room_range()}; got {room!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reason must be a non-empty string; got {reason!r}")
    return room, reason[:MAX_REASON_CHARS]


def drop_room(room: int, reason: str) -> bool:
    """Remember the room and schedule the end of its request on the TokenizerManager's loop (any
    thread). Whether a drop was scheduled; never raises."""
    _refused.remember(room, reason)
    manager = _manager
    loop = getattr(manager, "event_loop", None)
    if loop is None:
        _log_once("no-manager", "sglang-vpp: a decode server refused room %s, but no tokenizer of this process "
                  "has served a request yet: the room is remembered and refused if it arrives here (a server "
                  "with several tokenizer workers, whose requests reach other processes, keeps its bootstrap "
                  "timeout)", room)
        return False
    try:
        loop.call_soon_threadsafe(_drop_on_loop, manager, room, _client_message(reason), 0)
    except RuntimeError as exc:  # the loop is closed: the server is shutting down
        _log_once("closed", "sglang-vpp: cannot end a refused PD request (%s)", exc)
        return False
    return True


def _drop_on_loop(manager: Any, room: int, message: str, attempt: int) -> None:
    """On the manager's loop: end each request of ``room`` the scheduler has; look again for one
    not dispatched yet."""
    try:
        waiting = _abort_room(manager, room, message)
        if waiting and attempt < len(RETRY_DELAYS_S):
            manager.event_loop.call_later(RETRY_DELAYS_S[attempt], _drop_on_loop, manager, room, message,
                                          attempt + 1)
    except Exception as exc:  # noqa: BLE001 - never into SGLang's loop; the bootstrap timeout still ends it
        _log_once(f"drop:{type(exc).__name__}", "sglang-vpp: ending refused PD room %s failed: %r", room, exc)


def _abort_room(manager: Any, room: int, message: str) -> int:
    """Abort each dispatched request of ``room``; return how many of that room are not dispatched yet."""
    from sglang.srt.managers.io_struct import AbortReq

    waiting = 0
    live = list(manager.rid_to_state.items())
    for rid, state in live:
        if getattr(state.obj, "bootstrap_room", None) != room or state.finished:
            continue
        if not state.dispatched:
            waiting += 1
            continue
        _refused.forget(room)  # its request is found: a later request of this room is not refused
        if any(other != rid and isinstance(other, str) and other.startswith(rid) and not other_state.finished
               for other, other_state in live):
            # SGLang's scheduler aborts every request whose rid starts with this one (client-chosen
            # rids such as "4" and "42"): ending it would end another client's request too.
            _log_once(f"prefix:{rid}", "sglang-vpp: not ending refused PD request %s (room %s): another "
                      "request's rid starts with it; it ends at the bootstrap timeout", rid, room)
            continue
        manager.abort_request(rid)  # the scheduler drops it from its queues and frees its KV
        manager._handle_abort_req(AbortReq(rid=rid, finished_reason={
            "type": "abort", "message": message, "status_code": 400}))
        logger.info("sglang-vpp: ended PD request %s (room %s): %s", rid, room, message)
    return waiting


def tell_prefill(address: str, rooms: Iterable[Any], reason: str) -> threading.Thread | None:
    """Tell the bootstrap server at ``address`` ("host:port", "[v6]:port") that this decode server
    refused ``rooms``, from a daemon thread (returned, for tests). A prefill server without the
    plugin answers 404: nothing changes there."""
    rooms = [room for room in rooms if type(room) is int]
    if not rooms:
        return None
    thread = threading.Thread(target=_post_drops, args=(address, rooms, reason),
                              name="sglang-vpp-pd-drop", daemon=True)
    thread.start()
    return thread


def _post_drops(address: str, rooms: list[int], reason: str) -> None:
    # No proxy: the bootstrap server is dialled directly, as SGLang's decode side does.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for room in rooms:
        body = json.dumps({"room": room, "reason": reason[:MAX_REASON_CHARS]}).encode()
        request = urllib.request.Request(f"http://{address}{DROP_ROUTE}", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with direct.open(request, timeout=POST_TIMEOUT_S):
                pass
        except Exception as exc:  # noqa: BLE001 - the prefill's own bootstrap timeout stands
            if getattr(exc, "code", None) == 404:
                _log_once(f"no-route:{address}", "sglang-vpp: the prefill server at bootstrap %s has no %s "
                          "(no plugin there): it ends refused requests at its bootstrap timeout", address, DROP_ROUTE)
            else:
                _log_once(f"post:{address}:{type(exc).__name__}", "sglang-vpp: telling the prefill server at "
                          "bootstrap %s of refused room %s failed: %r", address, room, exc)
            return  # the other rooms would get the same answer (or wait as long)
