"""Host time per micro-batch from trace records, its table and verdict (no server needed)."""

from __future__ import annotations

import time

import pytest

from sglang_vpp.serving.host_time import HostTime, host_spread, host_time
from sglang_vpp.serving.report import host_verdict_lines, render_tables
from sglang_vpp.sglang_plugin.accounting import RankAccounting


def _rec(rank, stage, seq, start, host):
    return {"rank": rank, "stage": stage, "seq": seq, "start_s": start, "cpu_s": 1.0, "is_prefill": True,
            "host_cpu_s": host}


def test_stock_one_forward_per_micro_batch_median_skips_the_idle_gap():
    # Rank 0's first gap spans the pause before the run (left out); one idle stretch of 5 s is an outlier.
    hosts = [9.0, 0.002, 0.003, 5.0, 0.002, 0.004]
    records = [_rec(0, 0, k, float(k), h) for k, h in enumerate(hosts)]
    records += [_rec(1, 1, k, k + 0.5, 0.001) for k in range(len(hosts))]
    got = host_time(records, 2)
    assert got.per_micro_batch_s == [0.003, 0.001]  # median of 0.002, 0.003, 5.0, 0.002, 0.004
    assert got.forwards_per_micro_batch == [1.0, 1.0]
    assert got.num_micro_batches == 6


def test_foldback_sums_a_rank_s_two_forwards_of_one_micro_batch():
    # P = 2 fold-back: rank 0 runs stages 0 and 3, rank 1 stages 1 and 2 of every micro-batch.
    records = []
    for k in range(4):
        records += [_rec(0, 0, k, 10 * k, 0.002), _rec(1, 1, k, 10 * k + 1, 0.001),
                    _rec(1, 2, k, 10 * k + 2, 0.0005), _rec(0, 3, k, 10 * k + 3, 0.003)]
    got = host_time(records, 2)
    # Rank 0's first forward (stage 0 of micro-batch 0) is left out: micro-batch 0 counts 0.003 there.
    assert got.per_micro_batch_s == [pytest.approx(0.005), pytest.approx(0.0015)]
    assert got.per_forward_s == [pytest.approx(0.003), pytest.approx(0.0005)]
    assert got.forwards_per_micro_batch == [pytest.approx(7 / 4), pytest.approx(7 / 4)]


def test_window_after_seq_and_missing_fields():
    records = [_rec(0, 0, k, k, 0.001 * k) for k in range(6)] + [_rec(1, 1, k, k, 0.001) for k in range(6)]
    assert host_time(records, 2, after_seq=2).per_micro_batch_s[0] == pytest.approx(0.0045)
    assert host_time(records, 2, after_seq=5) is None  # nothing after the mark
    old = [{k: v for k, v in r.items() if k != "host_cpu_s"} for r in records]
    assert host_time(old, 2) is None  # a trace written before the field existed


def test_accounting_records_the_thread_cpu_between_computes():
    acct = RankAccounting(0, "unwritten-trace-dir")
    for seq in range(3):
        started = acct.start()
        acct.finish(started, stage=0, seq=seq, is_prefill=True, num_tokens=1)
        spin = time.thread_time() + 0.01
        while time.thread_time() < spin:  # host work between forwards
            pass
    first, *rest = acct.records
    assert first.host_cpu_s == 0.0
    assert all(r.host_cpu_s >= 0.009 for r in rest)


def test_accounting_without_a_trace_dir_keeps_no_records():
    acct = RankAccounting(0, None)
    for seq in range(3):
        acct.finish(acct.start(), stage=0, seq=seq, is_prefill=True, num_tokens=1)
        acct.decision("left", seq=seq)
    assert acct.records == [] and acct.decisions == []


def _summary():
    ms = {"median": 1.0, "p99": 2.0}
    return {"num_requests": 2, "num_failed": 0, "ttft_ms": ms, "itl_ms": ms, "e2e_ms": ms, "output_throughput": 3.0}


def _runs(cpp_ms, vpp_ms):
    def spread(per_rank):
        return host_spread([HostTime([x / 1e3 for x in ms], [x / 1e3 for x in ms], [1.0] * len(ms), 9)
                            for ms in per_rank])
    return [{"label": "cpp", "url": "u", "summary": _summary(), "host_time": spread(cpp_ms)},
            {"label": "vpp-pack", "url": "u", "summary": _summary(), "host_time": spread(vpp_ms)}]


def test_host_table_fits_80_columns_and_the_verdict_names_the_worst_rank():
    runs = _runs([[4.0, 3.0], [4.4, 3.2]], [[4.1, 4.0], [4.3, 4.2]])
    text = render_tables(runs)
    assert "host time per micro-batch, ms" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    verdict = host_verdict_lines(runs)
    # rank 1: median 4.1 against 3.1 -> +32 %, the worst rank, over the 10 % line
    assert verdict[1].startswith("vpp-pack: +32% on rank 1 -> over 10%")


def test_verdict_within_and_overlapping():
    runs = _runs([[4.0, 3.0], [4.4, 3.2]], [[4.2, 3.1], [4.5, 3.3]])
    verdict = host_verdict_lines(runs)
    assert "within 10%" in verdict[1] and "ranges overlap on every rank" in verdict[1]
    assert host_verdict_lines(runs[1:]) == []  # no baseline launched: no verdict


def test_verdict_below_the_baseline():
    runs = _runs([[4.0, 3.0], [4.4, 3.2]], [[2.0, 1.7], [2.2, 1.7]])
    assert host_verdict_lines(runs)[1] == "vpp-pack: -45% on rank 1 -> below cpp"


def test_verdict_claims_no_difference_where_the_named_ranks_ranges_overlap():
    # Rank 0 is clearly below cpp; rank 1, the rank named, is +16 % by median, but its range
    # [3.0, 4.2] overlaps cpp's [3.0, 3.2]: the unpaired rule says no significant difference.
    runs = _runs([[4.0, 3.0], [4.4, 3.2]], [[3.0, 3.0], [3.2, 4.2]])
    assert host_verdict_lines(runs)[1].replace("\n", " ") == \
        "vpp-pack: +16% on rank 1 -> no significant difference (min-max ranges overlap on rank 1)"


def test_verdict_below_needs_separate_ranges_on_every_rank():
    # Both ranks more than 10 % below by median; rank 1, the rank named, is separate from cpp's,
    # but rank 0's range [1.0, 4.0] reaches cpp's [4.0, 4.4], so "below" does not stand.
    runs = _runs([[4.0, 3.0], [4.4, 3.2]], [[1.0, 2.0], [4.0, 2.2]])
    assert host_verdict_lines(runs)[1].replace("\n", " ") == \
        "vpp-pack: -32% on rank 1 -> no significant difference (min-max ranges overlap on rank 0)"


def test_verdict_with_one_repeat_names_no_difference():
    def spread(ms):
        return host_spread([HostTime([x / 1e3 for x in ms], [x / 1e3 for x in ms], [1.0] * len(ms), 9)])
    runs = [{"label": "cpp", "url": "u", "summary": _summary(), "host_time": spread([4.0, 3.0])},
            {"label": "vpp-pack", "url": "u", "summary": _summary(), "host_time": spread([4.0, 4.0])}]
    assert host_verdict_lines(runs)[1].replace("\n", " ") == \
        "vpp-pack: +33% on rank 1 -> no significant difference (one repeat gives no range)"


def test_verdict_never_prints_the_excess_at_the_band_it_is_over():
    # +10.4 % is over the 10 % band; a whole percent would print "+10% ... -> over 10%".
    runs = _runs([[4.0, 3.0], [4.0, 3.0]], [[4.0, 3.312], [4.0, 3.312]])
    assert host_verdict_lines(runs)[1] == "vpp-pack: +10.4% on rank 1 -> over 10%"
