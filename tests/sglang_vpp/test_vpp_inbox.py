"""The inbox's arrival stamps, which ``check --trace --reproduce`` relies on: a drain holds
exactly the items that arrived before its own time, and a wait reports the waker's arrival."""

from __future__ import annotations

import threading
import time

from sglang_vpp.sglang_plugin.vpp.transport import Inbox


def test_a_drain_holds_exactly_what_arrived_before_it():
    inbox = Inbox(5.0)
    stop = threading.Event()

    def pump() -> None:
        n = 0
        while not stop.is_set():
            inbox.put("fwd", n)
            n += 1

    thread = threading.Thread(target=pump)
    thread.start()
    try:
        last = -1.0
        seen = 0
        for _ in range(200):
            now, items = inbox.drain()
            assert all(last < arrived <= now for _, _, arrived in items)
            seen += len(items)
            last = max([last, *(arrived for _, _, arrived in items)])
    finally:
        stop.set()
        thread.join()
    _, rest = inbox.drain()
    assert all(arrived > last for _, _, arrived in rest)
    assert seen > 0


def test_a_wait_reports_the_arrival_that_ended_it_and_times_out():
    inbox = Inbox(5.0)
    assert inbox.wait(0.01) is None
    timer = threading.Timer(0.05, inbox.put, ("bwd", "handle"))
    timer.start()
    before = time.perf_counter()
    woke = inbox.wait(5.0)
    timer.join()
    assert woke is not None and woke > before
    now, items = inbox.drain()
    assert items == [("bwd", "handle", woke)] and woke <= now
