"""One communicator's operations, run in issue order on a thread of its own.

Why a thread per link: ``Link`` operations block (a gloo send completes only when the peer posts
the receive; a device transfer is polled until its event fires), and a receive cannot be posted
before its header says what to allocate. Running each link's queue on its own thread gives:

- **issue order per communicator**, the pairing rule of HCCL and NCCL, on every backend, so a
  pattern that would hang on the device also hangs (and is reported) on gloo;
- **independent directions**: ``fwd`` and ``bwd`` are different links, so a send blocked on one
  never holds a receive on the other (the dual-group deadlock avoidance of vpp-method.md 3.3);
- **push-based readiness**: the thread completes the handle (``threading.Event``) the moment the
  transport returns. Nothing polls gloo's ``Work.is_completed()``, which stays False until some
  thread calls ``wait()``.

Failure handling: each operation gets ``deadline = start + transport_timeout_s``. The first
``CommError`` breaks the channel: the stream position is lost (a timed-out gloo context is closed,
a device communicator is aborted), so every later operation on it fails at once with the same
error class, naming its own action. The thread is a daemon: one stuck in a transport wait cannot
keep the process alive, and the transport deadline ends the wait anyway.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .base import CommHandle, Link, OpKind
from .errors import CommClosedError, CommError, CommProtocolError, CommTimeoutError
from .message import MessageHeader, OutgoingMessage, encode_message

__all__ = ["OpHandle", "Channel"]

_log = logging.getLogger(__name__)

#: Sends posted ahead of the oldest unfinished one (gloo and the device streams keep their order).
SEND_WINDOW = 32
#: Receives whose headers may be posted ahead of the one running.
MAX_LOOKAHEAD = 8


class OpHandle(CommHandle):
    """A pending operation on a ``Channel``; completed by the channel thread."""

    def __init__(self, kind: OpKind, action: str, channel: "Channel", default_timeout_s: float) -> None:
        self.kind = kind
        self.action = action
        self.group = channel.group
        self.peer = channel.peer
        self.rank = channel.rank
        self._channel = channel
        self._default_timeout_s = default_timeout_s
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[CommHandle], None]] = []
        self._result: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._delivered = False

    def __repr__(self) -> str:
        state = "pending" if not self._event.is_set() else ("failed" if self._error else "done")
        return f"<OpHandle {self.action} {state}>"

    def is_ready(self) -> bool:
        return self._event.is_set()

    def exception(self) -> BaseException | None:
        return self._error if self._event.is_set() else None

    def wait(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        limit = self._default_timeout_s if timeout_s is None else timeout_s
        if not self._event.wait(limit):
            raise CommTimeoutError(rank=self.rank, peer=self.peer, group=self.group, action=self.action,
                                   timeout_s=limit, detail=self._channel.describe_pending(self))
        if self._error is not None:
            raise self._error
        with self._lock:
            if self._result is not None and not self._delivered:
                self._result = self._channel.link.deliver(self._result)
                self._delivered = True
        return self._result

    def add_done_callback(self, fn: Callable[[CommHandle], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _complete(self, result: dict[str, Any] | None, error: BaseException | None) -> bool:
        """Finish the handle; False if it was already finished (e.g. abandoned at close)."""
        with self._lock:
            if self._event.is_set():
                return False
            self._result, self._error = result, error
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # a callback's bug must not kill the channel thread
                _log.exception("done-callback of %s raised", self.action)
        self._channel.notify()
        return True


@dataclass(eq=False)  # identity semantics: ops hold tensors, which do not compare to a bool
class _Op:
    kind: OpKind
    handle: OpHandle
    message: OutgoingMessage | None


class Channel:
    """Runs one link's operations in issue order on a daemon thread."""

    def __init__(self, link: Link, *, transport_timeout_s: float, default_timeout_s: float,
                 notify: Callable[[], None]) -> None:
        self.link = link
        self.rank = link.rank
        self.peer = link.peer
        self.group = link.spec.group
        self.notify = notify
        self._transport_timeout_s = transport_timeout_s
        self._default_timeout_s = default_timeout_s
        self._cond = threading.Condition()
        self._queue: deque[_Op] = deque()
        self._running: list[_Op] = []  # popped, posted, not yet completed (a run of sends, or one op)
        self._current_started = 0.0
        self._send_seq = 0
        self._recv_seq = 0
        self._numbers = itertools.count()
        self._broken: CommError | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"vpp-comm-{link.spec}-r{self.rank}", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- caller side
    def submit(self, kind: OpKind, tensors: Mapping[str, Any] | None, action: str | None) -> OpHandle:
        """Queue one operation; encoding (and its validation errors) happens here, in the caller."""
        number = next(self._numbers)
        if action is None:
            arrow = {OpKind.SEND: ">", OpKind.RECV: "<", OpKind.EXCHANGE: "<>"}[kind]
            action = f"{kind}#{number}{arrow}{self.peer}@{self.group}"
        message = None
        if kind is not OpKind.RECV:
            message = encode_message(tensors if tensors is not None else {}, group=self.group, src=self.rank)
            self.link.on_submit(message)
        handle = OpHandle(kind, action, self, self._default_timeout_s)
        with self._cond:
            if self._stopping:
                raise CommClosedError(rank=self.rank, peer=self.peer, group=self.group, action=action,
                                      detail="the communicator was closed",
                                      fix="create a new communicator; close() is final")
            if message is not None:
                message.finalize(self._send_seq)  # numbered under the lock: numbers follow queue order
                self._send_seq += 1
            self._queue.append(_Op(kind, handle, message))
            self._cond.notify_all()
        return handle

    def describe_pending(self, handle: OpHandle) -> str:
        """Where a pending operation stands, for the timeout message."""
        with self._cond:
            now = time.monotonic()
            running = list(self._running)
            since = now - self._current_started
            position = next((i for i, op in enumerate(running) if op.handle is handle), None)
            if position is not None:
                other = {OpKind.SEND: "receive", OpKind.RECV: "send", OpKind.EXCHANGE: "exchange"}[handle.kind]
                return (f"in flight for {since:.2f}s: rank {self.peer} has not posted the matching {other} on "
                        f"this communicator" + (f" (behind {position} earlier posted send(s))" if position else ""))
            ahead = next((i for i, op in enumerate(self._queue) if op.handle is handle), None)
            if ahead is None:
                return "the operation finished while the wait gave up"
            head = f", the oldest ({running[0].handle.action}) in flight for {since:.2f}s" if running else ""
            return f"queued behind {ahead + len(running)} earlier operation(s) on this communicator{head}"

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued operation finished; True if so within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._running, timeout_s)

    def stop(self) -> None:
        """Refuse new operations and fail the queued ones and the one in flight.

        The in-flight operation cannot be cancelled inside the transport; its handle is failed now
        (abandoned) and the thread ends when the transport returns or its deadline passes."""
        with self._cond:
            self._stopping = True
            pending = list(self._queue)
            self._queue.clear()
            running = list(self._running)
            self._cond.notify_all()
        for op in running:
            op.handle._complete(None, CommClosedError(
                rank=self.rank, peer=self.peer, group=self.group, action=op.handle.action,
                detail="closed while the operation was in flight; it was abandoned"))
        for op in pending:
            op.handle._complete(None, CommClosedError(
                rank=self.rank, peer=self.peer, group=self.group, action=op.handle.action,
                detail="closed before the operation started"))

    def join(self, timeout_s: float) -> bool:
        """True if the thread ended within ``timeout_s``."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def broken(self) -> CommError | None:
        return self._broken

    # ----------------------------------------------------------------- channel thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                run = [self._queue.popleft()]
                # Consecutive sends are posted together and finished in order: they pipeline, and
                # still pair in issue order. A receive never joins: it must wait for earlier sends.
                while run[0].kind is OpKind.SEND and self._queue and self._queue[0].kind is OpKind.SEND \
                        and len(run) < SEND_WINDOW:
                    run.append(self._queue.popleft())
                upcoming = 0
                if run[0].kind is OpKind.RECV:
                    for queued in self._queue:
                        if queued.kind is not OpKind.RECV or upcoming >= MAX_LOOKAHEAD:
                            break
                        upcoming += 1
                self._running = list(run)
                self._current_started = time.monotonic()
            self._execute(run, upcoming)

    def _finish(self, op: _Op, result: dict[str, Any] | None, error: CommError | None) -> None:
        with self._cond:
            if op in self._running:
                self._running.remove(op)
            self._current_started = time.monotonic()  # the next op of the run is the head from now
            self._cond.notify_all()
        op.handle._complete(result, error)

    def _execute(self, run: list[_Op], upcoming: int) -> None:
        """Run one op, or a run of sends, completing each handle as soon as it is done. The head
        op gets ``transport_timeout_s`` from the moment it becomes the head. Breaks the channel on
        error and fails the rest of the run."""
        if self._broken is not None:
            for op in run:
                self._finish(op, None, self._broken.with_action(
                    op.handle.action, f"an earlier operation on this communicator ({self._broken.action}) failed: "))
            return
        done = 0
        try:
            head = run[0]
            if head.kind is OpKind.SEND:
                tokens = [self.link.post_send(op.message) for op in run]
                for op, token in zip(run, tokens, strict=True):
                    self.link.finish_send(token, self._current_started + self._transport_timeout_s)
                    self._finish(op, None, None)
                    done += 1
            else:
                deadline = self._current_started + self._transport_timeout_s
                if head.kind is OpKind.RECV:
                    header, tensors = self.link.recv(deadline, upcoming)
                else:
                    assert head.message is not None
                    header, tensors = self.link.exchange(head.message, deadline)
                self._check_header(header)
                self._finish(head, tensors, None)
                done += 1
        except Exception as failure:
            first = run[done]
            if isinstance(failure, CommError):
                error = self._locate(failure, first)
            else:  # an unexpected transport exception: still a located CommError
                error = CommError(rank=self.rank, peer=self.peer, group=self.group, action=first.handle.action,
                                  detail=f"{type(failure).__name__}: {failure}")
                error.__cause__ = failure
            if self._broken is None:
                self._broken = error
            for op in run[done:]:
                again = error if op is first else error.with_action(
                    op.handle.action, "an earlier operation on this communicator failed: ")
                self._finish(op, None, again)

    def _check_header(self, header: MessageHeader) -> None:
        expected = self._recv_seq
        if header.seq != expected or header.group != self.group or header.src != self.peer:
            raise CommProtocolError(detail=(
                f"expected message #{expected} of group '{self.group}' from rank {self.peer}, got "
                f"#{header.seq} of group '{header.group}' from rank {header.src}: a message was lost or "
                "reordered, or two communicators are crossed"))
        self._recv_seq += 1

    def _locate(self, error: CommError, op: _Op) -> CommError:
        """The same error with this channel's rank, peer, group and the op's action filled in."""
        state = error._state()
        state.update(rank=self.rank, peer=self.peer, group=self.group,
                     action=state.get("action") or op.handle.action)
        if isinstance(error, CommTimeoutError) and state.get("timeout_s") is None:
            state["timeout_s"] = self._transport_timeout_s
        located = type(error)(**state)
        located.__cause__ = error.__cause__ or error
        return located
