"""``TaperedChunker`` and the ``vpp-taper`` mode built on it."""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import (
    ChunkingError,
    FixedChunker,
    RequestSpec,
    TaperedChunker,
    build_schedule,
    check_deadlock,
    get_policy,
    split_request,
    validate_schedule,
)


def sizes(chunker, length):
    chunks = split_request(chunker, length)
    assert [start for start, _ in chunks] == [sum(n for _, n in chunks[:i]) for i in range(len(chunks))]
    assert sum(n for _, n in chunks) == length
    return [n for _, n in chunks]


def test_body_ramps_and_tail_halving():
    got = sizes(TaperedChunker(8192, ratio=4, min_chunks=1, min_body=2048), 64 * 1024)
    assert got[:4] == [2048, 2048, 4096, 8192]  # a chunk never exceeds the prefix before it
    assert got[-4:] == [8192, 4096, 2048, 2048]  # half of what remains, down to the floor
    assert max(got) == 8192 and len(got) == 12  # 3 head + 5 body + 4 tail


def test_chunk_size_is_a_cap_for_deep_pipelines():
    chunker = TaperedChunker(64 * 1024, ratio=4, min_chunks=64, min_body=2048)  # P = 8: 16 stages x 4
    got = sizes(chunker, 512 * 1024)
    assert chunker.body_size(512 * 1024) == 8192 and max(got) == 8192
    assert len(got) >= 64


def test_short_requests_are_cut_like_fixed_chunks():
    chunker = TaperedChunker(8192, ratio=4, min_chunks=16, min_body=2048)
    assert sizes(chunker, 4000) == [2048, 1952]  # body never below min_body: no ramps, no slivers
    assert sizes(chunker, 100) == [100]


@pytest.mark.parametrize("kwargs", [{"chunk_size": 0}, {"ratio": 0}, {"min_chunks": 0}, {"min_body": 0}])
def test_bad_parameters_are_user_errors(kwargs):
    with pytest.raises(ChunkingError):
        TaperedChunker(**{"chunk_size": 8, "ratio": 4, "min_chunks": 1, "min_body": 2048, **kwargs})


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_vpp_taper_plans_valid_deadlock_free_schedules(num_ranks):
    spec = get_policy("vpp-taper")
    assert spec.tapered_chunks and spec.pack and str(spec.layout_kind) == "foldback"
    schedule = build_schedule("vpp-taper", num_ranks, 4 * num_ranks, [RequestSpec(16384), RequestSpec(3000)], 2048)
    validate_schedule(schedule)
    assert not check_deadlock(schedule).deadlock
    first = [c.num_tokens for c in schedule.chunks if c.request_index == 0]
    assert first[0] < max(first) and first[-1] < max(first)  # ramped at both ends


@pytest.mark.parametrize("chunk_size", [16, 64, 65, 96, 128, 256, 8192])
def test_tapers_says_whether_any_chunk_differs_from_fixed(chunk_size):
    chunker = TaperedChunker(chunk_size, ratio=4, min_chunks=6, min_body=2048)
    differs = any(sizes(chunker, n) != sizes(FixedChunker(chunk_size), n) for n in (3 * chunk_size, 40 * chunk_size + 7))
    assert chunker.tapers == differs
    assert chunker.tapers == (chunk_size > 64)  # one alignment unit leaves the ramps nothing to cut


def test_vpp_taper_start_up_note_only_when_nothing_tapers():
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp.chunk_sizing import taper_note

    note = taper_note(SimpleNamespace(chunker=TaperedChunker(64, ratio=4, min_chunks=1, min_body=2048)), 64)
    assert note is not None and "--chunked-prefill-size 64" in note and "as vpp-pack does" in note
    assert taper_note(SimpleNamespace(chunker=TaperedChunker(128, ratio=4, min_chunks=1, min_body=2048)), 128) is None
    assert taper_note(SimpleNamespace(chunker=FixedChunker(64)), 64) is None


def test_the_chunkers_take_the_policies_constants_and_keep_none_of_their_own():
    """vpp-taper's ramps and dcpp's smoothing are the policies' constants: the chunkers have no
    defaults for them (a second set would cut otherwise wherever a caller left one out), and the
    controller factory passes the constants."""
    import dataclasses

    from sglang_vpp.schedule import DynamicChunker, LinearAttentionCost, build_layout
    from sglang_vpp.schedule.factory import default_chunker
    from sglang_vpp.schedule.policies import dcpp, vpp_taper

    def without_default(cls, name):
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING

    assert all(without_default(TaperedChunker, name) for name in ("ratio", "min_chunks", "min_body"))
    assert without_default(DynamicChunker, "smooth_factor")
    layout = build_layout(4, 16, "foldback")
    tapered = default_chunker(get_policy("vpp-taper"), 16384, layout, None, 1 << 20)
    assert (tapered.ratio, tapered.min_chunks, tapered.min_body) == (
        vpp_taper.TAPER_RATIO, vpp_taper.CHUNKS_PER_STAGE * layout.method_stages, vpp_taper.MIN_BODY_TOKENS)
    curved = default_chunker(get_policy("dcpp"), 4096, build_layout(4, 16), LinearAttentionCost(), 1 << 17)
    assert isinstance(curved, DynamicChunker) and curved.smooth_factor == dcpp.SMOOTH_FACTOR
