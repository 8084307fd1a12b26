"""The verdict: who wins, by how much, and "no significant difference" when the noise says so."""

import pytest

from sglang_vpp.verdict import WIDTH, compare, make_verdict


def test_paired_agreement_is_significant_and_names_the_winner():
    values = {"cpp": [2.0, 2.4, 2.2], "dcpp": [2.1, 2.5, 2.3], "vpp-pack": [1.8, 2.2, 2.0]}
    verdict = make_verdict(values, "makespan", paired=True)
    assert verdict.winner == "vpp-pack"
    outcomes = {(c.mode, c.baseline): c.outcome for c in verdict.comparisons}
    assert outcomes[("vpp-pack", "cpp")] == "faster" and outcomes[("cpp", "dcpp")] == "faster"
    assert outcomes[("dcpp", "cpp")] == "slower"
    assert "vpp-pack wins" in verdict.headline()


def test_paired_sign_change_is_no_significant_difference():
    values = {"cpp": [2.0, 2.0, 2.0], "vpp": [1.9, 2.1, 1.95]}
    comparison = compare(values, "vpp", "cpp", paired=True)
    assert comparison.outcome == "no significant difference" and not comparison.significant
    assert make_verdict(values, "makespan", paired=True).winner is None


def test_unpaired_overlapping_ranges_are_no_significant_difference():
    # Every paired ratio is below 1, but the ranges overlap: unpaired measurements decide on overlap.
    values = {"cpp": [2.0, 2.4], "vpp-pack": [1.9, 2.3]}
    assert compare(values, "vpp-pack", "cpp", paired=True).outcome == "faster"
    assert compare(values, "vpp-pack", "cpp", paired=False).outcome == "no significant difference"
    assert compare({"cpp": [2.0, 2.1], "vpp": [1.5, 1.6]}, "vpp", "cpp", paired=False).outcome == "faster"


def test_one_repeat_never_claims_a_winner():
    verdict = make_verdict({"cpp": [2.0], "vpp-pack": [1.0]}, "makespan", paired=True)
    assert verdict.winner is None and "--repeat" in verdict.headline()
    assert all(c.outcome == "no significant difference" for c in verdict.comparisons)
    assert "-50.0%" in verdict.comparisons[0].text()


def test_paired_floor_and_one_disturbed_repeat_in_five():
    # Every repeat agrees, but the effect is below MIN_EFFECT (1 %): not called significant.
    assert compare({"cpp": [2.0] * 3, "vpp": [1.99, 1.995, 1.992]}, "vpp", "cpp", paired=True).outcome == \
        "no significant difference"
    # Four of five repeats say 5 % faster, one disturbed repeat says slower: still faster.
    values = {"cpp": [2.0] * 5, "vpp": [1.9, 1.9, 1.9, 1.9, 2.05]}
    assert compare(values, "vpp", "cpp", paired=True).outcome == "faster"
    # Two of five disagree: no verdict.
    values = {"cpp": [2.0] * 5, "vpp": [1.9, 1.9, 1.9, 2.05, 2.05]}
    assert compare(values, "vpp", "cpp", paired=True).outcome == "no significant difference"


_LONG_MODES = ["cpp", "dcpp", "vpp-async-with-a-long-name", "vpp-pack", "vpp-taper-experimental", "vpp"]


@pytest.mark.parametrize("metric", ["equal-cost makespan", "served TTFT median (wall clock, shared host)"])
@pytest.mark.parametrize("repeats", [1, 5])
@pytest.mark.parametrize("paired", [True, False])
def test_printed_verdict_fits_80_columns_and_keeps_its_words(metric, repeats, paired):
    # Six modes, two with long names; the winner has the longest name, so the headline is too long.
    values = {mode: [2.0 + 0.1 * i + 0.01 * r for r in range(repeats)] for i, mode in enumerate(_LONG_MODES)}
    values["vpp-async-with-a-long-name"] = [0.5 + 0.01 * r for r in range(repeats)]
    values["vpp"] = [4.0 + 0.5 * r for r in range(repeats)]  # +100 % .. +200 %: the widest numbers
    verdict = make_verdict(values, metric, paired=paired, repeat_flag="--repeats")
    lines = verdict.lines()
    assert all(len(line) <= WIDTH for line in lines), [line for line in lines if len(line) > WIDTH]
    text = "\n".join(lines)
    if repeats == 1:
        assert verdict.winner is None and "run --repeats 3 or more" in text
    else:
        assert verdict.winner == "vpp-async-with-a-long-name"
        assert "vpp-async-with-a-long-name wins" in text and verdict.headline() in text.replace(":\n  ", ": ")
    # Every comparison is printed whole: its text, with line breaks, is in the output.
    joined = " ".join(line.strip() for line in lines)
    assert all(c.text() in joined for c in verdict.comparisons)
    assert len(verdict.comparisons) == 2 * 5


def test_headline_prints_as_metric_then_statement():
    values = {"cpp": [2.0, 2.4, 2.2], "dcpp": [2.1, 2.5, 2.3], "vpp-pack": [1.8, 2.2, 2.0]}
    lines = make_verdict(values, "equal-cost makespan", paired=True).lines()
    assert lines[:2] == ["verdict (equal-cost makespan):", "  vpp-pack wins (significantly lower than every other mode)"]
    assert lines[2] == "  significant: |median| >= 1% and the repeats agree in sign (1 in 5 may not)"
    assert lines[3] == "  dcpp vs cpp: +4.5% [+4.2% .. +5.0%] -> slower" and len(lines) == 3 + 4
    lines = make_verdict({"cpp": [2.0, 2.0], "vpp": [2.0, 2.0]}, "TTFT", paired=True).lines()
    assert lines[:2] == ["verdict (TTFT):", "  no mode is significantly lower than all others"]


def test_each_line_says_why_a_difference_is_not_significant():
    """A -0.7 % next to a -10 % "faster", or a -40 % next to it, explains itself."""
    paired = make_verdict({"cpp": [1.0, 1.0, 1.0], "vpp": [0.993, 0.994, 0.993], "vpp-pack": [0.5, 1.2, 0.6]},
                          "m", paired=True)
    texts = {c.mode: c.text() for c in paired.comparisons}
    assert texts["vpp"].endswith("-> no significant difference (under the 1% floor)")
    assert texts["vpp-pack"].endswith("-> no significant difference (repeats disagree in sign)")
    unpaired = make_verdict({"cpp": [1.0, 1.1, 1.0], "vpp": [0.5, 1.05, 0.6]}, "m", paired=False)
    assert unpaired.comparisons[0].text().endswith("(min-max ranges overlap)")
    assert "ranges over repeats do not overlap" in "\n".join(unpaired.lines())
    assert unpaired.to_dict()["rule"] == unpaired.rule() and paired.to_dict()["comparisons"][0]["reason"]


def test_without_cpp_or_dcpp_every_mode_is_compared_with_the_first_mode_given():
    # bench --modes vpp,vpp-pack,vpp-async: the winner must come with the comparisons that show it.
    values = {"vpp": [2.0, 2.1, 2.0, 2.2, 2.0], "vpp-pack": [1.8, 1.9, 1.8, 2.0, 1.8],
              "vpp-async": [2.0, 2.1, 2.0, 2.2, 2.01]}
    verdict = make_verdict(values, "equal-cost makespan", paired=True)
    assert [(c.mode, c.baseline) for c in verdict.comparisons] == [("vpp-pack", "vpp"), ("vpp-async", "vpp")]
    assert verdict.winner == "vpp-pack" and verdict.baselines == ("vpp",)
    text = "\n".join(verdict.lines())
    assert "no cpp or dcpp among the modes: every mode compared with vpp, the first mode\n    given" in text
    assert "vpp-pack vs vpp: -10.0%" in text and verdict.to_dict()["baselines"] == ["vpp"]
    # With a stock mode present nothing changes, and no note is printed.
    stock = make_verdict({"cpp": [2.0, 2.1, 2.0], "vpp": [1.0, 1.1, 1.0]}, "makespan", paired=True)
    assert stock.baselines == ("cpp",) and "among the modes" not in "\n".join(stock.lines())


def test_one_mode_has_nothing_to_compare():
    verdict = make_verdict({"vpp": [2.0, 2.1, 2.0]}, "equal-cost makespan", paired=True)
    assert verdict.winner is None and not verdict.comparisons
    assert verdict.lines() == ["verdict (equal-cost makespan):", "  one mode: nothing to compare"]


def test_a_median_under_the_floor_never_prints_at_the_floor():
    # +0.97 % is under the 1 % floor; one decimal would print "+1.0%" next to "(under the 1% floor)".
    values = {"cpp": [1.0] * 3, "vpp": [1.0096, 1.0097, 1.0098]}
    comparison = compare(values, "vpp", "cpp", paired=True)
    assert comparison.text() == \
        "vpp vs cpp: +0.97% [+0.96% .. +0.98%] -> no significant difference (under the 1% floor)"
    # Away from the floor, one decimal as before.
    assert compare({"cpp": [1.0] * 3, "vpp": [1.05, 1.05, 1.06]}, "vpp", "cpp", paired=True).text() == \
        "vpp vs cpp: +5.0% [+5.0% .. +6.0%] -> slower"
