"""The wire format, in-process: every runtime dtype and shape survives encode -> frames -> decode."""

from __future__ import annotations

import pytest
import torch

from sglang_vpp.comm.errors import CommProtocolError, TensorDictError
from sglang_vpp.comm.message import (
    HEADER_FRAME_BYTES,
    SUPPORTED_DTYPES,
    decode_header,
    encode_message,
    header_frames,
    overflow_size,
    parse_header_frame,
)
from sglang_vpp.comm.testing.scenarios import roundtrip_cases, same_message


def _through_the_wire(message: dict, seq: int = 0) -> tuple[object, dict]:
    encoded = encode_message(message, group="fwd", src=0, seq=seq)
    frames = header_frames(encoded.header)
    assert frames[0].numel() == HEADER_FRAME_BYTES and frames[0].dtype == torch.uint8
    length, data = parse_header_frame(frames[0])
    assert len(frames) == 1 + (overflow_size(length) > 0)
    if len(frames) == 2:
        assert frames[1].numel() == overflow_size(length)
        data += frames[1].numpy().tobytes()
    header = decode_header(data)
    assert header.payload_sizes() == [p.numel() for p in encoded.payloads]
    buffers = header.allocate()
    for buffer, payload in zip(buffers, encoded.payloads, strict=True):
        buffer.copy_(payload)
    return header, header.assemble(buffers)


@pytest.mark.parametrize("name,message", roundtrip_cases(), ids=[name for name, _ in roundtrip_cases()])
def test_every_case_is_bit_exact(name: str, message: dict) -> None:
    header, rebuilt = _through_the_wire(message, seq=5)
    assert header.seq == 5 and header.group == "fwd" and header.src == 0
    assert same_message(rebuilt, message) is None


def test_cases_cover_the_runtime_dtypes_and_edge_shapes() -> None:
    names = {name for name, _ in roundtrip_cases()}
    for dtype in ("float32", "bfloat16", "float16", "int64", "int32", "bool", "uint8"):
        assert dtype in SUPPORTED_DTYPES and f"{dtype}[]" in names and f"{dtype}[0]" in names


def test_empty_and_scalar_tensors_payloads() -> None:
    encoded = encode_message({"e": torch.empty(0, 5), "s": torch.tensor(3.5), "b": torch.tensor(True)},
                             group="fwd", src=1, seq=0)
    assert [p.numel() for p in encoded.payloads] == [4, 1]  # empty sends nothing, 0-d one element
    _, rebuilt = _through_the_wire({"s": torch.tensor(3.5)})
    assert rebuilt["s"].shape == () and rebuilt["s"].item() == 3.5


def test_send_is_a_view_of_contiguous_input_and_a_copy_otherwise() -> None:
    tensor = torch.arange(6.0)
    assert encode_message({"t": tensor}, group="g", src=0, seq=0).payloads[0].data_ptr() == tensor.data_ptr()
    transposed = torch.arange(6.0).reshape(2, 3).t()
    payload = encode_message({"t": transposed}, group="g", src=0, seq=0).payloads[0]
    assert payload.data_ptr() != transposed.data_ptr()


def test_a_conjugate_view_travels_as_its_values() -> None:
    """``x.conj()`` of a complex tensor is a lazy view (its bytes are ``x``'s); it sends its values."""
    values = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    _, rebuilt = _through_the_wire({"t": values.conj()})
    assert torch.equal(rebuilt["t"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert not rebuilt["t"].is_conj()


@pytest.mark.parametrize("bad,match", [
    ({"m": (1, 2)}, "tuple"),
    ({1: torch.ones(1)}, "not a string"),
    ({"m": {1: 2}}, "non-string key"),
    ({"m": object()}, "not JSON"),
    ({"m": [torch.ones(1)]}, "nests a tensor"),
    ({"s": torch.ones(2, 2).to_sparse()}, "dense"),
])
def test_bad_messages_name_the_entry_and_the_fix(bad: dict, match: str) -> None:
    with pytest.raises(TensorDictError, match=match) as info:
        encode_message(bad, group="fwd", src=0, seq=0)
    assert "Fix:" in str(info.value) and isinstance(info.value, ValueError)


def test_not_a_mapping() -> None:
    with pytest.raises(TensorDictError, match="mapping"):
        encode_message(torch.ones(3), group="fwd", src=0, seq=0)  # type: ignore[arg-type]


def test_garbage_headers_are_protocol_errors() -> None:
    with pytest.raises(CommProtocolError, match="not a header"):
        parse_header_frame(torch.zeros(HEADER_FRAME_BYTES, dtype=torch.uint8))
    with pytest.raises(CommProtocolError, match="expected 1024"):
        parse_header_frame(torch.zeros(10, dtype=torch.uint8))
    with pytest.raises(CommProtocolError, match="cannot decode"):
        decode_header(b'{"v": 99, "seq": 0}')
    with pytest.raises(CommProtocolError, match="cannot decode"):
        decode_header(b"\xff\xfe")
