"""Tiny Hugging Face model directories built locally: no hub download, ever.

Job: produce a directory that ``transformers`` and SGLang both load like a hub checkpoint
(``config.json``, ``model.safetensors``, ``tokenizer.json`` + tokenizer config,
``generation_config.json``), for tests and for the reference runtime.

Data flow::

    Python stdlib *.py files --train BPE (tokenizers)--> tokenizer.json   (cached on disk)
    tiny_presets.json[preset] + overrides + vocab size --> transformers config
    torch.manual_seed(seed) + AutoModelForCausalLM.from_config --> float32 weights
    save_pretrained(model) + save_pretrained(tokenizer) --> model directory

Public API (all keyword arguments after the first are optional):

- ``PRESETS``: the preset names (``qwen2-tiny``, ``qwen3-tiny``, ``llama-tiny``,
  ``qwen3-moe-tiny``, and the deployment shapes ``deepseek-v3-tiny`` (MLA with q_lora_rank,
  MoE with a dense first layer and a shared expert, yarn rope, ``moe_layer_freq`` as real
  DeepSeek configs carry it), ``deepseek-v2-tiny`` (the same without q_lora_rank) and
  ``glm4-moe-tiny`` (GQA with partial rotary, MoE, dense first layer)); their configs live as
  data in ``tiny_presets.json``.
- ``TinyModelSpec(preset, num_layers=None, seed=0, vocab_size=12000, overrides={})``: what to
  build; ``overrides`` are extra transformers config keyword arguments
  (e.g. ``{"hidden_size": 512}``).
- ``build_tiny_model(out_dir, spec) -> Path``: write the model directory (overwrites files).
- ``cached_tiny_model(spec) -> Path``: the same, built once under the cache directory and
  reused (keyed by the spec, the transformers version and the tokenizer).
- ``train_tokenizer(vocab_size=12000) -> Path``: the cached ``tokenizer.json``.
- ``load_transformers_model(model_dir)``: the model in float32 eval mode, for reference outputs.

Cache directory: ``$SGLANG_VPP_CACHE_DIR`` or ``~/.cache/sglang-vpp``. Writes are atomic
(temporary directory + rename) so concurrent test processes can share it.

Why these choices:
- vocab >= 10000: SGLang's dynamic-chunking profiler feeds random token ids below 10000.
- ``initializer_range`` 0.2 (set in the presets): with the usual 0.02 the logits are nearly flat
  and greedy argmax can flip between two correct implementations on near-ties.
- Untied embeddings by default: keeps embedding and LM head independent parameters, the simple
  case for pipeline layouts that place them on different ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "PRESETS",
    "TinyModelError",
    "TinyModelSpec",
    "build_tiny_model",
    "cache_dir",
    "cached_tiny_model",
    "load_transformers_model",
    "train_tokenizer",
]

# Special tokens: eos doubles as pad. Ids 0 and 1 (added first).
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# Bump when the tokenizer recipe changes, so stale caches are not reused.
_TOKENIZER_RECIPE_VERSION = 1
# A minimal chat format, so /v1/chat/completions works on a tiny model (the words are noise; the
# endpoint, its templating and streaming are what a test exercises). Part of the cache key.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# About 4.7 MB of text on CPython 3.11: trains in seconds and yields >12k merges.
_CORPUS_GLOB = "*.py"


class TinyModelError(ValueError):
    """A bad tiny-model request (unknown preset, too small a vocabulary, ...)."""


def _load_preset_table() -> dict[str, dict[str, Any]]:
    text = resources.files("sglang_vpp.models").joinpath("tiny_presets.json").read_text()
    table = json.loads(text)
    return {name: entry for name, entry in table.items() if not name.startswith("_")}


PRESETS: tuple[str, ...] = tuple(_load_preset_table())


@dataclass(frozen=True)
class TinyModelSpec:
    """What tiny model to build. Hashable and cheap: building touches disk, this does not."""

    preset: str = "qwen2-tiny"
    """A name from ``PRESETS``."""
    num_layers: int | None = None
    """Overrides the preset's ``num_hidden_layers`` (pipeline tests need 4, 8, ...)."""
    seed: int = 0
    """Seed of ``torch.manual_seed`` before weight initialisation."""
    vocab_size: int = 12000
    """Tokenizer (and model) vocabulary size; at least 10000 (see module docstring)."""
    overrides: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    """Extra transformers config kwargs as (name, value) pairs; a dict is accepted and sorted."""

    def __post_init__(self) -> None:
        if isinstance(self.overrides, dict):
            object.__setattr__(self, "overrides", tuple(sorted(self.overrides.items())))
        if self.preset not in PRESETS:
            raise TinyModelError(
                f"unknown tiny model preset {self.preset!r}; valid presets: {', '.join(PRESETS)}"
            )
        if self.vocab_size < 10000:
            raise TinyModelError(
                f"vocab_size={self.vocab_size} is too small: SGLang's dynamic-chunking profiler "
                "samples token ids below 10000; use vocab_size >= 10000"
            )
        if self.num_layers is not None and self.num_layers < 1:
            raise TinyModelError(f"num_layers={self.num_layers} must be >= 1 (or None)")

    def config_kwargs(self) -> dict[str, Any]:
        """The transformers config kwargs: preset, then num_layers, then overrides."""
        kwargs = dict(_load_preset_table()[self.preset]["kwargs"])
        if self.num_layers is not None:
            kwargs["num_hidden_layers"] = self.num_layers
        kwargs.update(dict(self.overrides))
        return kwargs

    def key(self) -> str:
        """Short stable hash of everything that changes the built files."""
        import transformers

        payload = json.dumps(
            {
                "spec": dataclasses.asdict(self),
                "kwargs": self.config_kwargs(),
                "transformers": transformers.__version__,
                "tokenizer": _tokenizer_key(self.vocab_size),
                "chat_template": CHAT_TEMPLATE,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """Root of the on-disk cache (tokenizers and cached model directories)."""
    root = os.environ.get("SGLANG_VPP_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "sglang-vpp"


def _corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob(_CORPUS_GLOB))
    assert files, f"no {_CORPUS_GLOB} files under {stdlib}"
    return files


def _tokenizer_key(vocab_size: int) -> str:
    import tokenizers

    names = [f"{p.name}:{p.stat().st_size}" for p in _corpus_files()]
    payload = json.dumps(
        [_TOKENIZER_RECIPE_VERSION, vocab_size, tokenizers.__version__, names], sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _atomic_dir(final: Path, build) -> Path:
    """Run ``build(tmp_dir)`` and rename the result to ``final`` unless another process won."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process renamed first: its copy is identical (same key); keep it.
            if not final.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def train_tokenizer(vocab_size: int = 12000) -> Path:
    """Train (once) a byte-level BPE tokenizer on the stdlib sources; return its tokenizer.json."""
    if vocab_size < 10000:
        raise TinyModelError(f"vocab_size={vocab_size} must be >= 10000 (see tiny_hf docstring)")
    final = cache_dir() / "tokenizers" / f"bpe-{vocab_size}-{_tokenizer_key(vocab_size)}"

    def build(tmp: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TOKEN, PAD_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train([str(p) for p in _corpus_files()], trainer)
        got = tokenizer.get_vocab_size()
        if got < 10000:
            raise TinyModelError(
                f"the stdlib corpus yielded only {got} tokens (asked {vocab_size}); "
                "pass a smaller vocab_size (>= 10000) or a Python with a larger stdlib"
            )
        tokenizer.save(str(tmp / "tokenizer.json"))

    return _atomic_dir(final, build) / "tokenizer.json"


def _make_config(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int):
    import transformers

    class_name = _load_preset_table()[spec.preset]["config_class"]
    config_class = getattr(transformers, class_name)
    kwargs = spec.config_kwargs()
    kwargs.update(vocab_size=vocab_size, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    config = config_class(**kwargs)
    config.torch_dtype = "float32"
    return config


def build_tiny_model(out_dir: str | os.PathLike[str], spec: TinyModelSpec | None = None) -> Path:
    """Write a loadable model directory for ``spec`` into ``out_dir``; return its path."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(train_tokenizer(spec.vocab_size)),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    vocab_size = len(tokenizer)
    config = _make_config(spec, vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id)

    # Seeded, single-threaded-deterministic init on CPU in float32.
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    _check_weights(model)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _check_weights(model) -> None:
    """Catch parameters left uninitialised (torch.empty garbage) by a transformers change."""
    import torch

    for name, param in model.named_parameters():
        if not torch.isfinite(param).all() or param.abs().max() > 1e3:
            raise TinyModelError(
                f"parameter {name} was not initialised sanely (max |w| = "
                f"{param.abs().max().item():.3g}); the transformers version changed its init"
            )


def cached_tiny_model(spec: TinyModelSpec | None = None) -> Path:
    """Build ``spec`` once under ``cache_dir()/models`` and return the directory."""
    spec = spec or TinyModelSpec()
    final = cache_dir() / "models" / f"{spec.preset}-{spec.key()}"
    return _atomic_dir(final, lambda tmp: build_tiny_model(tmp, spec))


def load_transformers_model(model_dir: str | os.PathLike[str]):
    """Load a tiny model with transformers in float32 eval mode (the reference for tests)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()
