"""A prefill-decode split through SGLang's router on CPU (Mooncake over TCP).

One decode server (pp 1) serves every prefill server of the module in turn; the router is
restarted for each prefill server and waited on until a request through it succeeds. Four
prompts of different lengths (several chunks of 64 each; the last one sent while the others are
in prefill) go through the router concurrently: the decode server's greedy ids must equal
transformers' greedy continuation, for every prefill server.
"""

from __future__ import annotations

import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, get_json, post_json

from sglang_vpp.models.tiny_hf import TinyModelSpec
from sglang_vpp.serving.pd_launcher import PdDeployment, decode_config, prefill_config
from sglang_vpp.serving.launcher import free_port

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD]

CHUNK = 64
PROMPT_LENGTHS = (300, 200, 150, 130)
"""3 to 5 chunks of 64 each; the last one is sent while the first three are in prefill."""
LATE_DELAY_S = 1.0
NUM_NEW_TOKENS = 8
MODEL = TinyModelSpec("qwen2-tiny")

PREFILLS = {
    "cpp-pp2": dict(pp_size=2, pp_mode="cpp"),
}


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model(MODEL)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    import random

    rng = random.Random(1919)
    return [[rng.randrange(2, 10000) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompts) -> list[list[int]]:
    import torch
    from transformers import GenerationConfig

    from sglang_vpp.models.tiny_hf import load_transformers_model

    model = load_transformers_model(model_dir)
    config = GenerationConfig(max_new_tokens=NUM_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=1)
    with torch.no_grad():
        return [model.generate(torch.tensor([ids]), generation_config=config)[0, len(ids):].tolist()
                for ids in prompts]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, model_dir: Path):
    pd = PdDeployment(log_dir=tmp_path_factory.mktemp("pd-logs"))
    try:
        pd.start_decode(decode_config(ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK)))
        yield pd
    finally:
        pd.stop()


@pytest.fixture(scope="module", params=list(PREFILLS), ids=list(PREFILLS))
def router(request, deployment: PdDeployment, model_dir: Path):
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, **PREFILLS[request.param])
    return deployment.serve_prefill(prefill_config(base, bootstrap_port=free_port()))


def _generate(url: str, ids: list[int]) -> dict:
    return post_json(url + "/generate", {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW_TOKENS, "ignore_eos": True},
    }, timeout=600)  # fmt: skip


def test_concurrent_prompts_equal_transformers(router, deployment, prompts, reference):
    with ThreadPoolExecutor(len(prompts)) as pool:
        early = [pool.submit(_generate, router.url, ids) for ids in prompts[:-1]]
        time.sleep(LATE_DELAY_S)
        late = pool.submit(_generate, router.url, prompts[-1])
        answers = [f.result() for f in early + [late]]
    for ids, answer, expected in zip(prompts, answers, reference):
        assert answer["output_ids"] == expected, (
            f"prompt of {len(ids)} tokens: PD {answer['output_ids']} != transformers {expected}; "
            f"prefill log tail:\n{deployment.prefill.log_tail(3000)}\ndecode log tail:\n"
            f"{deployment.decode.log_tail(3000)}"
        )
