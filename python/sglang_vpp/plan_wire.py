"""What the ``auto`` planner process and its parent say to each other over the child's pipes.

Every message is one frame: its length (8 bytes, big-endian) and a pickle. The parent writes
the sizer first (the pickled ``AutoSizer``, once), then requests, ``(kind, payload)``; the child
answers the sizer with ``READY`` and each request, in order, with ``(OK, result, "")`` or
``(ERROR, exception, traceback)``. Only ``plan_process`` (the parent) and ``plan_child`` (the
child) use it; it imports nothing of the project, so the child's imports stay the schedule core.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, BinaryIO

__all__ = ["PLAN", "MODULES", "OK", "ERROR", "READY", "write_frame", "read_frame", "send", "receive"]

PLAN = "plan"
"""Request: the ``AutoChoice`` for a situation's prompt lengths (a tuple of ints)."""
MODULES = "modules"
"""Request: the names of the modules the child has imported, and where it found ``sglang_vpp``
(how tests check that it imports only the schedule core, and from the parent's path)."""

OK = "ok"
ERROR = "error"
READY = "ready"
"""The child's answer to the sizer: loaded, requests welcome."""

_LENGTH = struct.Struct("!Q")


def write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def read_frame(stream: BinaryIO) -> bytes:
    """The next frame's bytes; ``EOFError`` when the other side closed its end (or died)."""
    header = _read_exactly(stream, _LENGTH.size)
    return _read_exactly(stream, _LENGTH.unpack(header)[0])


def send(stream: BinaryIO, message: Any) -> None:
    write_frame(stream, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(stream: BinaryIO) -> Any:
    return pickle.loads(read_frame(stream))


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:  # a buffered stream returns short only at end of file
        raise EOFError(f"the pipe closed after {0 if not data else len(data)} of {size} bytes")
    return data
