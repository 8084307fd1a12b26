"""Decoder building blocks for chunked prefill: norms, RoPE, GQA and MLA attention, dense and MoE MLPs.

A forward carries one or more sequences, as SGLang's prefill batches do: ``x`` is ``[n, hidden]``,
the rows of each sequence's chunk one after another (no batch dimension). Token-wise modules
(norms, projections, MLPs, MoE) run on all ``n`` rows at once; attention runs per sequence
(``Segment``: its rows, positions, mask and its request's KV cache for the layer,
``kv_cache.LayerKV``), so no sequence attends over another's tokens. Parameter names mirror transformers (``self_attn.q_proj``,
``mlp.experts.3.up_proj``, ...) so a Hugging Face ``state_dict`` loads unchanged.

The arithmetic follows the transformers implementations operation by operation (RMSNorm in fp32,
``rotate_half`` RoPE or DeepSeek's interleaved pairs, HF's MoE loops) so that the reference
forward agrees with transformers to float rounding.

[Note: chunk causal mask]
A chunk of ``c`` tokens starting at prefix length ``L`` attends to keys ``0 .. L+c-1``: query
``i`` sees key ``j`` iff ``j <= L + i``. ``is_causal=True`` in ``scaled_dot_product_attention``
aligns the triangle top-left, which is wrong whenever ``L > 0`` (the chunk would not see most of
its prefix); so the mask is built explicitly (``chunk_mask``) and passed as ``attn_mask``.

Except for a request's first chunk (``L = 0``): there the pattern *is* the top-left triangle and
``is_causal=True`` lets the CPU flash kernel skip the masked blocks. Measured on this CPU
(``benchmarks/attention_mask.py``: fp32, one thread, 64-2048-token chunks, prefixes 0-14K):

- ``L = 0``: ``is_causal`` took 0.37-0.73x the explicit mask's time, output bitwise equal;
- ``L > 0``: ``torch.nn.attention.bias.causal_lower_right`` expresses the offset, but on CPU it
  materializes a mask of its own and took 0.8-1.5x the explicit mask's time, so the explicit
  mask stays. The explicit-mask kernel costs the same per query-key pair at every chunk size
  (7-12 ns): a chunk pays for its whole ``c x (L + c)`` block, masked half of the diagonal
  included, which GPU flash kernels skip.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dataclasses import dataclass

from .config import ModelConfig
from .kv_cache import LayerKV, StageKV

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "DeepseekMoeBlock",
    "LatentAttention",
    "Qwen3MoeBlock",
    "RMSNorm",
    "RopeTables",
    "Segment",
    "chunk_mask",
    "rope_tables",
]

RopeTables = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Segment:
    """One sequence of a forward: rows ``rows`` of ``x``, tokens from position ``start``."""

    rows: slice
    start: int
    rope: RopeTables
    mask: torch.Tensor | None
    kv: StageKV


class RMSNorm(nn.Module):
    """transformers' RMSNorm: normalise in fp32, scale by ``weight`` in the input dtype."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


def rope_tables(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> RopeTables:
    """cos/sin ``[c, dim]`` for absolute ``positions`` (default RoPE, as transformers builds them)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
    """``x``: ``[heads, c, d]``; rotate-half layout (Llama, Qwen)."""
    cos, sin = rope
    return x * cos + _rotate_half(x) * sin


def apply_rope_interleaved(x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
    """DeepSeek's interleaved pairs ``(x0, x1), (x2, x3), ...``; output in rotate-half layout,
    exactly as transformers' ``apply_rotary_pos_emb_interleave``."""
    cos, sin = rope
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def chunk_mask(start: int, num_tokens: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Boolean ``[c, start + c]``: True where query ``i`` may attend key ``j``; None for a first
    chunk (``start == 0``), which attention runs with ``is_causal=True`` (see
    [Note: chunk causal mask])."""
    if start == 0:
        return None
    keys = torch.arange(start + num_tokens, device=device)
    queries = start + torch.arange(num_tokens, device=device)
    return keys[None, :] <= queries[:, None]


class Attention(nn.Module):
    """GQA self-attention with RoPE (Llama/Qwen2/Qwen3; Qwen3 adds per-head q/k RMSNorm)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(config.hidden_size, h * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scaling = d**-0.5

    def forward(self, x: torch.Tensor, segments: list[tuple[Segment, LayerKV]]) -> torch.Tensor:
        n = x.shape[0]
        q_all = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k_all = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v_all = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q_all, k_all = self.q_norm(q_all), self.k_norm(k_all)
        outs = []
        for segment, cache in segments:
            q, k, v = q_all[segment.rows], k_all[segment.rows], v_all[segment.rows]
            c = q.shape[0]
            q = apply_rope(q.transpose(0, 1), segment.rope)
            k = apply_rope(k.transpose(0, 1), segment.rope)
            keys, values = cache.append(segment.start, k, v.transpose(0, 1))
            out = F.scaled_dot_product_attention(
                q[None], keys[None], values[None], attn_mask=segment.mask, is_causal=segment.mask is None,
                scale=self.scaling, enable_gqa=self.num_heads != self.num_kv_heads,
            )
            outs.append(out[0].transpose(0, 1).reshape(c, self.num_heads * self.head_dim))
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))


class LatentAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention.

    The cache holds the compressed latent (after ``kv_a_layernorm``) and the shared rotary key,
    ``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer; every chunk expands the whole
    prefix through ``kv_b_proj`` (the plain, non-absorbed formulation transformers uses).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.num_attention_heads
        self.num_heads = h
        self.nope, self.rope_dim, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.interleave = config.rope_interleave
        qk_head = self.nope + self.rope_dim
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(config.hidden_size, h * qk_head, bias=False)
        else:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=config.o_bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank)
            self.q_b_proj = nn.Linear(config.q_lora_rank, h * qk_head, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(config.hidden_size, self.kv_lora_rank + self.rope_dim, bias=config.o_bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, h * (self.nope + self.v_dim), bias=False)
        self.o_proj = nn.Linear(h * self.v_dim, config.hidden_size, bias=config.o_bias)
        self.scaling = qk_head**-0.5
        self.has_q_lora = config.q_lora_rank is not None

    def forward(self, x: torch.Tensor, segments: list[tuple[Segment, LayerKV]]) -> torch.Tensor:
        n, h = x.shape[0], self.num_heads
        q_all = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.has_q_lora else self.q_proj(x)
        q_all = q_all.view(n, h, self.nope + self.rope_dim)
        latent_all, k_rot_all = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.rope_dim], dim=-1)
        latent_all = self.kv_a_layernorm(latent_all)
        rotate = apply_rope_interleaved if self.interleave else apply_rope
        outs = []
        for segment, cache in segments:
            q = q_all[segment.rows].transpose(0, 1)
            c = q.shape[1]
            q_pass, q_rot = torch.split(q, [self.nope, self.rope_dim], dim=-1)
            q_rot = rotate(q_rot, segment.rope)
            k_rot = rotate(k_rot_all[segment.rows][None], segment.rope)[0]
            latents, k_rots = cache.append(segment.start, latent_all[segment.rows], k_rot)
            end = latents.shape[0]
            kv = self.kv_b_proj(latents).view(end, h, self.nope + self.v_dim).transpose(0, 1)
            k_nope, values = torch.split(kv, [self.nope, self.v_dim], dim=-1)
            keys = torch.cat([k_nope, k_rots[None].expand(h, end, self.rope_dim)], dim=-1)
            query = torch.cat([q_pass, q_rot], dim=-1)
            out = F.scaled_dot_product_attention(query[None], keys[None], values[None], attn_mask=segment.mask,
                                                 is_causal=segment.mask is None, scale=self.scaling)
            outs.append(out[0].transpose(0, 1).reshape(c, h * self.v_dim))
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Router(nn.Module):
    """Holds the router weight under transformers' name ``mlp.gate.weight``."""

    def __init__(self, num_experts: int, hidden: int, correction_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden))
        if correction_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))


def _run_experts(experts: nn.ModuleList, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token through its top-k experts, weighted and summed (transformers' loop order)."""
    out = torch.zeros_like(x)
    hit = torch.zeros(len(experts), dtype=torch.bool, device=indices.device)  # indices may be on a GPU
    hit[indices.flatten()] = True
    for expert_index in hit.nonzero().flatten().tolist():
        token_index, slot = torch.where(indices == expert_index)
        y = experts[expert_index](x[token_index]) * weights[token_index, slot, None]
        out.index_add_(0, token_index, y.to(out.dtype))
    return out


class Qwen3MoeBlock(nn.Module):
    """Softmax router, top-k experts, optional renormalisation of the k weights."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = _Router(config.num_experts, config.hidden_size, correction_bias=False)
        self.experts = nn.ModuleList(
            MLP(config.hidden_size, config.moe_intermediate_size) for _ in range(config.num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(F.linear(x, self.gate.weight), dim=-1, dtype=torch.float32)
        weights, indices = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return _run_experts(self.experts, x, indices, weights.to(x.dtype))


class DeepseekMoeBlock(nn.Module):
    """DeepSeek-V3 MoE: sigmoid scores + correction bias, top-k groups, then top-k experts within
    them, weights renormalised and scaled; plus the always-on shared expert."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.num_experts, self.n_group, self.topk_group = config.num_experts, config.n_group, config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.gate = _Router(config.num_experts, config.hidden_size, correction_bias=True)
        self.experts = nn.ModuleList(
            MLP(config.hidden_size, config.moe_intermediate_size) for _ in range(config.num_experts)
        )
        self.shared_experts = MLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        choice = scores + self.gate.e_score_correction_bias
        per_group = self.num_experts // self.n_group
        group_scores = choice.view(-1, self.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_index = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_index, 1)
        expert_mask = group_mask.unsqueeze(-1).expand(-1, self.n_group, per_group).reshape(-1, self.num_experts)
        choice = choice.masked_fill(~expert_mask.bool(), float("-inf"))
        indices = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        return _run_experts(self.experts, x, indices, weights.to(x.dtype)) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LatentAttention(config) if config.is_mla else Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if not config.is_moe_layer(layer_index):
            self.mlp: nn.Module = MLP(config.hidden_size, config.intermediate_size)
        elif config.is_mla:
            self.mlp = DeepseekMoeBlock(config)
        else:
            self.mlp = Qwen3MoeBlock(config)

    def forward(self, x: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        caches = [(segment, segment.kv.layer(self.layer_index)) for segment in segments]
        x = x + self.self_attn(self.input_layernorm(x), caches)
        return x + self.mlp(self.post_attention_layernorm(x))
