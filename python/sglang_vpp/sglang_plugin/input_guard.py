"""Refuse requests that would crash a forward pass, before they reach a scheduler.

Stock SGLang 0.5.23 sends two kinds of request to the model that kill the scheduler (and with
it the whole server, every pipeline mode included): a prompt with no tokens (``"text": ""``:
the attention reshape of zero elements fails) and token ids outside ``[0, vocab)`` (``-1`` or
``vocab`` and above: the embedding lookup raises ``IndexError``; ``vocab`` is the input
embedding's, and a multimodal request may also carry its processor's placeholder ids, which some
models embed past it). A token id that is not an integer fails the same way. So does a logprob request, whatever the prompt, with a
``top_logprobs_num`` above the vocabulary size or below 0 (``topk`` of the sampler raises "selected
index k out of range"; the OpenAI ``logprobs`` / ``top_logprobs`` fields map to it unchecked).
SGLang checks ``token_ids_logprob`` against the vocabulary itself, in the method the guard runs
before, so the guard leaves it alone. With
``--pp-size`` > 1, a request for hidden states (``return_hidden_states``, served when the server
runs with ``--enable-return-hidden-states``) kills the server in every ``--pp-mode``: SGLang's
prefill result processing reads the hidden states of a logits output that a rank without the
last stage does not have (``AttributeError`` on ``None``). The guard turns
each into an ``InputRejectedError`` (a ``ValueError``), which SGLang's HTTP and OpenAI-compatible
handlers answer with status 400 and the message; the server keeps serving. On a decode server of
a prefill-decode split the same hook refuses a bootstrap address that cannot work (``pd_guard.py``);
on a prefill server, a bootstrap room its scheduler cannot hold (``pd_guard.py``) and a request
whose room its decode server already refused (``pd_drop.py``).

Data flow (the HTTP server process, where the TokenizerManager lives)::

    /generate, /v1/completions, /v1/chat/completions  (single or batch)
      TokenizerManager._tokenize_one_request / _batch_tokenize_and_process
        -> TokenizerManager._validate_one_request(obj, input_ids)
             [BEFORE hook: check_request_tokens: the prompt's ids (unless it sends
              embeddings), top_logprobs_num, a hidden-states request under PP, a PD
              decode server's bootstrap address, a PD prefill server's room out of range
              or refused]
               -> InputRejectedError -> HTTP 400
      (a batch whose later item is refused: SGLang aborts the items already dispatched)

Every ``--pp-mode`` gets the guard, the stock ones included: the hook is registered by
``entry.register()`` in every process that loads the plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang_vpp.sglang_plugin.errors import InputRejectedError, PluginError
from sglang_vpp.sglang_plugin.pd_drop import check_refused_room
from sglang_vpp.sglang_plugin.pd_guard import check_bootstrap_address, check_prefill_room

__all__ = [
    "VALIDATE_REQUEST_TARGET",
    "check_hidden_states_request",
    "check_logprob_options",
    "check_request_tokens",
    "check_token_ids",
    "verify_guard_installed",
]

VALIDATE_REQUEST_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"

_MAX_IDS_SHOWN = 3


def check_token_ids(input_ids: Sequence[Any] | None, vocab_size: int, also_allowed: frozenset[int] = frozenset()) -> None:
    """Raise InputRejectedError unless ``input_ids`` is a non-empty flat list of ids in range
    (or in ``also_allowed``: a multimodal placeholder the model embeds past its vocabulary)."""
    if input_ids is None or len(input_ids) == 0:
        raise InputRejectedError(
            "the prompt has no tokens after tokenization (empty text or empty input_ids); "
            "send at least one token"
        )
    not_ints = [value for value in input_ids if type(value) is not int]  # bool is not an id
    if not_ints:
        shown = ", ".join(repr(value) for value in not_ints[:_MAX_IDS_SHOWN])
        raise InputRejectedError(
            f"input_ids must be a flat list of integer token ids; got {shown} "
            f"({len(not_ints)} non-integer entries); send one list of ints per prompt "
            "(a list of lists is a batch)"
        )
    out_of_range = [value for value in input_ids if not 0 <= value < vocab_size and value not in also_allowed]
    if out_of_range:
        shown = ", ".join(str(value) for value in out_of_range[:_MAX_IDS_SHOWN])
        raise InputRejectedError(
            f"token ids must lie in [0, {vocab_size}) for this model's vocabulary; got {shown} "
            f"({len(out_of_range)} out of range)"
        )


def check_logprob_options(obj: Any, vocab_size: int) -> None:
    """Raise InputRejectedError unless a logprob request's ``top_logprobs_num`` fits the vocabulary.

    Only a request that returns logprobs reaches the code that reads it; without
    ``return_logprob`` SGLang ignores the option, and so does the guard."""
    if not getattr(obj, "return_logprob", False):
        return
    top = getattr(obj, "top_logprobs_num", None) or 0
    if type(top) is not int or not 0 <= top <= vocab_size:
        raise InputRejectedError(
            f"top_logprobs_num (OpenAI: logprobs / top_logprobs) must be an integer in [0, {vocab_size}], "
            f"this model's vocabulary size; got {top!r}"
        )


_NO_HIDDEN_STATES = ("", "none", "null", "false")


def check_hidden_states_request(obj: Any, pp_size: int) -> None:
    """Raise InputRejectedError for a hidden-states request to a pipeline of more than one rank."""
    mode = getattr(obj, "return_hidden_states", False)
    if pp_size > 1 and mode and str(mode).lower() not in _NO_HIDDEN_STATES:
        raise InputRejectedError(
            f"return_hidden_states is not served with --pp-size {pp_size} (SGLang 0.5.23's pipeline "
            "ranks without the last stage fail on it); drop return_hidden_states, or serve with --pp-size 1"
        )


def _input_vocab_size(model_config: Any) -> int:
    """The token ids the input embedding holds. ``ModelConfig.vocab_size`` is the output head's
    size, which is below the text tokens' ids for a model that predicts another vocabulary
    (GLM-Image: ``vision_vocab_size``); the text config's ``vocab_size`` is the embedding's."""
    size = int(model_config.vocab_size)
    text_size = getattr(getattr(model_config, "hf_text_config", None), "vocab_size", None)
    return max(size, text_size) if type(text_size) is int else size


_PLACEHOLDER_FIELDS = ("image_token_id", "video_token_id", "audio_token_id")


def _placeholder_ids(manager: Any, obj: Any) -> frozenset[int]:
    """The multimodal processor's placeholder token ids, for a request with multimodal input: a
    model may embed them past its text vocabulary (Llama 3.2 Vision: ``<|image|>`` is id 128256 of
    a 128256-token vocabulary; its embedding has 8 rows more)."""
    contains = getattr(obj, "contains_mm_input", None)
    if not callable(contains) or not contains():
        return frozenset()
    tokens = getattr(getattr(manager, "mm_processor", None), "mm_tokens", None)
    ids = (getattr(tokens, name, None) for name in _PLACEHOLDER_FIELDS)
    return frozenset(value for value in ids if type(value) is int and value >= 0)


def check_request_tokens(manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``TokenizerManager._validate_one_request(self, obj, input_ids)``."""
    vocab_size = int(manager.model_config.vocab_size)  # the sampler's: what top_logprobs_num indexes
    if getattr(obj, "input_embeds", None) is None:  # embeddings replace the lookup; SGLang checks their shape
        check_token_ids(input_ids, _input_vocab_size(manager.model_config), _placeholder_ids(manager, obj))
    check_logprob_options(obj, vocab_size)
    check_hidden_states_request(obj, int(getattr(getattr(manager, "server_args", None), "pp_size", 1) or 1))
    check_bootstrap_address(manager, obj)
    check_prefill_room(manager, obj)
    check_refused_room(manager, obj)
    return None


class _ProbeRequest:
    input_embeds = None


class _ProbeManager:
    class model_config:  # noqa: N801 - mimics the attribute path TokenizerManager has
        vocab_size = 1


def verify_guard_installed() -> None:
    """Raise PluginError unless the hook is in SGLang's request path (HookRegistry logs and
    skips a target it cannot patch, which would leave the server open to crashing inputs)."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    try:
        # An empty prompt is refused by the hook before SGLang's own code runs.
        TokenizerManager._validate_one_request(_ProbeManager(), _ProbeRequest(), [])
    except InputRejectedError:
        return
    except Exception:  # noqa: BLE001 - reached SGLang's own body: the hook is missing
        pass
    raise PluginError(
        f"the input guard hook on {VALIDATE_REQUEST_TARGET} is not in place (SGLang logged "
        "'Failed to apply hooks' above?); this SGLang build does not match the plugin: "
        "install sglang==0.5.23"
    )
