import pytest

from sglang_vpp.schedule import LayoutError, LayoutKind, build_layout, even_split


@pytest.mark.parametrize("num_ranks", range(2, 9))
def test_foldback_rank_holds_r_and_mirror(num_ranks):
    layout = build_layout(num_ranks, 4 * num_ranks + 3, "vpp")
    assert layout.num_stages == 2 * num_ranks
    for rank in range(num_ranks):
        assert layout.stages_of(rank) == (rank, 2 * num_ranks - 1 - rank)
    # Layers tile [0, L) in stage order with no gap or overlap.
    assert layout.stages[0].layer_start == 0
    for before, after in zip(layout.stages, layout.stages[1:]):
        assert before.layer_end == after.layer_start
    assert layout.stages[-1].layer_end == layout.num_layers


@pytest.mark.parametrize("kind,fold", [("cpp", "split"), ("vpp", "split"), ("vpp", "fused")])
@pytest.mark.parametrize("num_ranks", range(2, 7))
def test_a_stage_knows_which_visit_of_its_rank_it_is(num_ranks, kind, fold):
    layout = build_layout(num_ranks, 4 * num_ranks, kind, fold=fold)
    for rank in range(num_ranks):
        # A micro-batch reaches a rank's stages in pipeline order: the first is visit 0.
        assert [layout.stages[s].visit for s in layout.stages_of(rank)] == list(range(len(layout.stages_of(rank))))
    assert sum(s.visit for s in layout.stages) == layout.num_stages - num_ranks


@pytest.mark.parametrize("num_ranks", range(1, 9))
def test_contiguous_one_stage_per_rank(num_ranks):
    layout = build_layout(num_ranks, 2 * num_ranks, "cpp")
    assert [s.rank for s in layout.stages] == list(range(num_ranks))
    assert layout.kind is LayoutKind.CONTIGUOUS


def test_even_split_spreads_remainder_to_first_stages():
    assert even_split(10, 4) == [3, 3, 2, 2]
    layout = build_layout(2, 10, "vpp")
    assert [(s.layer_start, s.layer_end) for s in layout.stages] == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_p2_foldback_matches_method_doc():
    layout = build_layout(2, 48, "vpp")
    assert layout.to_dict()["stages"] == [
        {"stage": 0, "rank": 0, "layers": [0, 12]},
        {"stage": 1, "rank": 1, "layers": [12, 24]},
        {"stage": 2, "rank": 1, "layers": [24, 36]},
        {"stage": 3, "rank": 0, "layers": [36, 48]},
    ]


@pytest.mark.parametrize("num_ranks", range(2, 9))
def test_uneven_split(num_ranks):
    counts = [1 + (i % 3) for i in range(2 * num_ranks)]
    layout = build_layout(num_ranks, sum(counts), "vpp", counts)
    assert [s.num_layers for s in layout.stages] == counts
    assert layout.stages[-1].rank == 0


def test_layout_json_round_trip():
    layout = build_layout(3, 20, "vpp", [2, 4, 4, 4, 4, 2])
    assert type(layout).from_dict(layout.to_dict()) == layout


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((0, 8, "cpp", None), "--pp must be >= 1, got 0"),
        ((-2, 8, "cpp", None), "got -2"),
        ((1, 8, "vpp", None), "needs --pp >= 2, got 1"),
        ((2, 3, "vpp", None), "3 layers cannot fill 4 stages"),
        ((4, 3, "cpp", None), "3 layers cannot fill 4 stages"),
        ((2, 8, "vpp", [2, 2, 2, 3]), "sums to 9, but the model has 8"),
        ((2, 8, "vpp", [2, 2, 2]), "has 3 entries"),
        ((2, 8, "vpp", [4, -1, 3, 2]), "negative"),
        ((2, 8, "vpp", [4, 0, 2, 2]), "leaves a stage empty"),
        ((2, 8, "diagonal", None), "unknown layout kind 'diagonal'"),
    ],
)
def test_bad_layouts_name_the_value(args, fragment):
    with pytest.raises(LayoutError, match=None) as info:
        build_layout(*args)
    assert fragment in str(info.value)


@pytest.mark.parametrize("args, fix, fits", [
    ((100000, 8, "vpp", None), "the pp size is too large for 8 layers: use --pp 4 or less", (4, 8, "vpp", None)),
    ((4, 3, "cpp", None), "the pp size is too large for 3 layers: use --pp 3 or less", (3, 3, "cpp", None)),
    ((5, 9, "vpp", None, "fused"), "use --pp 4 or less", (4, 9, "vpp", None, "fused")),
    ((5, 8, "vpp", [1] * 9, "fused"), "use --pp 4 or less", (4, 8, "vpp", [2] + [1] * 6, "fused")),
    ((2, 3, "vpp", None), "the foldback layout needs a model of >= 4 layers (pp=2)", (2, 4, "vpp", None)),
], ids=["huge vpp", "cpp", "fused default split", "fused split given", "no pp fits"])
def test_too_few_layers_name_the_largest_pp_they_fill_not_a_model_of_the_pp(args, fix, fits):
    """A typo'd --pp 100000 once asked for a model of >= 200000 layers."""
    with pytest.raises(LayoutError) as info:
        build_layout(*args)
    assert str(info.value).endswith(fix) and "200000 layers" not in str(info.value)
    build_layout(*fits)  # the fix named fills


def test_too_few_layers_for_a_huge_pp_is_refused_before_any_stage_is_listed(monkeypatch):
    """``layout --pp 1000000000 --layers 8``: listing two billion stage ranks before finding that 8
    layers cannot fill them runs out of memory."""
    from sglang_vpp.schedule import layout as layout_module
    from sglang_vpp.schedule.layout import stage_count

    def listed(*_):
        raise AssertionError("stages listed before the layer count was checked")

    monkeypatch.setattr(layout_module, "_stage_ranks", listed)
    with pytest.raises(LayoutError, match="8 layers cannot fill 2000000000 stages"):
        build_layout(10**9, 8, "vpp")
    assert stage_count("vpp", 10**9) == 2 * 10**9 and stage_count("vpp", 10**9, "fused") == 2 * 10**9 - 1
    assert stage_count("cpp", 10**9) == 10**9


def test_a_mode_name_gives_its_policys_layout_and_an_unknown_kind_is_refused_by_name():
    from sglang_vpp.schedule.layout import stage_count
    from sglang_vpp.schedule.policies import POLICIES

    for name, policy in POLICIES.items():
        assert build_layout(2, 8, name).kind is policy.layout_kind, name
    for ask in (lambda: stage_count("vpp-stram", 2), lambda: build_layout(2, 8, "vpp-stram")):
        with pytest.raises(LayoutError, match="unknown layout kind 'vpp-stram'"):
            ask()
