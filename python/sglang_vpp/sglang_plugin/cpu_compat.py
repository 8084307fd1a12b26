"""What SGLang's generic CPU path lacks, supplied as hooks (no SGLang code copied).

SGLang 0.5.23 on a machine without an accelerator and without its CPU engine
(``SGLANG_USE_CPU_ENGINE`` unset: that engine needs a CPU ``sgl_kernel`` build PyPI does not
have) resolves to the base ``SRTPlatform``. On that platform two things break:

- ``RotaryEmbedding.__init__`` picks a fallback kernel from ``vllm._custom_ops``, which does
  not exist without vllm. SGLang's own pure-torch ``forward_native`` is what the generic
  platform dispatches to anyway (``BaseFusedOp`` has no platform key there), so the hook makes
  the constructor take its CPU branch (no fallback kernel) and the forward stays pure torch.

- MLA models (DeepSeek-V2/V3) with ``--attention-backend torch_native``: the DeepSeek attention
  picks its forward method from a per-backend table that has no ``torch_native`` entry, so it
  falls back to the Triton rule, which runs a chunk without cached prefix through the
  "MHA" method (full-width K/V computed in the layer, ``save_kv_cache=False``). The torch_native
  backend ignores the K/V it is handed and reads the pool, which for MLA holds the compressed
  latent (kv_lora_rank + rope columns, one head): the shapes disagree and the forward fails.
  The hook keeps the absorbed "MLA" method for every forward on torch_native, whose K is the
  latent and whose V is its first kv_lora_rank columns, exactly what the pool returns. It
  changes the method only when the backend is torch_native; any other backend keeps
  SGLang's choice.

Prefill-decode disaggregation on ``--device cpu`` (Mooncake over TCP) needs three more guards,
each of which avoids a CUDA-only call on a path the CPU reaches:

- decode: the retraction backup defaults to a HiCache host pool that calls
  ``torch.cuda.cudart()``; ``apply_cpu_pd_args`` defaults ``--disaggregation-decode-retraction-backup``
  to ``none`` (a retracted request then recomputes instead of restoring from host memory);
- prefill: the overlap schedule records ``torch.cuda.Event()``; ``apply_cpu_pd_args`` turns it off;
- prefill: ``MooncakeKVSender`` advertises host-tensor indices, and the sender then pins memory
  and records a CUDA event; the AROUND hook on its ``__init__`` (``PD_SENDER_INIT_TARGET``)
  makes each sender advertise none, so SGLang takes its plain-index path.

The two argument guards run in the launcher (``cli_args.around_from_cli_args``) and only fill a
flag the user left unset; the sender hook is registered in each prefill scheduler process.

Data flow: scheduler process -> ``process_hooks.setup_scheduler_process`` ->
``register_cpu_hooks()`` (only on the generic platform) -> HookRegistry AROUND hooks on
``RotaryEmbedding.__init__`` and ``DeepseekV2AttentionMLA.dispatch_attn_forward_method``
(``CPU_HOOK_TARGETS``). Other platforms (CUDA, NPU, SGLang's CPU engine) are untouched. Every
``--pp-mode`` gets the same hooks, so stock cpp and the VPP modes compute alike.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["CPU_HOOK_TARGETS", "MLA_DISPATCH_TARGET", "PD_SENDER_INIT_TARGET", "ROTARY_INIT_TARGET",
           "apply_cpu_pd_args", "is_generic_cpu_platform", "register_cpu_hooks", "register_cpu_pd_hooks"]

ROTARY_INIT_TARGET = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__"
MLA_DISPATCH_TARGET = "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA.dispatch_attn_forward_method"
PD_SENDER_INIT_TARGET = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
_TORCH_NATIVE = "torch_native"
_ROTARY_MODULE = "sglang.srt.layers.rotary_embedding.base"


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


def _mla_dispatch_on_torch_native(original, self, forward_batch):
    method = original(self, forward_batch)
    if getattr(self, "current_attention_backend", None) != _TORCH_NATIVE:
        return method
    from sglang.srt.models.deepseek_common.attention_backend_handler import _dispatch_mla_subtype

    return _dispatch_mla_subtype(self, forward_batch)


CPU_HOOK_TARGETS: tuple[tuple[str, object], ...] = (
    (ROTARY_INIT_TARGET, _rotary_init_without_vllm),
    (MLA_DISPATCH_TARGET, _mla_dispatch_on_torch_native),
)
"""Every generic-CPU hook, (target, AROUND function): the one list registered below."""


def register_cpu_hooks() -> bool:
    """Register the generic-CPU hooks; return whether this process needs them."""
    if not is_generic_cpu_platform():
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    for target, hook in CPU_HOOK_TARGETS:
        register_hook(target, hook, HookType.AROUND)
    return True


def _sender_without_host_indices(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    # An instance attribute shadows the class flag SGLang's prefill reads before each send.
    self.supports_host_tensor_indices = False
    return result


def apply_cpu_pd_args(args: Any) -> list[str]:
    """Fill the CPU guards of a PD server into the launcher's ``args``; return what was set.

    Only with ``--device cpu`` and a ``--disaggregation-mode``; a flag the user set is kept."""
    if getattr(args, "device", None) != "cpu":
        return []
    mode = getattr(args, "disaggregation_mode", None)
    changed = []
    if mode == "decode" and getattr(args, "disaggregation_decode_retraction_backup", None) is None:
        args.disaggregation_decode_retraction_backup = "none"
        changed.append("--disaggregation-decode-retraction-backup none")
    if mode == "prefill" and not getattr(args, "disable_overlap_schedule", False):
        args.disable_overlap_schedule = True
        changed.append("--disable-overlap-schedule")
    return changed


def register_cpu_pd_hooks(server_args: Any) -> bool:
    """Register the prefill sender guard on ``--device cpu`` prefill servers only; return whether this is one."""
    if getattr(server_args, "device", None) != "cpu" or getattr(server_args, "disaggregation_mode", None) != "prefill":
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(PD_SENDER_INIT_TARGET, _sender_without_host_indices, HookType.AROUND)
    return True
