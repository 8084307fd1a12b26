"""``ModelSpec``: the shape numbers of a model that the analytic cost model needs.

Loaded from ``presets/models/<name>.json`` (``presets.py``); every number there carries its source.
Derived per-layer quantities (FLOPs per token, per query-key pair, bytes) are methods so the
cost model stays arithmetic on a handful of sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import PresetError
from .physical_ranges import check_ranges

__all__ = ["ModelSpec"]

_GQA_FIELDS = ("num_kv_heads", "head_dim")
_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_MOE_FIELDS = ("num_active_experts", "num_shared_experts", "expert_intermediate")
_DSA_FIELDS = ("indexer_heads", "indexer_head_dim")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    attention: str
    """``gqa`` (grouped-query) or ``mla`` (multi-head latent, run in MHA form for prefill)."""
    num_heads: int
    num_kv_heads: int = 0
    """GQA only."""
    head_dim: int = 0
    """GQA only."""
    q_lora_rank: int = 0
    """MLA: query compression rank (0: no compression)."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    first_dense_layers: int = 0
    """Leading layers with a dense FFN (DeepSeek ``first_k_dense_replace``); all of them for a
    dense model (``num_experts == 0``)."""
    dense_intermediate: int = 0
    num_experts: int = 0
    num_active_experts: int = 0
    num_shared_experts: int = 0
    expert_intermediate: int = 0
    sparse_top_k: int = 0
    """DSA sparse attention: keys attended per query (0: dense causal attention)."""
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    weight_bytes: float = 2.0
    activation_bytes: float = 2.0
    tp_collectives_per_layer: int = 2
    """Collectives per layer under tensor parallelism (after attention and after the FFN/MoE)."""
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attention not in ("gqa", "mla"):
            raise PresetError(f"model {self.name}: attention must be 'gqa' or 'mla', got {self.attention!r}")
        check_ranges(self, "models")
        if self.attention == "gqa" and (self.num_kv_heads < 1 or self.head_dim < 1):
            raise PresetError(f"model {self.name}: gqa needs num_kv_heads and head_dim")
        if self.attention == "mla" and min(self.kv_lora_rank, self.qk_nope_head_dim + self.qk_rope_head_dim,
                                           self.v_head_dim) < 1:
            raise PresetError(f"model {self.name}: mla needs kv_lora_rank, qk head dims and v_head_dim")
        if self.num_experts and not (0 < self.num_active_experts <= self.num_experts and self.expert_intermediate):
            raise PresetError(f"model {self.name}: MoE needs 0 < num_active_experts <= num_experts and "
                              "expert_intermediate")
        # Combinations the cost model would otherwise read silently: a layer without FFN, a
        # DSA model with a free indexer, heads that do not group, fields the model's kind never reads.
        if self.first_dense_layers > self.num_layers:
            raise PresetError(f"model {self.name}: first_dense_layers {self.first_dense_layers} is more than "
                              f"num_layers {self.num_layers}")
        if self.num_experts and self.first_dense_layers == self.num_layers:
            raise PresetError(f"model {self.name}: first_dense_layers {self.first_dense_layers} makes all "
                              f"num_layers {self.num_layers} dense, so num_experts {self.num_experts} is never read; "
                              "give the MoE layers (first_dense_layers < num_layers) or set num_experts 0")
        dense_layers = self.num_layers if not self.num_experts else self.first_dense_layers
        if dense_layers and not self.dense_intermediate:
            what = "a dense model" if not self.num_experts else f"first_dense_layers {self.first_dense_layers}"
            raise PresetError(f"model {self.name}: {what} needs dense_intermediate (the dense FFN width); "
                              "0 would give its dense layers no FFN")
        if self.attention == "gqa" and self.num_heads % self.num_kv_heads:
            raise PresetError(f"model {self.name}: gqa needs num_kv_heads to divide num_heads, got "
                              f"{self.num_kv_heads} and {self.num_heads}")
        # DSA is MLA's: the cost model prices its indexer weights on MLA's query path only.
        dsa = [name for name in ("sparse_top_k",) + _DSA_FIELDS if getattr(self, name)]
        if self.attention == "gqa" and dsa:
            raise PresetError(f"model {self.name}: {', '.join(dsa)} (DSA sparse attention) "
                              f"{'needs' if len(dsa) == 1 else 'need'} attention 'mla', got 'gqa'; drop "
                              f"{'it' if len(dsa) == 1 else 'them'} or set 0")
        unread = {f"{self.attention} attention": _MLA_FIELDS if self.attention == "gqa" else _GQA_FIELDS,
                  "a dense model (num_experts 0)": () if self.num_experts else _MOE_FIELDS,
                  "dense attention (sparse_top_k 0)": () if self.sparse_top_k else _DSA_FIELDS}
        for reason, fields in unread.items():
            given = [name for name in fields if getattr(self, name)]
            if given:
                raise PresetError(f"model {self.name}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} "
                                  f"not read for {reason}; drop {'it' if len(given) == 1 else 'them'} or set 0")
        if self.sparse_top_k and not (self.indexer_heads and self.indexer_head_dim):
            raise PresetError(f"model {self.name}: sparse_top_k (DSA) needs indexer_heads and indexer_head_dim")

    # ----------------------------------------------------------------- per layer
    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer >= self.first_dense_layers

    def attention_params(self) -> float:
        """Projection weights of one attention block (parameters)."""
        h, heads = self.hidden_size, self.num_heads
        if self.attention == "gqa":
            return h * self.head_dim * (2 * heads + 2 * self.num_kv_heads)
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * heads * qk if self.q_lora_rank else h * heads * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * h
        indexer = 0.0
        if self.sparse_top_k:
            q_in = self.q_lora_rank or h
            indexer = q_in * self.indexer_heads * self.indexer_head_dim + h * self.indexer_head_dim + h * self.indexer_heads
        return q + kv + kv_up + out + indexer

    def ffn_active_params(self, layer: int) -> float:
        """FFN weights a token multiplies with in ``layer`` (active experts only, router included)."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.dense_intermediate
        experts = self.num_active_experts + self.num_shared_experts
        return 3 * h * self.expert_intermediate * experts + h * self.num_experts

    def linear_flops_per_token(self, layer: int) -> float:
        return 2.0 * (self.attention_params() + self.ffn_active_params(layer))

    def attention_flops_per_pair(self) -> float:
        """FLOPs per (query, key) pair of one layer: QK^T plus PV over all heads."""
        if self.attention == "gqa":
            return 4.0 * self.num_heads * self.head_dim
        return 2.0 * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)

    def indexer_flops_per_pair(self) -> float:
        """DSA lightning indexer: scores every (query, prefix key) pair over its heads."""
        return 2.0 * self.indexer_heads * self.indexer_head_dim if self.sparse_top_k else 0.0

    def weight_bytes_per_chunk(self, layer: int, tokens: int) -> float:
        """Weight bytes one chunk of ``tokens`` reads in ``layer`` (MoE: experts any token hits)."""
        h = self.hidden_size
        attention = self.attention_params() * self.weight_bytes
        if not self.is_moe_layer(layer):
            return attention + 3 * h * self.dense_intermediate * self.weight_bytes
        touched = self.num_experts * (1.0 - (1.0 - self.num_active_experts / self.num_experts) ** tokens)
        experts = touched + self.num_shared_experts
        return attention + 3 * h * self.expert_intermediate * experts * self.weight_bytes

    def hidden_bytes_per_token(self) -> float:
        """Bytes of one token's hidden state: what a pipeline hop carries per token."""
        return self.hidden_size * self.activation_bytes
