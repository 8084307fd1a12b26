"""Weights for a ``StageModel``: seeded random (presets) or a local Hugging Face checkpoint.

Data flow:

- ``resolve_model("tiny-qwen3" | "/path/to/hf_dir")`` -> ``ModelSource`` (what to build) with its
  ``ModelConfig``; a bad path or an unknown preset raises ``ModelPathError`` / ``ModelConfigError``.
- ``materialize(source, stages, num_stages)`` -> a ``StageModel`` holding only those stages'
  parts, filled by ``init_random_`` or ``load_checkpoint_``.

Random weights are drawn per parameter from a generator seeded by ``(seed, parameter name)``, so
a rank that builds layers 4..7 gets exactly the values the single-process reference builds for
those layers, without ever allocating the others. Norm weights are ``1 + 0.1 N(0, 1)`` rather
than ones so that a norm applied to the wrong tensor changes the output.

Checkpoints are read with ``safetensors.safe_open`` tensor by tensor: only the names this rank
owns are read. Both expert layouts are accepted: per expert (``mlp.experts.3.up_proj.weight``,
what transformers writes) and fused (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``,
``mlp.experts.down_proj`` ``[E, H, I]``, transformers' in-memory layout).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import json_text
from ...schedule import StageSpec
from ..errors import ModelConfigError, ModelPathError
from .config import PRESETS, ModelConfig, preset_config
from .stage_model import StageModel

__all__ = ["ModelSource", "init_random_", "load_checkpoint_", "materialize", "resolve_model", "save_checkpoint"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config and weights come from."""

    name: str
    """The preset name or the directory as given."""
    config: ModelConfig
    path: Path | None = None
    """A Hugging Face directory; None for a seeded random preset."""
    seed: int = 0

    @property
    def label(self) -> str:
        return self.name if self.path is None else str(self.path)


def resolve_model(model: str, seed: int = 0, num_layers: int | None = None) -> ModelSource:
    """A preset name or a local HF directory -> ``ModelSource`` (raises with the fix on error)."""
    path = Path(model).expanduser()
    if model in PRESETS:
        return ModelSource(model, preset_config(model, num_layers), None, seed)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelPathError(
                f"--model {model}: the directory has no config.json; pass a Hugging Face model "
                "directory (config.json + *.safetensors) or a preset: " + ", ".join(PRESETS)
            )
        try:
            data = json_text.loads(config_file.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ModelPathError(f"--model {model}: cannot read config.json ({error})") from None
        if not _safetensors_files(path):
            raise ModelPathError(
                f"--model {model}: no *.safetensors weights in the directory; save the model with "
                "save_pretrained(..., safe_serialization=True)"
            )
        try:
            config = ModelConfig.from_hf_dict(data)
        except ModelConfigError as error:
            raise ModelPathError(f"--model {model}: {error}") from None
        _check_weights_header(model, path, config)
        if num_layers is not None:
            config = config.with_layers(num_layers)
        return ModelSource(model, config, path, seed)
    if path.exists() or "/" in model or model.startswith("."):
        raise ModelPathError(
            f"--model {model}: not a directory ({'it is a file' if path.exists() else 'no such path'}); "
            "pass a local Hugging Face "
            "model directory or a preset: " + ", ".join(PRESETS)
        )
    return ModelSource(model, preset_config(model, num_layers), None, seed)  # raises: unknown preset


def materialize(source: ModelSource, stages: Iterable[StageSpec], num_stages: int) -> StageModel:
    """Build the parts of ``source`` that a rank running ``stages`` needs, in fp32, eval mode."""
    model = StageModel.for_stages(source.config, stages, num_stages)
    if source.path is None:
        init_random_(model, source.seed)
    else:
        load_checkpoint_(model, source.path)
    return model.eval().requires_grad_(False)


def full_model(source: ModelSource) -> StageModel:
    """Every layer plus embedding and head (the single-process reference)."""
    config = source.config
    return materialize(source, [StageSpec(0, 0, 0, config.num_hidden_layers)], 1)


# ----------------------------------------------------------------------------- random weights
def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def random_tensor(name: str, shape: torch.Size, std: float, seed: int) -> torch.Tensor:
    """The value parameter ``name`` gets under ``seed`` (independent of what else is built)."""
    gen = _generator(seed, name)
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("e_score_correction_bias"):
        return 0.1 * noise
    return std * noise


@torch.no_grad()
def init_random_(model: StageModel, seed: int) -> None:
    std = model.config.initializer_range
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        source_name = _tied_source(model.config, name)
        tensor.copy_(random_tensor(source_name, tensor.shape, std, seed))


def _tied_source(config: ModelConfig, name: str) -> str:
    # Tied embeddings: lm_head is the embedding matrix, even on a rank without the embedding.
    return "model.embed_tokens.weight" if name == "lm_head.weight" and config.tie_word_embeddings else name


# ----------------------------------------------------------------------------- checkpoints
def _check_weights_header(model: str, path: Path, config: ModelConfig) -> None:
    """Read every weights file's header (no tensor data) and the embedding's shape: a corrupt
    file, or a config.json of another model, is one error before any work starts, not a rank
    that fails (or a host that runs out of memory building the config's sizes) after the start."""
    from safetensors import SafetensorError, safe_open

    for file in _safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as handle:
                shape = (handle.get_slice(_EMBEDDING).get_shape() if _EMBEDDING in handle.keys() else None)
        except (SafetensorError, OSError) as error:
            raise ModelPathError(f"--model {model}: {file.name} is not a readable safetensors file ({error}); "
                                 "save the model with save_pretrained(..., safe_serialization=True)") from None
        expected = [config.vocab_size, config.hidden_size]
        if shape is not None and list(shape) != expected:
            raise ModelPathError(f"--model {model}: {file.name} holds {_EMBEDDING} of shape {list(shape)}, but "
                                 f"config.json gives [vocab_size, hidden_size] {expected}; the config is another "
                                 "model's")


_EMBEDDING = "model.embed_tokens.weight"


def _safetensors_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


_FUSED = re.compile(r"^(?P<prefix>model\.layers\.\d+\.mlp\.experts)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@torch.no_grad()
def load_checkpoint_(model: StageModel, path: Path) -> None:
    """Fill ``model`` from the safetensors files in ``path``, reading only the owned names."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                where[key] = file
    state = model.state_dict()
    missing = []
    handles: dict[Path, object] = {}

    def read(key: str) -> torch.Tensor | None:
        file = where.get(key)
        if file is None:
            return None
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt")
        return handles[file].get_tensor(key)  # type: ignore[attr-defined]

    for name, tensor in state.items():
        value = read(_tied_source(model.config, name))
        if value is None and name == "lm_head.weight":
            value = read("model.embed_tokens.weight")  # tied checkpoints omit lm_head
        if value is None:
            value = _read_fused_expert(name, read)
        if value is None:
            if name.endswith("e_score_correction_bias"):
                continue  # absent in some DeepSeek exports: zero bias
            missing.append(name)
            continue
        if tuple(value.shape) != tuple(tensor.shape):
            raise ModelPathError(
                f"{path}: tensor {name} has shape {tuple(value.shape)}, the config implies "
                f"{tuple(tensor.shape)}; config.json and the weights disagree"
            )
        tensor.copy_(value.to(tensor.dtype))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelPathError(
            f"{path}: the checkpoint lacks {len(missing)} tensors this rank needs: {shown}; "
            "is it a complete transformers checkpoint of this architecture?"
        )


def _read_fused_expert(name: str, read) -> torch.Tensor | None:
    match = _FUSED.match(name)
    if match is None:
        return None
    index, proj = int(match["index"]), match["proj"]
    if proj == "down_proj":
        fused = read(f"{match['prefix']}.down_proj")
        return None if fused is None else fused[index]
    fused = read(f"{match['prefix']}.gate_up_proj")
    if fused is None:
        return None
    gate, up = fused[index].chunk(2, dim=0)
    return gate if proj == "gate_proj" else up


def save_checkpoint(model: StageModel, path: Path) -> None:
    """Write ``model`` (usually ``full_model``) as a transformers-style directory (config + safetensors)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2))
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
