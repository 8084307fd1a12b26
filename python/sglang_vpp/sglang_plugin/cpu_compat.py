"""What SGLang's generic CPU path lacks, supplied as hooks (no SGLang code copied).

SGLang 0.5.23 on a machine without an accelerator and without its CPU engine
(``SGLANG_USE_CPU_ENGINE`` unset: that engine needs a CPU ``sgl_kernel`` build PyPI does not
have) resolves to the base ``SRTPlatform``. On that platform one thing breaks:

- ``RotaryEmbedding.__init__`` picks a fallback kernel from ``vllm._custom_ops``, which does
  not exist without vllm. SGLang's own pure-torch ``forward_native`` is what the generic
  platform dispatches to anyway (``BaseFusedOp`` has no platform key there), so the hook makes
  the constructor take its CPU branch (no fallback kernel) and the forward stays pure torch.

Data flow: scheduler process -> ``process_hooks.setup_scheduler_process`` ->
``register_cpu_hooks()`` (only on the generic platform) -> HookRegistry AROUND hook on
``RotaryEmbedding.__init__``. Other platforms (CUDA, NPU, SGLang's CPU engine) are untouched.
"""

from __future__ import annotations

import sys

__all__ = ["ROTARY_INIT_TARGET", "is_generic_cpu_platform", "register_cpu_hooks"]

ROTARY_INIT_TARGET = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__"
_ROTARY_MODULE = "sglang.srt.layers.rotary_embedding.base"
_registered = False


def is_generic_cpu_platform() -> bool:
    """True when SGLang found no accelerator platform and no CPU engine (the fallback path)."""
    from sglang.srt.platforms import current_platform
    from sglang.srt.platforms.interface import SRTPlatform

    return type(current_platform) is SRTPlatform


def _rotary_init_without_vllm(original, self, *args, **kwargs):
    # The constructor chooses a fallback kernel unless the module-level `_is_cpu` flag is set;
    # on the generic platform that kernel would come from vllm. Present the host CPU as CPU for
    # the duration of the constructor only; dispatch (BaseFusedOp) then runs forward_native.
    module = sys.modules[_ROTARY_MODULE]
    saved = module._is_cpu
    module._is_cpu = True
    try:
        return original(self, *args, **kwargs)
    finally:
        module._is_cpu = saved


def register_cpu_hooks() -> bool:
    """Register the generic-CPU hooks once; return whether this process needed them."""
    global _registered
    if _registered:
        return True
    if not is_generic_cpu_platform():
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(ROTARY_INIT_TARGET, _rotary_init_without_vllm, HookType.AROUND)
    _registered = True
    return True
