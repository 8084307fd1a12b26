"""``benchmarks/sim_runtime_check.py``: its page says how a forward was filled, which depends on
whether the prompt length divides the chunk (``bench`` batches with partial fill by default)."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def check():
    return load_benchmark("sim_runtime_check")


def test_the_page_names_whole_prompts_only_where_the_chunk_holds_whole_prompts(check):
    assert check.markdown([], 1024, 4096, 3, num_requests=32, fills=True).startswith(
        "tiny-qwen3 (8 layers, fp32, CPU, gloo), 32 prompts of 1024 tokens sent together (up to 4 whole prompts "
        "per forward")
    assert "(one prompt per forward)" in check.markdown([], 1024, 1024, 3, num_requests=8, fills=True)
    uneven = check.markdown([], 700, 4096, 3, num_requests=8, fills=True)
    assert "whole prompts per forward" not in uneven
    assert "then the head of the next in what is left" in uneven
    longer = check.markdown([], 5000, 1024, 3, num_requests=2, fills=True)
    assert "whole prompts" not in longer and "(each prompt in chunks, the next prompt's head joining" in longer
    assert "sent together" not in check.markdown([], 4096, 1024, 3, fills=True)  # one prompt: nothing batched


def test_the_page_says_whole_requests_where_the_runs_did_not_fill(check):
    uneven = check.markdown([], 700, 4096, 3, num_requests=8, fills=False)
    assert "head of the next" not in uneven and "partial fill off" in uneven
    longer = check.markdown([], 5000, 1024, 3, num_requests=2, fills=False)
    assert "its last chunk alone: partial fill off" in longer
    assert check.markdown([], 1024, 4096, 3, num_requests=32, fills=False) == \
        check.markdown([], 1024, 4096, 3, num_requests=32, fills=True)  # whole prompts fill the chunk either way


class _Stop(Exception):
    pass


@pytest.mark.parametrize("flag, fills", [([], True), (["--partial-fill"], True), (["--no-partial-fill"], False)])
def test_the_runs_are_filled_as_told_and_bench_fills_by_default(check, monkeypatch, flag, fills):
    seen = []

    def stop(config, log):
        seen.append(config)
        raise _Stop

    monkeypatch.setattr(check, "run_bench", stop)
    with pytest.raises(_Stop):
        check.main(["--pp", "2", "--seq-len", "700", "--chunk", "4096", "--requests", "8", *flag])
    assert seen[0].fills is fills
