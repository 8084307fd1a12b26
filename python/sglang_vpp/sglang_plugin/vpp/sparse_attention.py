"""DeepSeek sparse attention (DSA) models are refused in the vpp modes: one test, one message.

SGLang gives such a model (``is_deepseek_dsa``: a listed architecture with ``index_topk``) an
index-key cache beside the MLA latents, which it allocates for every layer of the rank's range
by its own code and, in a prefill-decode split, transfers by position; the ownership hooks do
not hold it per stage. The launcher refuses a model whose config it can read; every scheduler
refuses again after the model loads, on the config SGLang resolved (overrides included).
"""

from __future__ import annotations

from typing import Any

__all__ = ["uses_sparse_attention_cache", "sparse_attention_refusal"]


def uses_sparse_attention_cache(hf_config: Any) -> bool:
    """Whether SGLang gives a model of this config (a dict or a ``PretrainedConfig``) a DSA pool."""
    index_topk = hf_config.get("index_topk") if isinstance(hf_config, dict) else getattr(hf_config, "index_topk", None)
    if index_topk is None:  # a condition of SGLang's test: spares the launcher its heavy import
        return False
    from sglang.srt.configs.model_config import is_deepseek_dsa

    return bool(is_deepseek_dsa(hf_config))


def sparse_attention_refusal(mode: str, model: str) -> str:
    return (f"--pp-mode {mode} does not support model {model} with DeepSeek sparse attention (DSA: SGLang's "
            "index_topk models): SGLang allocates its index-key cache for every layer of the rank's range by its "
            "own code, in memory sized for the owned layers, and a prefill-decode split transfers it by position, "
            "which a fold-back rank's two layer ranges do not match; the plugin does not hold that cache per stage. "
            "Use --pp-mode cpp or dcpp for this model.")
