"""Decoder models for the reference runtime: configs, layers, KV cache, per-rank stage models, weights."""

from .config import ARCHITECTURES, PRESETS, ModelConfig, preset_config
from .kv_cache import KVCache, LayerKV, StageKV
from .stage_model import StageModel, StageOutput
from .weights import (
    ModelSource,
    full_model,
    materialize,
    resolve_model,
    save_checkpoint,
)

__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "KVCache",
    "LayerKV",
    "ModelConfig",
    "ModelSource",
    "StageKV",
    "StageModel",
    "StageOutput",
    "full_model",
    "materialize",
    "preset_config",
    "resolve_model",
    "save_checkpoint",
]
