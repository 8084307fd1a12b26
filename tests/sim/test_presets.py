"""Presets are data with a source for every number; unknown names list the valid ones."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from sglang_vpp.sim import PresetError
from sglang_vpp.sim.preset_loader import list_hardware, list_models, load_hardware, load_model


def test_expected_presets_exist():
    assert {"qwen3-coder-30b-a3b", "deepseek-v3.1", "glm-5.2", "qwen3-tiny", "qwen3-moe-tiny"} <= set(list_models())
    assert {"ascend-910c", "h200", "cpu"} <= set(list_hardware())


@pytest.mark.parametrize("kind", ["models", "hardware"])
def test_every_number_has_a_source(kind):
    folder = resources.files("sglang_vpp.sim") / "presets" / kind
    for path in folder.iterdir():
        data = json.loads(path.read_text())
        for key, entry in data.items():
            if key.startswith("_") or key == "name":
                continue
            assert isinstance(entry, dict) and entry.get("source"), f"{path.name}: {key} has no source"


def test_presets_load_and_match_the_method_doc():
    ds = load_model("deepseek-v3.1")
    assert (ds.num_layers, ds.hidden_size, ds.num_heads, ds.num_experts, ds.expert_intermediate) == (61, 7168, 128, 256, 2048)
    qwen = load_model("qwen3-coder-30b-a3b")
    assert (qwen.num_layers, qwen.num_kv_heads, qwen.num_experts, qwen.num_active_experts) == (48, 4, 128, 8)
    assert load_model("glm-5.2").sparse_top_k == 2048
    # Active parameters from the shapes land near the published counts (37B, 3.3B).
    active = lambda m: sum(m.linear_flops_per_token(l) for l in range(m.num_layers)) / 2e9  # noqa: E731
    assert 30 < active(ds) < 40
    assert 2.0 < active(qwen) < 3.5
    assert load_hardware("ascend-910c").tp_size == 8


def test_unknown_preset_lists_valid_names():
    with pytest.raises(PresetError, match="valid: .*deepseek-v3.1"):
        load_model("llama-9000")
    with pytest.raises(PresetError, match="valid: .*ascend-910c"):
        load_hardware("tpu")


def test_user_preset_file(tmp_path):
    path = tmp_path / "hw.json"
    data = json.loads((resources.files("sglang_vpp.sim") / "presets" / "hardware" / "h200.json").read_text())
    data["peak_flops"] = 1.0e15  # plain numbers are accepted in user files
    path.write_text(json.dumps(data))
    assert load_hardware(str(path)).peak_flops == 1.0e15
    data["warp_speed"] = 9
    path.write_text(json.dumps(data))
    with pytest.raises(PresetError, match="unknown fields"):
        load_hardware(str(path))


def _shipped(kind: str, name: str) -> dict:
    return json.loads((resources.files("sglang_vpp.sim") / "presets" / kind / f"{name}.json").read_text())


@pytest.mark.parametrize("loader,kind,name,field,value,message", [
    (load_model, "models", "qwen3-tiny", "num_layers", 2.5, "num_layers is 2.5, not a whole number in [1, 4096]"),
    (load_model, "models", "qwen3-tiny", "num_layers", "x", "num_layers is 'x', not a whole number"),
    (load_hardware, "hardware", "cpu", "pp_latency_s", -1, "pp_latency_s is -1, not a finite number in [0, 1] (seconds)"),
    (load_hardware, "hardware", "cpu", "layer_overhead_s", -1e-3, "layer_overhead_s is -0.001, not a finite"),
    (load_hardware, "hardware", "cpu", "tp_size", True, "tp_size is True, not a whole number"),
    # Zeros that make no physical sense: a hop carrying no tensor, weights of no bytes, no bandwidth.
    (load_hardware, "hardware", "cpu", "pp_tensors", 0, "pp_tensors is 0, not a whole number in [1, 16] "
     "(hidden-size tensors a pipeline hop carries per token)"),
    (load_model, "models", "qwen3-tiny", "weight_bytes", 0, "weight_bytes is 0, not a finite number in (0, 8] "
     "(bytes per value)"),
    (load_model, "models", "qwen3-tiny", "activation_bytes", -2, "activation_bytes is -2, not a finite number in (0, 8]"),
    (load_hardware, "hardware", "cpu", "half_efficiency_tokens", -1, "half_efficiency_tokens is -1, not a finite"),
    (load_hardware, "hardware", "cpu", "chunk_overhead_s", 3600, "chunk_overhead_s is 3600, not a finite number in [0, 1]"),
    (load_hardware, "hardware", "cpu", "tp_size", 0, "tp_size is 0, not a whole number in [1, 65536]"),
    # Near 0 they divide work into times that overflow to inf (which the planner cannot place)
    # or into 1e300-second rows.
    (load_hardware, "hardware", "cpu", "peak_flops", 1e-300, "peak_flops is 1e-300, not a finite number in [1, 1e+18]"),
    (load_hardware, "hardware", "cpu", "pp_bytes_per_s", 1e-300, "pp_bytes_per_s is 1e-300, not a finite number in [1, "),
    (load_hardware, "hardware", "cpu", "attention_efficiency", 1e-300, "attention_efficiency is 1e-300, not a finite "
     "number in [0.001, 1] (a share of peak)"),
    (load_hardware, "hardware", "cpu", "hbm_bytes_per_s", 0, "hbm_bytes_per_s is 0, not a finite number in [1, 1e+18]"),
    (load_model, "models", "qwen3-tiny", "num_layers", 10**9, "num_layers is 1000000000, not a whole number in [1, 4096]"),
    (load_model, "models", "qwen3-tiny", "attention", 5, "attention is 5, not a string"),
])
def test_a_user_preset_field_of_the_wrong_kind_or_out_of_range_is_refused(tmp_path, loader, kind, name, field, value,
                                                                          message):
    """A negative latency or overhead would print negative times, a fractional layer count lay out
    2.5 layers, pp_tensors 0 or weight_bytes 0 make hops or weights free. The message names the
    file, the field and the range."""
    data = _shipped(kind, name)
    data[field] = value
    path = tmp_path / "preset.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PresetError, match=re.escape(f"preset {str(path)!r}: {message}")):
        loader(str(path))


def test_every_numeric_preset_field_has_a_physical_range():
    import dataclasses

    from sglang_vpp.sim.hardware_spec import HardwareSpec
    from sglang_vpp.sim.model_spec import ModelSpec
    from sglang_vpp.sim.preset_loader import PHYSICAL_RANGES

    for cls, kind in ((ModelSpec, "models"), (HardwareSpec, "hardware")):
        numeric = {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float", "float | None")}
        assert numeric == set(PHYSICAL_RANGES[kind]), (kind, numeric ^ set(PHYSICAL_RANGES[kind]))


@pytest.mark.parametrize(("loader", "field", "value", "message"), [
    (load_hardware, "tp_latency_s", -1.0, "tp_latency_s is -1.0, not a finite number in [0, 1] (seconds)"),
    (load_hardware, "pp_tensors", 0, "pp_tensors is 0, not a whole number in [1, 16]"),
    (load_hardware, "linear_efficiency", float("nan"), "linear_efficiency is nan, not a finite number in [0.001, 1]"),
    (load_model, "num_layers", 5000, "num_layers is 5000, not a whole number in [1, 4096] (decoder layers)"),
    (load_model, "weight_bytes", 0.0, "weight_bytes is 0.0, not a finite number in (0, 8]"),
])
def test_a_spec_built_in_code_is_held_to_the_preset_ranges(loader, field, value, message):
    """A spec made in code (``dataclasses.replace``, as calibration does) meets the ranges a
    preset file does: one table, ``PHYSICAL_RANGES``, for both."""
    import dataclasses

    spec = loader("h200" if loader is load_hardware else "qwen3-tiny")
    with pytest.raises(PresetError, match=re.escape(f"{spec.name}: {message}")):
        dataclasses.replace(spec, **{field: value})


def test_a_preset_path_that_is_missing_a_folder_or_not_an_object_is_refused(tmp_path):
    with pytest.raises(PresetError, match="does not exist"):
        load_model(str(tmp_path / "missing.json"))
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(PresetError, match="cannot be read"):
        load_model(str(tmp_path / "folder.json"))
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(PresetError, match="holds list, not a JSON object"):
        load_hardware(str(tmp_path / "list.json"))


@pytest.mark.parametrize("name,changes,message", [
    # A layer without FFN: the model would run at a fraction of its compute, silently.
    ("qwen3-coder-30b-a3b", {"num_experts": 0, "num_active_experts": 0, "num_shared_experts": 0,
                             "expert_intermediate": 0}, "a dense model needs dense_intermediate"),
    ("qwen3-coder-30b-a3b", {"first_dense_layers": 2}, "first_dense_layers 2 needs dense_intermediate"),
    ("qwen3-coder-30b-a3b", {"first_dense_layers": 49}, "first_dense_layers 49 is more than num_layers 48"),
    # A MoE model with no MoE layer: nothing reads its expert fields.
    ("qwen3-coder-30b-a3b", {"first_dense_layers": 48, "dense_intermediate": 6144},
     "first_dense_layers 48 makes all num_layers 48 dense, so num_experts 128 is never read"),
    ("qwen3-moe-tiny", {"first_dense_layers": 4, "dense_intermediate": 64},
     "first_dense_layers 4 makes all num_layers 4 dense, so num_experts 8 is never read"),
    # A DSA model whose indexer costs nothing.
    ("glm-5.2", {"indexer_heads": 0}, "sparse_top_k (DSA) needs indexer_heads and indexer_head_dim"),
    ("qwen3-tiny", {"num_kv_heads": 3}, "gqa needs num_kv_heads to divide num_heads, got 3 and 4"),
    ("qwen3-tiny", {"num_kv_heads": 8}, "gqa needs num_kv_heads to divide num_heads, got 8 and 4"),
    # Fields the model's kind never reads: the user believes they set something.
    ("qwen3-tiny", {"kv_lora_rank": 512}, "kv_lora_rank is not read for gqa attention; drop it or set 0"),
    ("deepseek-v3.1", {"num_kv_heads": 8, "head_dim": 128}, "num_kv_heads, head_dim are not read for mla attention"),
    ("qwen3-tiny", {"num_active_experts": 2}, "num_active_experts is not read for a dense model (num_experts 0)"),
    ("deepseek-v3.1", {"indexer_heads": 64}, "indexer_heads is not read for dense attention (sparse_top_k 0)"),
    # DSA is MLA's: unchecked, a gqa model with its fields is priced with a sparse attention it does not have.
    ("qwen3-tiny", {"sparse_top_k": 2048, "indexer_heads": 64, "indexer_head_dim": 128},
     "sparse_top_k, indexer_heads, indexer_head_dim (DSA sparse attention) need attention 'mla', got 'gqa'"),
    ("qwen3-coder-30b-a3b", {"sparse_top_k": 2048}, "sparse_top_k (DSA sparse attention) needs attention 'mla', got 'gqa'"),
    ("qwen3-tiny", {"indexer_heads": 64}, "indexer_heads (DSA sparse attention) needs attention 'mla', got 'gqa'"),
])
def test_model_fields_that_do_not_combine_are_refused(tmp_path, name, changes, message):
    data = _shipped("models", name)
    data.update(changes)
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PresetError, match=re.escape(f"model {data['name']}: {message}")):
        load_model(str(path))


def test_the_revisit_defaults_to_a_whole_iteration_and_may_not_exceed_it():
    import dataclasses

    hw = load_hardware("ascend-910c")
    assert 0 < hw.revisit_overhead_s < hw.chunk_overhead_s
    fields = {f.name: getattr(hw, f.name) for f in dataclasses.fields(hw) if f.init}
    unset = type(hw)(**{**fields, "revisit_overhead_s": None})
    assert unset.revisit_overhead_s == hw.chunk_overhead_s  # a preset written without it: every forward pays an iteration
    with pytest.raises(PresetError, match=r"revisit_overhead_s is 0.006, above chunk_overhead_s 0.005"):
        type(hw)(**{**fields, "revisit_overhead_s": 0.006})
