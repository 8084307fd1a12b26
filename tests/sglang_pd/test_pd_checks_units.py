"""``pd_checks.four_prompts`` against a stub ``/generate``: a prompt failed by a KV transfer alone
is sent again (with a warning) only when the test asks for it, and any other failure, or a transfer
failure that persists past the bound, fails the test."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pd_checks
import pytest
from pd_checks import MOONCAKE_TRANSFER_FAILED, four_prompts

PROMPTS = [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10]]


class _Stub:
    """Answers each prompt with its ids reversed; the prompt ``fail_ids`` gets ``error`` (500) for
    its first ``failures`` requests."""

    def __init__(self, fail_ids: list[int], error: str, failures: int):
        self.fail_ids, self.error, self.failures = fail_ids, error, failures
        self.calls: dict[tuple[int, ...], int] = {}
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                ids = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input_ids"]
                key = tuple(ids)
                stub.calls[key] = stub.calls.get(key, 0) + 1
                if ids == stub.fail_ids and stub.calls[key] <= stub.failures:
                    status, body = 500, {"error": {"message": stub.error}}
                else:
                    status, body = 200, {"output_ids": ids[::-1]}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub_of(monkeypatch):
    monkeypatch.setattr(pd_checks, "LATE_DELAY_S", 0.0)
    monkeypatch.setattr(pd_checks, "TRANSFER_RETRY_PAUSE_S", 0.0)
    stubs = []

    def make(error: str, failures: int) -> _Stub:
        stubs.append(_Stub(PROMPTS[1], error, failures))
        return stubs[-1]

    yield make
    for stub in stubs:
        stub.server.shutdown()


def test_a_transfer_failure_is_retried_with_a_warning_when_asked(stub_of):
    stub = stub_of(f"Decode transfer failed: {MOONCAKE_TRANSFER_FAILED}, it might be dead", failures=2)
    with pytest.warns(UserWarning, match="failed by its KV transfer alone"):
        answers = four_prompts(stub.url, PROMPTS, transfer_retry_s=60.0)
    assert answers == [ids[::-1] for ids in PROMPTS]
    assert stub.calls[tuple(PROMPTS[1])] == 3


def test_without_retry_a_transfer_failure_fails_and_names_the_prompt(stub_of):
    stub = stub_of(MOONCAKE_TRANSFER_FAILED, failures=1)
    with pytest.raises(AssertionError, match=r"prompts \[1\] of 4 failed"):
        four_prompts(stub.url, PROMPTS)


def test_another_error_is_never_retried(stub_of):
    stub = stub_of("Lost connection with prefill instance", failures=1)
    with pytest.raises(AssertionError, match="Lost connection"):
        four_prompts(stub.url, PROMPTS, transfer_retry_s=60.0)
    assert stub.calls[tuple(PROMPTS[1])] == 1


def test_a_transfer_failure_past_the_bound_fails(stub_of):
    stub = stub_of(MOONCAKE_TRANSFER_FAILED, failures=10**6)
    with pytest.warns(UserWarning), pytest.raises(AssertionError, match="failed again"):
        four_prompts(stub.url, PROMPTS, transfer_retry_s=0.2)
