"""Seeded random plans over every mode, odd pp, uneven layer counts, both folds and batching:
each plan is valid, deadlock-free, deterministic, and prefills every request's tokens exactly
once, in order (the validator checks stages and hand-offs, not the tokens the chunks cover)."""

import random

import pytest

from sglang_vpp.schedule import (
    FOLDBACK_MODES,
    POLICIES,
    RequestSpec,
    build_schedule,
    check_deadlock,
    schedule_to_json,
    validate_schedule,
)

MODES = [str(mode) for mode in POLICIES]


def _covered(plan) -> dict[int, list[tuple[int, int, int, bool]]]:
    """Per request: (chunk index, start, tokens, is_last) of every part that carries it."""
    parts: dict[int, list[tuple[int, int, int, bool]]] = {}
    for chunk in plan.chunks:
        for part in chunk.parts:
            parts.setdefault(part.request_index, []).append(
                (part.chunk_index, part.start, part.num_tokens, part.is_last))
    return {request: sorted(found) for request, found in parts.items()}


def _assert_tokens_once_in_order(plan, lengths: list[int]) -> None:
    parts = _covered(plan)
    assert sorted(parts) == list(range(len(lengths)))
    for request, found in parts.items():
        assert [index for index, *_ in found] == list(range(len(found))), (request, found)
        position = 0
        for index, start, tokens, is_last in found:
            assert start == position and tokens >= 1, (request, found)
            assert is_last == (index == len(found) - 1), (request, found)
            position += tokens
        assert position == lengths[request], (request, found)


def _random_case(seed: int) -> dict:
    rng = random.Random(seed)
    mode = MODES[seed % len(MODES)]
    foldback = mode in FOLDBACK_MODES
    pp = rng.randint(2 if foldback else 1, 7)
    fold = rng.choice(["split", "fused"]) if foldback else "split"
    least = 2 * pp if foldback else pp
    layers = least + rng.choice([0, 1, pp - 1, 2 * pp + 1])  # rarely a multiple of the stage count
    chunk = rng.choice([1, 7, 64, 100])
    requests, arrival = [], 0.0
    for _ in range(rng.choice([1, 2, 5, 9])):
        if rng.random() < 0.4:
            arrival += rng.choice([1e-5, 1e-3])
        length = rng.choice([1, chunk - 1 or 1, chunk, chunk + 1, 2 * chunk + 1, rng.randint(1, 12 * chunk)])
        requests.append(RequestSpec(min(length, 40 * chunk), arrival))
    return dict(policy=mode, num_ranks=pp, num_layers=layers, requests=requests, chunk_size=chunk,
                batching=rng.random() < 0.5, fold=fold)


@pytest.mark.parametrize("seed", range(42))
def test_random_plan_is_valid_and_covers_every_token_once(seed):
    case = _random_case(seed)
    plan = build_schedule(**case)
    validate_schedule(plan)
    report = check_deadlock(plan)
    assert not report.deadlock, report.describe(plan.rank_actions)
    _assert_tokens_once_in_order(plan, [r.length for r in case["requests"]])
    assert schedule_to_json(build_schedule(**case)) == schedule_to_json(plan)


def test_coverage_check_catches_a_lost_and_a_repeated_token():
    import dataclasses

    plan = build_schedule("vpp", 2, 4, [RequestSpec(130)], 64)
    first, *rest = plan.chunks
    short = dataclasses.replace(plan, chunks=(dataclasses.replace(first, num_tokens=63), *rest))
    with pytest.raises(AssertionError):
        _assert_tokens_once_in_order(short, [130])
    overlap = dataclasses.replace(plan, chunks=(dataclasses.replace(first, num_tokens=65), *rest))
    with pytest.raises(AssertionError):
        _assert_tokens_once_in_order(overlap, [130])
