import pytest

from sglang_vpp.schedule import (
    ChunkingError,
    DynamicChunker,
    FixedChunker,
    FlatCurveError,
    FlatCurveFallback,
    LinearAttentionCost,
    QuadraticCurve,
    TaperedChunker,
    default_chunker,
    fit_quadratic,
    get_policy,
    policy_layout,
    parse_size,
    split_request,
)
from sglang_vpp.schedule.chunking import check_alignment


def test_fixed_chunker_covers_prompt_with_remainder_last():
    assert split_request(FixedChunker(1024), 2500) == [(0, 1024), (1024, 1024), (2048, 452)]
    assert split_request(FixedChunker(1024), 1024) == [(0, 1024)]
    with pytest.raises(ChunkingError):
        FixedChunker(0)


def test_fit_quadratic_recovers_coefficients():
    truth = QuadraticCurve(3e-9, 2e-5, 0.01)
    lengths = list(range(512, 65536, 512))
    curve = fit_quadratic(lengths, [truth(n) for n in lengths])
    assert curve.a == pytest.approx(truth.a, rel=1e-6)
    assert curve.b == pytest.approx(truth.b, rel=1e-6)
    assert curve.c == pytest.approx(truth.c, rel=1e-4, abs=1e-9)


def test_fit_rejects_non_convex_curves():
    lengths = [1, 2, 3, 4, 5]
    with pytest.raises(ChunkingError, match="not positive"):
        fit_quadratic(lengths, [10 - x * x for x in lengths])
    with pytest.raises(ChunkingError):
        fit_quadratic([1, 1, 1], [1, 2, 3])


SGLANG_SMOOTH_FACTOR = 0.75
"""SGLang's server default (``SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR``): the curve these tests cut with."""


def _chunker(smooth_factor=SGLANG_SMOOTH_FACTOR, **kw):
    return DynamicChunker(QuadraticCurve(1e-8, 1e-4, 0.0), 4096, smooth_factor, **kw)


def test_dynamic_chunk_solves_equal_latency_without_smoothing():
    chunker = _chunker(smooth_factor=1.0, alignment=1)
    target = chunker.target_latency
    curve = chunker.curve
    for prefix in (0, 4096, 30000, 100000):
        x = chunker.ideal_chunk_size(prefix)
        assert curve(prefix + x) - curve(prefix) == pytest.approx(target, rel=1e-9)
        assert chunker.next_chunk_size(prefix, 10**9) == max(int(x), 1024)


def test_dynamic_chunks_shrink_with_prefix_floor_align_and_cap():
    chunker = _chunker()
    sizes = [size for _, size in split_request(chunker, 400_000)]
    assert sizes[0] == 4096
    assert all(a >= b for a, b in zip(sizes, sizes[1:-1]))  # non-increasing except the remainder
    assert min(sizes[:-1]) >= 4096 // 4  # floor
    assert all(s % 64 == 0 for s in sizes[:-1])  # alignment
    capped = _chunker(max_prefill_tokens=2000)
    assert capped.next_chunk_size(0, 10**9) == 1984
    assert chunker.next_chunk_size(0, 100) == 100


def test_smoothing_moves_toward_base():
    raw = _chunker(smooth_factor=1.0, alignment=1).next_chunk_size(200_000, 10**9)
    smooth = _chunker(smooth_factor=0.5, alignment=1).next_chunk_size(200_000, 10**9)
    assert raw < smooth < 4096


def test_dynamic_chunker_from_latency_fn():
    chunker = DynamicChunker.from_latency_fn(lambda n: 2e-9 * n * n + 1e-5 * n, 1024, 65536,
                                             smooth_factor=SGLANG_SMOOTH_FACTOR)
    assert chunker.curve.a == pytest.approx(2e-9, rel=1e-6)


@pytest.mark.parametrize("text, value", [("16k", 16384), ("1m", 1 << 20), ("3000", 3000), ("1.5k", 1536), (77, 77), ("24K", 24576)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "k", "abc", "-1k", "0", "1.3", "12x"])
def test_parse_size_rejects(text):
    with pytest.raises(ChunkingError):
        parse_size(text)


def test_min_chunk_size_overrides_quarter_floor():
    deep = 10**7
    assert _chunker().next_chunk_size(deep, 10**9) == 1024
    # With smoothing 0.75 the result never drops below base / 4 anyway; the paper used 1.0.
    assert _chunker(min_chunk_size=512, smooth_factor=1.0).next_chunk_size(deep, 10**9) == 512
    with pytest.raises(ChunkingError):
        _chunker(min_chunk_size=8192)


def test_first_chunk_is_exactly_base_despite_rounding():
    # Curves whose root at L = 0 lands a hair under the base size in floating point.
    for a, b in [(3.7e-9, 1.3e-5), (1e-7, 0.0), (2.2e-8, 7.1e-6), (5e-10, 3e-4)]:
        for base in (64, 512, 1000, 4096, 24576):
            chunker = DynamicChunker(QuadraticCurve(a, b, 0.1), base, SGLANG_SMOOTH_FACTOR)
            assert chunker.next_chunk_size(0, 10**9) == base // min(64, base) * min(64, base)


def test_chunk_count_limit_refuses_one_past_it_and_leaves_every_legitimate_cut():
    from sglang_vpp.schedule import MAX_CHUNKS_PER_REQUEST, check_chunk_count
    from sglang_vpp.schedule.auto_size import CANDIDATES

    check_chunk_count(MAX_CHUNKS_PER_REQUEST * 64, 64)  # 1M tokens at 64: exactly at the limit
    with pytest.raises(ChunkingError, match=r"is 16385 chunks, more than the limit of 16384 per request; "
                                            r"raise chunk size to 2 or more"):
        check_chunk_count(MAX_CHUNKS_PER_REQUEST + 1, 1)
    # auto's smallest candidate on a 1M prompt, and the benchmarks' finest cut (1M at 1K).
    check_chunk_count(1 << 20, min(CANDIDATES))
    check_chunk_count(1 << 20, 1024)


def test_plan_work_limit_counts_every_request_and_names_the_smallest_size_that_fits():
    from sglang_vpp.schedule import MAX_PLAN_WORK, check_plan_work

    check_plan_work([64] * MAX_PLAN_WORK, 64, 1, 1)  # one chunk each on one stage: exactly at the limit
    with pytest.raises(ChunkingError, match=rf"is {MAX_PLAN_WORK + 1} chunks on 1 stages: {MAX_PLAN_WORK + 1} units "
                                            rf"of planning work \(chunks x stages\), more than the limit of {MAX_PLAN_WORK} per run at any "
                                            r"chunk size; send fewer requests"):
        check_plan_work([64] * MAX_PLAN_WORK + [1], 64, 1, 1)
    with pytest.raises(ChunkingError, match=r"raise chunk size to 128 or more"):
        check_plan_work([128] * (MAX_PLAN_WORK // 2 + 1), 64, 1, 1)
    # Rounding up per request: 3-token requests at size 2 are two chunks each, so the size named
    # must cut every request into one chunk, not total / limit.
    lengths = [3] * MAX_PLAN_WORK
    with pytest.raises(ChunkingError, match=r"raise chunk size to 3 or more"):
        check_plan_work(lengths, 2, 1, 1)
    check_plan_work(lengths, 3, 1, 1)


def test_plan_work_counts_stages_and_ranks_past_the_flat_per_event_cost():
    from sglang_vpp.schedule import MAX_PLAN_WORK, RANKS_PER_EVENT, check_plan_work, plan_work

    assert plan_work(10, 4, 2) == 40 and plan_work(10, 4, RANKS_PER_EVENT) == 40
    assert plan_work(10, 256, 128) == 10 * 256 * 128 // RANKS_PER_EVENT
    # The same chunks that fit on 4 stages do not on 8.
    chunks = MAX_PLAN_WORK // 4
    check_plan_work([64] * chunks, 64, 4, 2)
    with pytest.raises(ChunkingError, match=rf"is {chunks} chunks on 8 stages: {2 * MAX_PLAN_WORK} units"):
        check_plan_work([64] * chunks, 64, 8, 4)
    # A deep plan of few chunks per stage: 16384 chunks on 256 stages of 128 ranks would plan for minutes.
    with pytest.raises(ChunkingError, match=r"on 256 stages of 128 ranks: 22369621 units of planning work "
                                            r"\(chunks x stages x ranks/24\), more than the limit of 4194304 per "
                                            r"run; raise size to 171 or more"):
        check_plan_work([512 * 1024], 32, 256, 128, "size")


def test_plan_work_limit_admits_paper_scale_runs():
    """The limit is against typos, not a budget: the runs the method is measured on all fit."""
    from sglang_vpp.schedule import check_plan_work

    one_m = 1 << 20
    check_plan_work([one_m] * 100, 2048, 16, 8)  # 100 x 1M at 2K chunks, P = 8 fold-back
    check_plan_work([one_m] * 500, 16384, 32, 16)  # 500 x 1M at 16K, P = 16 fold-back
    check_plan_work([128 * 1024] * 500, 2048, 32, 16)  # 500 x 128K at 2K, P = 16
    check_plan_work([one_m] * 100, 4096, 32, 16)  # 100 x 1M at 4K, P = 16


def test_one_check_bounds_the_longest_request_and_the_run():
    from sglang_vpp.schedule import MAX_CHUNKS_PER_REQUEST, MAX_PLAN_WORK, check_chunk_counts

    check_chunk_counts([64, MAX_CHUNKS_PER_REQUEST], 1, 1, 1)
    with pytest.raises(ChunkingError, match="the longest one.*per request"):
        check_chunk_counts([64, MAX_CHUNKS_PER_REQUEST + 1], 1, 1, 1, length_name="the longest one")
    with pytest.raises(ChunkingError, match="the load.*per run"):
        check_chunk_counts([64] * (MAX_PLAN_WORK + 1), 64, 1, 1, workload_name="the load")
    with pytest.raises(ChunkingError, match="the load has no requests"):
        check_chunk_counts([], 64, 1, 1, workload_name="the load")


def test_fit_treats_a_linear_curve_as_flat_whatever_the_rounding_sign():
    # A linear latency fits a = +-1e-22: the sign is rounding, so both signs are flat.
    for longest in (320, 1000, 4096, 65536):
        lengths = list(range(longest // 64, longest + 1, longest // 64))
        with pytest.raises(FlatCurveError, match="super-linearly"):
            fit_quadratic(lengths, [2e-6 * n + 1e-3 for n in lengths])
        with pytest.raises(FlatCurveError, match="super-linearly"):  # a constant: a profile of no growth
            fit_quadratic(lengths, [1.2e-3 for _ in lengths])
    # A small but real square term is kept.
    lengths = list(range(64, 4097, 64))
    assert fit_quadratic(lengths, [1e-16 * n * n + 2e-6 * n for n in lengths]).a > 0


def test_dcpp_with_a_flat_estimate_runs_fixed_chunks_and_says_why():
    layout = policy_layout("dcpp", 2, 4)
    dcpp = get_policy("dcpp")
    flat = default_chunker(dcpp, 48, layout, LinearAttentionCost(attention_per_pair=0.0), 320)
    assert isinstance(flat, FlatCurveFallback)
    assert [flat.next_chunk_size(p, 1000) for p in (0, 100, 272)] == [48, 48, 48]
    assert "dcpp ran fixed 48-token chunks (cpp in effect)" in flat.reason
    curved = default_chunker(dcpp, 48, layout, LinearAttentionCost(), 320)
    assert isinstance(curved, DynamicChunker)


def test_dcpp_on_one_token_chunks_of_a_one_token_prompt_fits_its_curve():
    """The fit range was max(prompt, 2 x chunk) = 2 tokens: two lengths, and schedule, check,
    simulate and bench --mode dcpp --seq-len 1 --chunk-size 1 failed with the fitter's error."""
    from sglang_vpp.schedule import RequestSpec, build_schedule

    chunker = DynamicChunker.from_latency_fn(lambda n: n * n + n, 1, 2, smooth_factor=1.0)
    assert chunker.curve.a > 0
    plan = build_schedule("dcpp", 2, 4, [RequestSpec(1)], 1)
    assert [c.num_tokens for c in plan.chunks] == [1]


def test_the_request_count_limit_names_the_ranks_where_they_count():
    from sglang_vpp.schedule import check_request_count

    with pytest.raises(ChunkingError, match=r"is at least 100000 chunks on 256 stages of 128 ranks, more than"):
        check_request_count(100000, 256, 128)
    with pytest.raises(ChunkingError, match=r"is at least 2000000 chunks on 4 stages, more than"):
        check_request_count(2000000, 4, 2)


@pytest.mark.parametrize("build", [
    lambda alignment: TaperedChunker(512, ratio=8, min_chunks=4, min_body=64, alignment=alignment),
    lambda alignment: DynamicChunker(QuadraticCurve(1e-9, 1e-6, 1e-3), 512, 1.0, alignment=alignment),
], ids=["tapered", "dcpp"])
@pytest.mark.parametrize("alignment", [0, -64])
def test_both_aligning_chunkers_refuse_an_alignment_below_one_alike(build, alignment):
    with pytest.raises(ChunkingError) as rule:
        check_alignment(alignment)
    assert str(rule.value) == f"alignment must be >= 1, got {alignment}"
    with pytest.raises(ChunkingError) as caught:
        build(alignment)
    assert str(caught.value) == str(rule.value)
    build(1)
