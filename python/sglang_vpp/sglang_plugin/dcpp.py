"""``--pp-mode dcpp``: SGLang's own dynamic chunking, with its start-up profile retried on a bad fit.

Why: SGLang profiles 128 prefill latencies on rank 0 at start-up and fits f(l) = a l^2 + b l + c;
when timing noise gives a <= 0 it rejects the fit and serves fixed chunks for the server's whole
life, so a "dcpp" baseline silently becomes cpp. On small models or busy machines that happens
often (seen on a 2-vCPU machine about one start in two). The plugin profiles again, up to
``SGLANG_VPP_DCPP_PROFILE_ATTEMPTS`` times (default 5), before accepting SGLang's fallback.

The profile runs while the server's other processes are still starting (the launcher loads its
tokenizer and HTTP front end at the same moment), so on a small host its noise comes in bursts
that back-to-back profiles all land in (under two busy-looping processes every profile of a
128-token chunk failed here). Retries therefore wait, 0.5 s doubling to at most 4 s
(``retry_wait_s``: 7.5 s over the default five profiles, about 20 s over eight), so they
sample the host after the burst; the waits cost nothing when the first fit is accepted.

    managers.scheduler_components.dynamic_chunk_sizer.DynamicChunkSizer.profile_and_fit  AROUND

Safe to repeat on every rank alike: ``profile_and_fit`` broadcasts rank 0's samples and every rank
fits the same samples, so all ranks see the same outcome and make the same number of calls (the
broadcast inside is collective). A failed profile releases its synthetic requests' KV itself.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

__all__ = ["ATTEMPTS_ENV", "DEFAULT_ATTEMPTS", "around_profile_and_fit", "install_dcpp_hooks", "profile_attempts", "retry_wait_s"]

logger = logging.getLogger(__name__)

ATTEMPTS_ENV = "SGLANG_VPP_DCPP_PROFILE_ATTEMPTS"
DEFAULT_ATTEMPTS = 5
_FIRST_WAIT_S = 0.5
_MAX_WAIT_S = 4.0
_sleep: Callable[[float], None] = time.sleep  # tests replace it
_TARGET = "sglang.srt.managers.scheduler_components.dynamic_chunk_sizer.DynamicChunkSizer.profile_and_fit"


def profile_attempts() -> int:
    raw = os.environ.get(ATTEMPTS_ENV, str(DEFAULT_ATTEMPTS))
    try:
        attempts = int(raw)
    except ValueError:
        raise ValueError(f"{ATTEMPTS_ENV}={raw!r} must be a positive integer (profiles before fixed chunks)") from None
    if attempts < 1:
        raise ValueError(f"{ATTEMPTS_ENV}={attempts} must be >= 1")
    return attempts


def retry_wait_s(failed_attempt: int) -> float:
    """Seconds to wait after the ``failed_attempt``-th rejected fit (1-based) before profiling again."""
    return min(_FIRST_WAIT_S * 2 ** (failed_attempt - 1), _MAX_WAIT_S)


def around_profile_and_fit(original: Callable[..., bool], sizer: Any, *args: Any, **kwargs: Any) -> bool:
    """Call SGLang's profile-and-fit until it succeeds or the attempts run out, waiting between tries.

    Every rank waits the same: each fits rank 0's broadcast samples, so all fail together.
    """
    attempts = profile_attempts()
    for attempt in range(1, attempts + 1):
        if original(sizer, *args, **kwargs):
            if attempt > 1:
                logger.info("sglang-vpp dcpp: chunk-size predictor fitted on attempt %d of %d", attempt, attempts)
            return True
        if attempt < attempts:
            wait_s = retry_wait_s(attempt)
            logger.warning(
                "sglang-vpp dcpp: SGLang rejected its chunk-size predictor (attempt %d of %d); profiling again in %.1f s",
                attempt, attempts, wait_s,
            )  # fmt: skip
            _sleep(wait_s)
    logger.warning(
        "sglang-vpp dcpp: no usable chunk-size predictor after %d profiles; this server runs fixed chunks "
        "(SGLang's fallback). Raise %s or use a larger --chunked-prefill-size.",
        attempts, ATTEMPTS_ENV,
    )  # fmt: skip
    return False


def install_dcpp_hooks() -> None:
    """Register the retry hook in this scheduler process (the caller applies hooks)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    profile_attempts()  # a bad value fails at start-up, not at the first retry
    register_hook(_TARGET, around_profile_and_fit, HookType.AROUND)
