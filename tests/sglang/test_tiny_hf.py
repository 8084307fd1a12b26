"""Tiny HF model directories: deterministic, loadable, validated requests."""

from __future__ import annotations

import json

import pytest
import torch

from sglang_vpp.models.tiny_hf import (
    PRESETS,
    TinyModelError,
    TinyModelSpec,
    build_tiny_model,
    load_transformers_model,
    train_tokenizer,
)


def test_bad_requests_are_refused_with_the_fix():
    with pytest.raises(TinyModelError, match="valid presets: qwen2-tiny"):
        TinyModelSpec("gpt-tiny")
    with pytest.raises(TinyModelError, match="vocab_size >= 10000"):
        TinyModelSpec(vocab_size=5000)
    with pytest.raises(TinyModelError, match="num_layers=0"):
        TinyModelSpec(num_layers=0)


def test_tokenizer_is_cached_and_large_enough():
    path = train_tokenizer()
    assert path == train_tokenizer()  # second call: the cache
    vocab = json.loads(path.read_text())["model"]["vocab"]
    assert len(vocab) >= 10000


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_and_runs(tmp_path, preset):
    spec = TinyModelSpec(preset, num_layers=2)
    model_dir = build_tiny_model(tmp_path / preset, spec)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] >= 10000
    model = load_transformers_model(model_dir)
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, 8]])).logits[0, -1]
    top2 = torch.topk(logits, 2).values
    assert top2[0] - top2[1] > 1e-3  # decisive greedy argmax (init std 0.2)


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    from safetensors.torch import load_file

    def weights(seed: int, name: str):
        spec = TinyModelSpec("llama-tiny", num_layers=1, seed=seed)
        return load_file(build_tiny_model(tmp_path / name, spec) / "model.safetensors")

    a, b, c = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_model_ships_a_chat_template(tmp_path):
    """/v1/chat/completions renders the messages with the tokenizer's chat template."""
    from transformers import AutoTokenizer

    model_dir = build_tiny_model(tmp_path / "chat", TinyModelSpec("qwen2-tiny", num_layers=1))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|user|>\nhello\n<|assistant|>\n"
