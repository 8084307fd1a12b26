"""``pd_checks.four_prompts`` against a stub ``/generate``: after a prefill-side failure that names
no reason, the four prompts are sent again (a warning, KV back to 0 first) only as often as the
test allows; any other failure, or one that comes back every time, fails the test; and
``server_evidence`` shows the lines naming trouble of both servers' logs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pd_checks
import pytest
from pd_checks import PREFILL_FAILED_NO_REASON, TransferRetryWarning, four_prompts, server_evidence

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


class _Server:
    def __init__(self, log_path):
        self.log_path = log_path

    def log_tail(self, num_chars: int) -> str:
        return self.log_path.read_text()[-num_chars:]


@pytest.fixture
def deployment(tmp_path):
    prefill, decode = tmp_path / "prefill.log", tmp_path / "decode.log"
    prefill.write_text("ready timeout=" + "x" * 5000 + "\nSync batch data transfer timeout after 30 s\n"
                       + "busy\n" * 1000 + "idle\n")
    decode.write_text("Decode transfer failed\nidle\n")
    return SimpleNamespace(prefill=_Server(prefill), decode=_Server(decode), router=None)


@pytest.fixture
def kv_checks(monkeypatch) -> list:
    checked = []
    monkeypatch.setattr(pd_checks, "assert_kv_idle", lambda *servers, **kwargs: checked.append(servers))
    return checked


@pytest.fixture
def make_stub(monkeypatch):
    monkeypatch.setattr(pd_checks, "LATE_DELAY_S", 0.0)
    monkeypatch.setattr(pd_checks, "RESEND_PAUSE_S", 0.0)
    stubs = []

    def make(error: str, failures: int) -> _Stub:
        stubs.append(_Stub(PROMPTS[1], error, failures))
        return stubs[-1]

    yield make
    for stub in stubs:
        stub.server.shutdown()
        stub.server.server_close()


NO_REASON = f"Decode transfer failed: {PREFILL_FAILED_NO_REASON}, it might be dead"


def test_a_failure_without_reason_sends_all_four_again_after_kv_is_idle(make_stub, deployment, kv_checks):
    stub = make_stub(NO_REASON, failures=2)
    with pytest.warns(TransferRetryWarning, match=r"(?s)prompts \[1\] of 4 failed .*Sync batch data transfer timeout"):
        answers = four_prompts(stub.url, PROMPTS, deployment, resends=2)
    assert answers == [ids[::-1] for ids in PROMPTS]
    assert all(stub.calls[tuple(ids)] == 3 for ids in PROMPTS), stub.calls
    assert len(kv_checks) == 2


def test_without_resends_a_failure_fails_and_names_the_prompt_and_the_evidence(make_stub, deployment, kv_checks):
    stub = make_stub(NO_REASON, failures=1)
    with pytest.raises(AssertionError, match=r"(?s)prompts \[1\] of 4 failed.*Sync batch data transfer timeout"):
        four_prompts(stub.url, PROMPTS, deployment)
    assert not kv_checks


def test_another_error_is_never_sent_again(make_stub, deployment, kv_checks):
    stub = make_stub("Lost connection with prefill instance", failures=1)
    with pytest.raises(AssertionError, match="Lost connection"):
        four_prompts(stub.url, PROMPTS, deployment, resends=2)
    assert stub.calls[tuple(PROMPTS[1])] == 1 and not kv_checks


def test_a_failure_that_comes_back_every_time_fails(make_stub, deployment, kv_checks):
    stub = make_stub(NO_REASON, failures=10**6)
    with pytest.warns(TransferRetryWarning), pytest.raises(AssertionError, match=r"try 3 of 3"):
        four_prompts(stub.url, PROMPTS, deployment, resends=2)
    assert stub.calls[tuple(PROMPTS[1])] == 3


def test_resends_need_the_deployment(make_stub):
    with pytest.raises(ValueError, match="needs the deployment"):
        four_prompts(make_stub(NO_REASON, failures=0).url, PROMPTS, resends=1)


def test_the_evidence_keeps_trouble_from_far_above_the_tail_and_cuts_long_lines(deployment):
    evidence = server_evidence(deployment, tail_chars=10)
    assert "Sync batch data transfer timeout" in evidence and "Decode transfer failed" in evidence
    assert "x" * (pd_checks.EVIDENCE_LINE_CHARS + 1) not in evidence
    assert server_evidence(None) == ""


def test_the_evidence_takes_in_the_router_and_any_other_launch(deployment, tmp_path):
    (tmp_path / "router.log").write_text("router: request failed with 500\nok\n")
    (tmp_path / "node1.log").write_text("node 1: KV send failed\nok\n")
    deployment.router = _Server(tmp_path / "router.log")
    evidence = server_evidence(deployment, extra=(("prefill node 1", _Server(tmp_path / "node1.log")),))
    assert "router log, lines naming trouble:\nrouter: request failed with 500" in evidence
    assert "prefill node 1 log, lines naming trouble:\nnode 1: KV send failed" in evidence
