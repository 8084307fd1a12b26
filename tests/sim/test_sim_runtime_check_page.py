"""``benchmarks/sim_runtime_check.py``: its page says how a forward was filled, which depends on
whether the prompt length divides the chunk (``bench`` batches with partial fill by default)."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def check():
    return load_benchmark("sim_runtime_check")


def test_the_page_names_whole_prompts_only_where_the_chunk_holds_whole_prompts(check):
    assert check.markdown([], 1024, 4096, 3, num_requests=32).startswith(
        "tiny-qwen3 (8 layers, fp32, CPU, gloo), 32 prompts of 1024 tokens sent together (up to 4 whole prompts "
        "per forward")
    assert "(one prompt per forward)" in check.markdown([], 1024, 1024, 3, num_requests=8)
    uneven = check.markdown([], 700, 4096, 3, num_requests=8)
    assert "whole prompts per forward" not in uneven
    assert "then the head of the next in what is left" in uneven
    longer = check.markdown([], 5000, 1024, 3, num_requests=2)
    assert "whole prompts" not in longer and "(each prompt in chunks, the next prompt's head joining" in longer
    assert "sent together" not in check.markdown([], 4096, 1024, 3)  # one prompt: nothing batched
