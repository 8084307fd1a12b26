"""Tensor dicts on the wire: one format for every backend.

A message is a ``dict[str, Tensor | metadata]``: hidden states, residual, positions, plus small
metadata (request and chunk indices, flags). On the wire it becomes:

1. **Header frame** (always exactly ``HEADER_FRAME_BYTES`` uint8): the first 8 bytes hold the
   header length (little-endian), the rest the start of a compact JSON header. A header longer
   than one frame continues in one **overflow frame** of exactly the remaining length. Fixed
   sizes on both ends mean one receive, no length round trip, and no reliance on a transport
   accepting a short message into a long buffer (NCCL and HCCL do not).
2. **Payloads**: one flat uint8 view per non-empty tensor, in header order. Sending bytes instead
   of typed tensors makes every dtype travel the same way on every backend (HCCL and NCCL have
   gaps in their dtype tables for point-to-point, bytes have none). Empty tensors send nothing:
   the header alone rebuilds them. 0-d tensors travel as one element.

The JSON header is ``{"v": 1, "seq": n, "group": g, "src": r, "entries": [...]}`` with entries
``[key, "t", dtype, shape]`` (tensor) or ``[key, "m", value]`` (metadata). ``seq`` counts the
messages on one communicator in one direction; the receiver checks it, so a lost or reordered
message is an error instead of silently wrong activations.

Metadata must be JSON: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` and ``dict``
with ``str`` keys. Tuples are refused rather than silently coming back as lists.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .errors import CommProtocolError, TensorDictError

__all__ = [
    "HEADER_FRAME_BYTES",
    "WIRE_VERSION",
    "SUPPORTED_DTYPES",
    "OutgoingMessage",
    "MessageHeader",
    "encode_message",
    "header_frames",
    "parse_header_frame",
    "overflow_size",
    "decode_header",
]

HEADER_FRAME_BYTES = 1024
WIRE_VERSION = 1
_LENGTH = struct.Struct("<Q")

# Every dtype the runtime may send; names are torch's own (``str(dtype)`` without ``torch.``).
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2",
)
SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
_NAME_OF = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}


@dataclass
class OutgoingMessage:
    """An encoded message: payload byte views plus the header, ready for a transport.

    The header bytes are produced by ``finalize(seq)``: the channel numbers messages under its lock,
    after the (possibly slow) encoding ran outside it."""

    entries: list[list[Any]]
    payloads: list[torch.Tensor]
    group: str
    src: int
    seq: int = -1
    header: bytes = b""
    #: Set by a device link in the caller's thread: an event on the producer's stream that the
    #: transfer must wait for (the tensors may still be being written when isend() returns).
    ready_event: Any = None

    def finalize(self, seq: int) -> "OutgoingMessage":
        self.seq = seq
        header = {"v": WIRE_VERSION, "seq": seq, "group": self.group, "src": self.src, "entries": self.entries}
        self.header = json.dumps(header, separators=(",", ":")).encode()
        return self

    @property
    def num_bytes(self) -> int:
        return len(self.header) + sum(p.numel() for p in self.payloads)


@dataclass
class MessageHeader:
    """A parsed header: what the sender will send next and how to rebuild the dict."""

    seq: int
    group: str
    src: int
    entries: list[list[Any]]

    def payload_sizes(self) -> list[int]:
        """Bytes of each non-empty tensor payload, in wire order."""
        sizes = []
        for entry in self.entries:
            if entry[1] == "t":
                nbytes = _num_bytes(SUPPORTED_DTYPES[entry[2]], entry[3])
                if nbytes:
                    sizes.append(nbytes)
        return sizes

    def allocate(self, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        """Receive buffers for the payloads (uint8, on ``device``), in wire order."""
        return [torch.empty(n, dtype=torch.uint8, device=device) for n in self.payload_sizes()]

    def assemble(self, buffers: list[torch.Tensor], device: torch.device | str = "cpu") -> dict[str, Any]:
        """Rebuild the dict from the received payload buffers (same order as ``allocate``)."""
        out: dict[str, Any] = {}
        index = 0
        for entry in self.entries:
            key, kind = entry[0], entry[1]
            if kind == "m":
                out[key] = entry[2]
                continue
            dtype, shape = SUPPORTED_DTYPES[entry[2]], tuple(entry[3])
            if _num_bytes(dtype, shape) == 0:
                out[key] = torch.empty(shape, dtype=dtype, device=device)
                continue
            out[key] = buffers[index].view(dtype).reshape(shape)
            index += 1
        assert index == len(buffers), (index, len(buffers))
        return out


def _num_bytes(dtype: torch.dtype, shape: list[int] | tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _check_meta(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        return  # NaN and inf travel as JSON extensions; both ends are Python
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_meta(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise TensorDictError(
                    f"metadata {path} has a non-string key {k!r}; JSON keys must be strings. "
                    "Fix: convert the key with str() before sending."
                )
            _check_meta(item, f"{path}[{k!r}]")
        return
    if isinstance(value, tuple):
        raise TensorDictError(
            f"metadata {path} is a tuple {value!r}; it would come back as a list. "
            "Fix: send a list (list(value))."
        )
    if isinstance(value, torch.Tensor):
        raise TensorDictError(
            f"metadata {path} nests a tensor; only top-level values may be tensors. "
            "Fix: give the tensor its own top-level key."
        )
    raise TensorDictError(
        f"metadata {path} has type {type(value).__name__} ({value!r:.80}), which is not JSON. "
        "Fix: send None, bool, int, float, str, list or dict values, or a tensor."
    )


def _tensor_payload(key: str, tensor: torch.Tensor) -> tuple[list[Any], torch.Tensor | None]:
    if tensor.layout is not torch.strided or tensor.is_quantized:
        raise TensorDictError(
            f"tensor {key!r} has layout {tensor.layout} (quantized={tensor.is_quantized}); only dense "
            "tensors can be sent. Fix: send tensor.to_dense() or its int representation."
        )
    name = _NAME_OF.get(tensor.dtype)
    if name is None:
        raise TensorDictError(
            f"tensor {key!r} has dtype {tensor.dtype}, which the wire format does not know. "
            f"Fix: cast to one of {', '.join(SUPPORTED_DTYPES)}."
        )
    entry = [key, "t", name, list(tensor.shape)]
    if tensor.numel() == 0:
        return entry, None
    # contiguous(): the payload must be one flat run of bytes; reshape(-1) turns 0-d into 1 element.
    # resolve_conj/neg: a lazy conjugate or negative view's bytes are not its values (no-ops otherwise).
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return entry, flat.view(torch.uint8)


def encode_message(tensors: Mapping[str, Any], *, group: str, src: int, seq: int | None = None) -> OutgoingMessage:
    """Validate ``tensors`` and encode it; raises ``TensorDictError`` naming the bad entry.

    With ``seq`` the header is produced at once; without, call ``finalize(seq)`` later."""
    if not isinstance(tensors, Mapping):
        raise TensorDictError(
            f"a message must be a mapping of str to tensor or metadata, got {type(tensors).__name__}. "
            "Fix: wrap the value, e.g. {'hidden_states': tensor}."
        )
    entries: list[list[Any]] = []
    payloads: list[torch.Tensor] = []
    for key, value in tensors.items():
        if not isinstance(key, str):
            raise TensorDictError(f"message key {key!r} is not a string. Fix: use str keys.")
        if isinstance(value, torch.Tensor):
            entry, payload = _tensor_payload(key, value)
            entries.append(entry)
            if payload is not None:
                payloads.append(payload)
        else:
            _check_meta(value, repr(key))
            entries.append([key, "m", value])
    message = OutgoingMessage(entries=entries, payloads=payloads, group=group, src=src)
    return message if seq is None else message.finalize(seq)


def header_frames(header: bytes) -> list[torch.Tensor]:
    """The fixed-size first frame, plus one overflow frame when the header does not fit."""
    room = HEADER_FRAME_BYTES - _LENGTH.size
    first = bytearray(HEADER_FRAME_BYTES)
    _LENGTH.pack_into(first, 0, len(header))
    first[_LENGTH.size:_LENGTH.size + min(room, len(header))] = header[:room]
    frames = [torch.frombuffer(first, dtype=torch.uint8).clone()]
    if len(header) > room:
        frames.append(torch.frombuffer(bytearray(header[room:]), dtype=torch.uint8).clone())
    return frames


def parse_header_frame(frame: torch.Tensor) -> tuple[int, bytes]:
    """From the first frame: (total header length, the header bytes it holds)."""
    raw = frame.cpu().numpy().tobytes()
    if len(raw) != HEADER_FRAME_BYTES:
        raise CommProtocolError(detail=f"header frame has {len(raw)} bytes, expected {HEADER_FRAME_BYTES}")
    (length,) = _LENGTH.unpack_from(raw, 0)
    if length == 0 or length > 1 << 30:
        raise CommProtocolError(detail=f"header frame announces {length} header bytes: not a header")
    return length, raw[_LENGTH.size:_LENGTH.size + length]


def overflow_size(total_length: int) -> int:
    """Bytes of the overflow frame for a header of ``total_length`` bytes (0 if none)."""
    return max(0, total_length - (HEADER_FRAME_BYTES - _LENGTH.size))


def decode_header(data: bytes) -> MessageHeader:
    """Parse the JSON header; raises ``CommProtocolError`` on anything unexpected."""
    try:
        header = json.loads(data.decode())
        if header.get("v") != WIRE_VERSION:
            raise ValueError(f"wire version {header.get('v')!r}, expected {WIRE_VERSION}")
        for entry in header["entries"]:
            if entry[1] == "t" and entry[2] not in SUPPORTED_DTYPES:
                raise ValueError(f"unknown dtype {entry[2]!r}")
        return MessageHeader(seq=int(header["seq"]), group=str(header["group"]), src=int(header["src"]),
                             entries=header["entries"])
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError) as error:
        raise CommProtocolError(detail=f"cannot decode message header ({error}): {data[:120]!r}") from None
