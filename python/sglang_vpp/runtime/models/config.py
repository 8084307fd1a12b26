"""``ModelConfig``: the decoder shapes the runtime builds, read from a transformers config dict.

Data flow: a named tiny preset (``PRESETS``, a transformers-style config dict) or a local
Hugging Face directory's ``config.json`` -> ``ModelConfig.from_hf_dict`` -> ``StageModel`` (the
layers one rank owns) and the reference forward.

Supported ``model_type`` values and what each turns on:

- ``llama``, ``qwen2``: GQA attention with RoPE (qwen2: bias on q/k/v only).
- ``qwen3``: GQA with RMSNorm on each query and key head (``q_norm`` / ``k_norm``).
- ``qwen3_moe``: qwen3 attention plus routed experts (softmax router, top-k, optional
  renormalisation); layers listed in ``mlp_only_layers`` or off the ``decoder_sparse_step`` stay dense.
- ``deepseek_v3``: multi-head latent attention (MLA: low-rank q, a compressed KV latent plus one
  shared rotary key, both cached) and DeepSeek MoE (sigmoid scores, grouped top-k with a
  correction bias, a shared expert); the first ``first_k_dense_replace`` layers are dense.

Only the default RoPE type is supported; other ``rope_type`` values raise ``ModelConfigError``
instead of silently computing something else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelConfigError

__all__ = ["ARCHITECTURES", "PRESETS", "ModelConfig", "preset_config"]

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of one decoder-only model (names follow transformers)."""

    model_type: str
    """One of ``ARCHITECTURES``."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """Dense MLP width (also DeepSeek's dense layers)."""
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    """Per-head width for GQA attention (MLA uses the ``qk_*`` / ``v_head_dim`` fields)."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    """Qwen3: RMSNorm over each head of q and k before RoPE."""
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    # ---- routed experts (qwen3_moe, deepseek_v3)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # ---- deepseek_v3 only
    first_k_dense_replace: int = 0
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The source dict, kept for error messages and for saving a transformers config."""

    def __post_init__(self) -> None:
        if self.model_type not in ARCHITECTURES:
            raise ModelConfigError(
                f"model_type {self.model_type!r} is not supported by the reference runtime; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ModelConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        from ...sim.physical_ranges import PHYSICAL_RANGES

        most_layers = int(PHYSICAL_RANGES["models"]["num_layers"].high)
        if self.num_hidden_layers > most_layers:  # what --layers takes: a typo would build layers without end
            raise ModelConfigError(f"num_hidden_layers must be at most {most_layers}, got {self.num_hidden_layers}")
        if not (self.rope_theta > 0 and self.rms_norm_eps >= 0):
            raise ModelConfigError(f"rope_theta must be > 0 and rms_norm_eps >= 0, got {self.rope_theta} and "
                                   f"{self.rms_norm_eps}")
        if not self.is_mla and self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; GQA needs whole groups"
            )
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ModelConfigError(
                f"num_experts_per_tok={self.num_experts_per_tok} must lie in [1, num_experts="
                f"{self.num_experts}]"
            )
        if self.num_experts and self.decoder_sparse_step < 1:  # every step-th layer is routed: a modulus
            raise ModelConfigError(f"decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}")
        if self.is_mla and self.num_experts and self.num_experts % self.n_group:
            raise ModelConfigError(f"n_routed_experts={self.num_experts} must divide into n_group={self.n_group}")
        if self.is_mla and self.num_experts and not (self.num_experts // self.n_group >= 2
                                                     and 1 <= self.topk_group <= self.n_group):
            # The router scores a group by its best two experts, then keeps topk_group groups.
            raise ModelConfigError(
                f"n_group={self.n_group} and topk_group={self.topk_group} need at least 2 of the "
                f"n_routed_experts={self.num_experts} per group and 1 <= topk_group <= n_group")
        if self.rope_dim % 2:
            name = "qk_rope_head_dim" if self.is_mla else "head_dim"
            raise ModelConfigError(f"{name} must be even (RoPE rotates pairs of dimensions), got {self.rope_dim}")

    @property
    def is_mla(self) -> bool:
        return self.model_type == "deepseek_v3"

    @property
    def rope_dim(self) -> int:
        """Width of the rotary part of each query/key head."""
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    def is_moe_layer(self, layer_index: int) -> bool:
        if self.num_experts == 0:
            return False
        if self.model_type == "deepseek_v3":
            return layer_index >= self.first_k_dense_replace
        return layer_index not in self.mlp_only_layers and (layer_index + 1) % self.decoder_sparse_step == 0

    def with_layers(self, num_layers: int) -> ModelConfig:
        return dataclasses.replace(self, num_hidden_layers=num_layers)

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Read a transformers ``config.json`` dict; unknown keys are ignored."""
        if not isinstance(data, dict):
            raise ModelConfigError(f"config.json holds {type(data).__name__} {data!r:.60}, not the model's object "
                                   "of settings")
        model_type = data.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ModelConfigError(
                f"model_type {model_type!r} is not supported by the reference runtime; "
                f"supported: {', '.join(ARCHITECTURES)} (read from config.json)"
            )
        _check_rope(data)
        if data.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(
                f"hidden_act={data['hidden_act']!r} is not supported by the reference runtime (SwiGLU with silu only)"
            )
        try:
            hidden = _int(data, "hidden_size")
            heads = _int(data, "num_attention_heads")
            if heads < 1:  # the head_dim default divides by it
                raise ModelConfigError(f"num_attention_heads must be >= 1, got {heads}")
            common: dict[str, Any] = dict(
                model_type=model_type,
                vocab_size=_int(data, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_int(data, "intermediate_size"),
                num_hidden_layers=_int(data, "num_hidden_layers"),
                num_attention_heads=heads,
                num_key_value_heads=_int(data, "num_key_value_heads", heads, if_falsy=True),
                head_dim=_int(data, "head_dim", hidden // heads, if_falsy=True),
                rms_norm_eps=_float(data, "rms_norm_eps", 1e-6),
                rope_theta=_float({"rope_theta": _rope_theta(data)}, "rope_theta", None),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
                initializer_range=_float(data, "initializer_range", 0.02),
                extra=dict(data),
            )
        except KeyError as missing:
            raise ModelConfigError(f"config.json lacks the required key {missing}") from None
        bias = bool(data.get("attention_bias", False))
        if model_type == "qwen2":
            common.update(qkv_bias=True, o_bias=False)
        else:
            common.update(qkv_bias=bias, o_bias=bias)
        if model_type in ("qwen3", "qwen3_moe"):
            common["qk_norm"] = True
        if model_type == "qwen3_moe":
            common.update(
                num_experts=_num_experts(data),
                num_experts_per_tok=_int(data, "num_experts_per_tok", 0),
                moe_intermediate_size=_int(data, "moe_intermediate_size", 0),
                norm_topk_prob=bool(data.get("norm_topk_prob", False)),
                decoder_sparse_step=_int(data, "decoder_sparse_step", 1),
                mlp_only_layers=tuple(int(i) for i in data.get("mlp_only_layers") or ()),
            )
        if model_type == "deepseek_v3":
            q_lora = data.get("q_lora_rank")
            common.update(
                num_key_value_heads=heads,
                num_experts=_num_experts(data),
                num_experts_per_tok=_int(data, "num_experts_per_tok", 0),
                moe_intermediate_size=_int(data, "moe_intermediate_size", 0),
                norm_topk_prob=bool(data.get("norm_topk_prob", True)),
                first_k_dense_replace=_int(data, "first_k_dense_replace", 0),
                n_shared_experts=_int(data, "n_shared_experts", 0),
                n_group=_int(data, "n_group", 1, if_falsy=True),
                topk_group=_int(data, "topk_group", 1, if_falsy=True),
                routed_scaling_factor=_float(data, "routed_scaling_factor", 1.0),
                q_lora_rank=_int(data, "q_lora_rank") if q_lora is not None else None,
                kv_lora_rank=_int(data, "kv_lora_rank"),
                qk_rope_head_dim=_int(data, "qk_rope_head_dim"),
                qk_nope_head_dim=_int(data, "qk_nope_head_dim"),
                v_head_dim=_int(data, "v_head_dim"),
                rope_interleave=bool(data.get("rope_interleave", True)),
            )
        return cls(**common)

    def to_hf_dict(self) -> dict[str, Any]:
        """A transformers config dict for this model (used to build the same model there)."""
        out: dict[str, Any] = dict(
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            initializer_range=self.initializer_range,
            max_position_embeddings=max(131072, int(self.extra.get("max_position_embeddings", 0))),
        )
        if self.model_type != "qwen2":
            out["attention_bias"] = self.o_bias
        if not self.is_mla:
            out["head_dim"] = self.head_dim
        if self.model_type == "qwen3_moe":
            out.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.decoder_sparse_step,
                mlp_only_layers=list(self.mlp_only_layers),
            )
        if self.is_mla:
            out.update(
                n_routed_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                first_k_dense_replace=self.first_k_dense_replace,
                n_shared_experts=self.n_shared_experts,
                n_group=self.n_group,
                topk_group=self.topk_group,
                routed_scaling_factor=self.routed_scaling_factor,
                q_lora_rank=self.q_lora_rank,
                kv_lora_rank=self.kv_lora_rank,
                qk_rope_head_dim=self.qk_rope_head_dim,
                qk_nope_head_dim=self.qk_nope_head_dim,
                v_head_dim=self.v_head_dim,
                rope_interleave=self.rope_interleave,
            )
        return out


_REQUIRED = object()


def _number(data: dict[str, Any], key: str, default: Any, if_falsy: bool, kind: type) -> Any:
    """``data[key]`` as ``kind`` (``default`` when absent, or when falsy with ``if_falsy``);
    ModelConfigError naming the key for a value that is not a finite number of that kind (a
    bare ``int(None)`` or ``int(inf)`` names neither the key nor the file)."""
    value = data.get(key, default) if default is not _REQUIRED else data[key]
    if if_falsy and not value:
        value = default
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or number != number or number in (float("inf"), float("-inf")) or (
            kind is int and number != int(number)):
        what = "a whole number" if kind is int else "a finite number"
        raise ModelConfigError(f"config.json {key} is {value!r}, not {what}")
    return kind(number)


def _int(data: dict[str, Any], key: str, default: Any = _REQUIRED, if_falsy: bool = False) -> int:
    return _number(data, key, default, if_falsy, int)


def _float(data: dict[str, Any], key: str, default: Any = _REQUIRED) -> float:
    return _number(data, key, default, False, float)


def _num_experts(data: dict[str, Any]) -> int:
    # transformers 5 writes ``num_local_experts`` (its attribute map aliases the model's own name).
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        if data.get(key):
            return _int(data, key)
    return 0


def _rope_theta(data: dict[str, Any]) -> float:
    params = data.get("rope_parameters") or {}
    return params.get("rope_theta", data.get("rope_theta", 10000.0))


def _check_rope(data: dict[str, Any]) -> None:
    for key in ("rope_parameters", "rope_scaling"):
        params = data.get(key) or {}
        if not isinstance(params, dict):
            raise ModelConfigError(f"config.json {key} is {params!r}, not an object of RoPE parameters")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ("default", None):
            raise ModelConfigError(
                f"{key}.rope_type={rope_type!r} is not supported by the reference runtime (only the "
                "default RoPE); use a checkpoint with default RoPE or remove the scaling for tests"
            )


# Tiny presets: hidden 64, 8 layers (enough for P = 4 fold-back: 8 virtual stages), a small
# vocabulary so that logits stay cheap. initializer_range 0.2 keeps attention non-uniform, so a
# wrong mask or a wrong prefix changes the output visibly (std 0.02 would hide it).
_TINY_COMMON: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    max_position_embeddings=131072,
    tie_word_embeddings=False,
    initializer_range=0.2,
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny-qwen3": dict(_TINY_COMMON, model_type="qwen3"),
    "tiny-llama": dict(_TINY_COMMON, model_type="llama"),
    "tiny-qwen3-moe": dict(
        _TINY_COMMON,
        model_type="qwen3_moe",
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
    "tiny-deepseek": dict(
        _TINY_COMMON,
        model_type="deepseek_v3",
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        rope_interleave=True,
    ),
}


def preset_config(name: str, num_layers: int | None = None) -> ModelConfig:
    """The ``ModelConfig`` of a named tiny preset (optionally with another layer count)."""
    if name not in PRESETS:
        raise ModelConfigError(
            f"unknown model {name!r}: not a preset and not a directory; presets: {', '.join(PRESETS)}, "
            "or pass --model PATH to a local Hugging Face model directory"
        )
    data = dict(PRESETS[name])
    if num_layers is not None:
        data["num_hidden_layers"] = num_layers
    return ModelConfig.from_hf_dict(data)
