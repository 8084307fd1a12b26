"""Single-process model tests: the reference forward is right (vs transformers, vs whole-prompt),
ranks build exactly their share, model errors are clear. No processes; seconds."""

from __future__ import annotations

import json

import pytest
import torch
from sglang_vpp.runtime.errors import ModelConfigError, ModelPathError
from sglang_vpp.runtime.models import (
    PRESETS,
    KVCache,
    StageModel,
    full_model,
    materialize,
    resolve_model,
    save_checkpoint,
)
from sglang_vpp.runtime.models.layers import chunk_mask
from sglang_vpp.runtime.reference import (RequestOutput, max_abs_diff, prompt_tokens, reference_forward,
                                          within_fp32_rounding)
from sglang_vpp.schedule import ChunkSpec, build_layout

RUNTIME_PRESETS = ["tiny-qwen3", "tiny-llama", "tiny-qwen3-moe", "tiny-deepseek"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_presets_are_listed():
    assert set(RUNTIME_PRESETS) <= set(PRESETS)


@pytest.mark.parametrize("preset", RUNTIME_PRESETS)
@pytest.mark.parametrize("length,chunk", [(150, 32), (150, 50), (96, 96), (97, 48)])
def test_chunked_equals_whole_prompt(preset, length, chunk):
    """Chunks attending to a KV prefix through the explicit mask equal one causal forward."""
    source = resolve_model(preset)
    whole = reference_forward(source, [length, length // 2], None).outputs
    chunked = reference_forward(source, [length, length // 2], chunk).outputs
    diff = max_abs_diff(chunked, whole)
    assert within_fp32_rounding(diff, *(t for o in whole for t in (o.hidden, o.logits))), diff


def test_wrong_mask_would_be_caught():
    """The oracle can fail: top-left causal alignment (``is_causal=True``) against a prefix differs."""
    mask = chunk_mask(start=4, num_tokens=3)
    assert mask.tolist() == [
        [True, True, True, True, True, False, False],
        [True, True, True, True, True, True, False],
        [True, True, True, True, True, True, True],
    ]
    top_left = torch.ones(3, 7, dtype=torch.bool).tril()
    assert not torch.equal(mask, top_left)


def test_later_tokens_do_not_change_earlier_outputs():
    source = resolve_model("tiny-qwen3")
    model = full_model(source)
    tokens = prompt_tokens(0, 64, source.config.vocab_size)
    changed = tokens.clone()
    changed[40:] = (changed[40:] + 1) % source.config.vocab_size
    outs = []
    for toks in (tokens, changed):
        kv = KVCache(1).for_stage(0, 0, 64)
        with torch.inference_mode():
            outs.append(model.forward_stage(toks, ChunkSpec(0, 0, 0, 64, True), 0, 8, kv, True, True).hidden)
    assert torch.equal(outs[0][:40], outs[1][:40])
    assert not torch.allclose(outs[0][40:], outs[1][40:])


@pytest.mark.parametrize("preset", RUNTIME_PRESETS)
def test_reference_matches_transformers(preset, tmp_path):
    transformers = pytest.importorskip("transformers")
    source = resolve_model(preset)
    save_checkpoint(full_model(source), tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ours = reference_forward(source, [120], 40).outputs[0]
    tokens = prompt_tokens(0, 120, source.config.vocab_size)
    with torch.no_grad():
        hidden = hf.model(tokens[None]).last_hidden_state[0]
        logits = hf.lm_head(hidden)[-1]
    assert within_fp32_rounding((hidden - ours.hidden).abs().max().item(), hidden)
    assert within_fp32_rounding((logits - ours.logits).abs().max().item(), logits)
    # And the directory loads back into the runtime with the same result (HF weight names).
    again = reference_forward(resolve_model(str(tmp_path)), [120], 40).outputs
    assert max_abs_diff(again, [ours]) == 0.0


def test_tiny_hf_directory_matches_transformers():
    """A checkpoint written by transformers itself (its own init and names) through --model PATH."""
    transformers = pytest.importorskip("transformers")
    tiny_hf = pytest.importorskip("sglang_vpp.models.tiny_hf")
    path = tiny_hf.cached_tiny_model(tiny_hf.TinyModelSpec("qwen3-moe-tiny", num_layers=4))
    source = resolve_model(str(path))
    ours = reference_forward(source, [70], 32).outputs[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = hf.model(prompt_tokens(0, 70, source.config.vocab_size)[None]).last_hidden_state[0]
    assert within_fp32_rounding((hidden - ours.hidden).abs().max().item(), hidden)


@pytest.mark.parametrize("kind,ranks", [("contiguous", 2), ("foldback", 2), ("foldback", 4)])
def test_each_rank_materialises_only_its_share(kind, ranks):
    source = resolve_model("tiny-qwen3")
    layout = build_layout(ranks, 8, kind)
    full = dict(full_model(source).state_dict())
    seen_layers: set[int] = set()
    for rank in range(ranks):
        stages = [layout.stages[s] for s in layout.stages_of(rank)]
        part = materialize(source, stages, layout.num_stages)
        owned = {i for s in stages for i in range(s.layer_start, s.layer_end)}
        layers = {int(name.split(".")[2]) for name in part.state_dict() if name.startswith("model.layers.")}
        assert layers == owned
        assert seen_layers.isdisjoint(owned)
        seen_layers |= owned
        assert part.has_embedding == (0 in layout.stages_of(rank))
        assert part.has_head == (layout.last_stage in layout.stages_of(rank))
        for name, tensor in part.state_dict().items():
            assert torch.equal(tensor, full[name]), name  # seeded per parameter name
    assert seen_layers == set(range(8))
    if kind == "foldback":  # rank 0 holds both ends of the V
        first = materialize(source, [layout.stages[s] for s in layout.stages_of(0)], layout.num_stages)
        assert first.has_embedding and first.has_head


def test_kv_cache_refuses_out_of_order_chunks():
    source = resolve_model("tiny-qwen3")
    model = StageModel(source.config, [0], True, False)
    kv = KVCache(1).for_stage(0, 0, 64)
    tokens = prompt_tokens(0, 64, source.config.vocab_size)
    with torch.inference_mode(), pytest.raises(AssertionError, match="chunk starts at 32"):
        model.forward_stage(tokens[32:], ChunkSpec(0, 1, 32, 32, True), 0, 1, kv, True, False)


def test_bad_model_paths(tmp_path):
    with pytest.raises(ModelPathError, match="not a directory"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["tiny-qwen3"]))
    with pytest.raises(ModelPathError, match="no \\*.safetensors"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelPathError, match="cannot read config.json"):
        resolve_model(str(tmp_path))


def test_unknown_preset_and_architecture(tmp_path):
    with pytest.raises(ModelConfigError, match="presets: tiny-qwen3"):
        resolve_model("tiny-gpt17")
    bad = dict(PRESETS["tiny-qwen3"], model_type="mamba")
    (tmp_path / "config.json").write_text(json.dumps(bad))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelConfigError, match="model_type 'mamba' is not supported"):
        resolve_model(str(tmp_path))
    scaled = dict(PRESETS["tiny-qwen3"], rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    with pytest.raises(ModelConfigError, match="rope_type='yarn' is not supported"):
        resolve_model(str(tmp_path))


def test_checkpoint_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    source = resolve_model("tiny-qwen3", num_layers=2)
    save_checkpoint(full_model(source), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.q_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelPathError, match="model.layers.1.self_attn.q_proj.weight"):
        full_model(resolve_model(str(tmp_path)))


@pytest.mark.parametrize("preset", RUNTIME_PRESETS)
def test_batched_forward_equals_one_sequence_per_forward(preset):
    """Several sequences in one forward, attention per sequence: every request's outputs equal
    its own forwards to float rounding (the matmul shapes differ), so no request sees another."""
    source = resolve_model(preset)
    lengths = [100, 20, 33, 7]
    # Request 0 in two chunks, the last carrying the three short requests whole.
    chunks = [ChunkSpec(0, 0, 0, 64), ChunkSpec(0, 1, 64, 36, True,
                                                batch=(ChunkSpec(1, 0, 0, 20, True), ChunkSpec(2, 0, 0, 33, True),
                                                       ChunkSpec(3, 0, 0, 7, True)))]
    batched = reference_forward(source, lengths, chunks=chunks).outputs
    alone = reference_forward(source, lengths, 64).outputs
    diff = max_abs_diff(batched, alone)
    assert within_fp32_rounding(diff, *(t for o in alone for t in (o.hidden, o.logits))), diff
    assert [o.hidden.shape[0] for o in batched] == lengths


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-deepseek"])
def test_executor_runs_batched_forwards_as_the_reference(preset):
    """One rank (no comm) executing a plan with batched forwards: bit-identical to the reference
    running the same forwards; the pipelined runs are in test_pipeline.py (slow)."""
    from sglang_vpp.runtime.control import StaticFeed
    from sglang_vpp.runtime.executor import RankExecutor
    from sglang_vpp.schedule import build_schedule

    source = resolve_model(preset)
    lengths = [100, 20, 33, 7]
    schedule = build_schedule("cpp", 1, source.config.num_hidden_layers, lengths, 64, batching=True)
    assert any(chunk.batch for chunk in schedule.chunks)
    model = materialize(source, schedule.layout.stages, schedule.layout.num_stages)
    executor = RankExecutor(0, schedule.layout, model, None, StaticFeed(0, schedule), schedule.comm_semantics)
    executor.run()
    got = [RequestOutput(k, h, l) for k, (h, l) in sorted(executor.final_outputs().items())]
    want = reference_forward(source, lengths, chunks=schedule.chunks).outputs
    assert max_abs_diff(got, want) == 0.0


@pytest.mark.parametrize("edit,message", [
    (None, "config.json holds list [], not the model's object of settings"),
    ({"hidden_size": None}, "config.json hidden_size is None, not a whole number"),
    ({"num_hidden_layers": float("inf")}, "config.json num_hidden_layers is inf, not a whole number"),
    ({"vocab_size": 1.5}, "config.json vocab_size is 1.5, not a whole number"),
    ({"num_attention_heads": 0}, "num_attention_heads must be >= 1, got 0"),
    ({"num_key_value_heads": -1}, "num_key_value_heads must be >= 1, got -1"),
    ({"intermediate_size": 0}, "intermediate_size must be >= 1, got 0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_theta must be > 0"),
    ({"rope_scaling": "yarn"}, "config.json rope_scaling is 'yarn', not an object of RoPE parameters"),
    ({"num_hidden_layers": 10**30}, "num_hidden_layers must be at most 4096"),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "decoder_sparse_step": 0}, "decoder_sparse_step must be >= 1, got 0"),
    ({"head_dim": 7}, "head_dim must be even (RoPE rotates pairs of dimensions), got 7"),
    ({**PRESETS["tiny-deepseek"], "qk_rope_head_dim": 7}, "qk_rope_head_dim must be even"),
    ({**PRESETS["tiny-deepseek"], "topk_group": 3}, "n_group=2 and topk_group=3 need at least 2"),
    ({**PRESETS["tiny-deepseek"], "n_group": 8}, "n_group=8 and topk_group=1 need at least 2"),
], ids=["not an object", "size null", "layers inf", "vocab fraction", "no heads", "negative kv heads",
        "no mlp", "rope theta 0", "rope_scaling text", "layers huge", "moe step 0", "odd head_dim",
        "odd rope dim", "topk_group past n_group", "one expert per group"])
def test_a_malformed_config_json_is_a_model_error_naming_the_key(tmp_path, edit, message):
    """Unchecked, these were a TypeError, OverflowError, ZeroDivisionError or AttributeError
    traceback, or a rank process that died building 10**30 layers."""
    config = [] if edit is None else {**PRESETS["tiny-qwen3"], **edit}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelPathError) as error:
        resolve_model(str(tmp_path))
    assert message in str(error.value) and str(error.value).startswith(f"--model {tmp_path}: ")


def test_unreadable_weights_or_another_models_config_are_refused_before_any_work(tmp_path):
    """A corrupt weights file failed only in the rank processes after they started; a config.json
    with another model's sizes built those sizes first (a 2**40-wide layer: out of memory)."""
    source = resolve_model("tiny-qwen3", num_layers=2)
    save_checkpoint(full_model(source), tmp_path)
    assert resolve_model(str(tmp_path)).config.num_hidden_layers == 2
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 2**40}))
    with pytest.raises(ModelPathError, match=r"holds model.embed_tokens.weight of shape \[512, 64\], but config.json "
                       r"gives \[vocab_size, hidden_size\] \[512, 1099511627776\]"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelPathError, match="model.safetensors is not a readable safetensors file"):
        resolve_model(str(tmp_path))
