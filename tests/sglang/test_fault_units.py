"""Unit checks of the guard, the failure report, the stock-loop watchdog and error wording.

No server: SGLang's classes are not needed for these (the hooks take plain objects).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types

import pytest

from sglang_vpp.comm.errors import CommTimeoutError, PeerDeadError
from sglang_vpp.comm.gloo import classify_gloo_error
from sglang_vpp.sglang_plugin import failure_report
from sglang_vpp.sglang_plugin.cli_args import check_pp_mode_name
from sglang_vpp.sglang_plugin.errors import InputRejectedError, PpModeError
from sglang_vpp.sglang_plugin.failure_report import RankRecord, describe_exit, parse_scheduler_title
from sglang_vpp.sglang_plugin.input_guard import (
    check_hidden_states_request,
    check_logprob_options,
    check_request_tokens,
    check_token_ids,
)
from sglang_vpp.sglang_plugin.stock_loop_watchdog import RankProcessState, StockLoopWatchdog


@pytest.mark.parametrize(
    "ids,message",
    [([], "no tokens"), (None, "no tokens"), ([1, 10], "[0, 10)"), ([-1], "got -1"),
     ([1, "2"], "integer token ids"), ([[1, 2]], "integer token ids"), ([True], "integer token ids")],
)  # fmt: skip
def test_guard_refuses(ids, message):
    with pytest.raises(InputRejectedError) as info:
        check_token_ids(ids, vocab_size=10)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)  # SGLang answers ValueError with HTTP 400


class _Manager:
    """What the guard reads of SGLang's TokenizerManager: the vocabulary and the server's pp size."""

    class model_config:  # noqa: N801 - the attribute path TokenizerManager has
        vocab_size = 10

    class server_args:  # noqa: N801
        pp_size = 2
        disaggregation_mode = "null"


class _Embeds:
    """A request that sends embeddings instead of token ids."""

    def __init__(self, return_logprob=False, top_logprobs_num=0, return_hidden_states=False):
        self.input_embeds = [[0.0]]
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num
        self.return_hidden_states = return_hidden_states


def test_guard_accepts_the_vocabulary_bounds_and_skips_the_ids_of_embeddings():
    check_token_ids([0, 9], vocab_size=10)
    check_request_tokens(_Manager(), _Embeds(), None)  # embeddings carry no ids to check


class _Prompt:
    """A token-id request, with or without multimodal input."""

    input_embeds = None
    return_logprob = False
    return_hidden_states = False

    def __init__(self, multimodal=False):
        self._multimodal = multimodal

    def contains_mm_input(self):
        return self._multimodal


def _model_manager(vocab_size, text_vocab_size, image_token_id=None):
    """A TokenizerManager of a model whose output vocabulary, input embedding and multimodal
    placeholder are given (SGLang's ModelConfig.vocab_size is the output head's size)."""
    manager = types.SimpleNamespace(
        model_config=types.SimpleNamespace(vocab_size=vocab_size,
                                           hf_text_config=types.SimpleNamespace(vocab_size=text_vocab_size)),
        server_args=types.SimpleNamespace(pp_size=1, disaggregation_mode="null"),
    )
    if image_token_id is not None:
        manager.mm_processor = types.SimpleNamespace(
            mm_tokens=types.SimpleNamespace(image_token_id=image_token_id, video_token_id=None, audio_token_id=None))
    return manager


def test_guard_accepts_a_multimodal_placeholder_past_the_vocabulary():
    # Llama 3.2 Vision: <|image|> is id 128256 of a 128256-token text vocabulary (embedding: 8 rows more).
    mllama = _model_manager(128256, 128256, image_token_id=128256)
    check_request_tokens(mllama, _Prompt(multimodal=True), [128000, 128256, 9906])
    with pytest.raises(InputRejectedError, match="128257"):  # any other id past the vocabulary still is refused
        check_request_tokens(mllama, _Prompt(multimodal=True), [128256, 128257])
    with pytest.raises(InputRejectedError, match="128256"):  # no image: no placeholder expected
        check_request_tokens(mllama, _Prompt(), [128256])


def test_guard_bounds_prompt_ids_by_the_input_embedding_not_the_output_head():
    # GLM-Image: the head predicts 16512 vision tokens; prompts are text ids of a 168064-token embedding.
    glm_image = _model_manager(16512, 168064)
    check_request_tokens(glm_image, _Prompt(), [100000, 168063])
    with pytest.raises(InputRejectedError, match=r"\[0, 168064\)"):
        check_request_tokens(glm_image, _Prompt(), [168064])


@pytest.mark.parametrize(
    "request_,message",
    [(_Embeds(return_logprob=True, top_logprobs_num=11), "top_logprobs_num"),
     (_Embeds(return_hidden_states=True), "--pp-size 2")],
)  # fmt: skip
def test_guard_checks_the_other_options_of_an_embeddings_request(request_, message):
    with pytest.raises(InputRejectedError) as info:
        check_request_tokens(_Manager(), request_, None)
    assert message in str(info.value)


class _Logprobs:
    """The logprob fields of one GenerateReqInput item as the guard sees them."""

    def __init__(self, return_logprob=True, top_logprobs_num=0):
        self.return_logprob = return_logprob
        self.top_logprobs_num = top_logprobs_num


@pytest.mark.parametrize(
    "options,message",
    [(_Logprobs(top_logprobs_num=11), "top_logprobs_num"), (_Logprobs(top_logprobs_num=-1), "got -1"),
     (_Logprobs(top_logprobs_num="3"), "got '3'")],
)  # fmt: skip
def test_guard_refuses_logprob_options_the_sampler_cannot_serve(options, message):
    with pytest.raises(InputRejectedError) as info:
        check_logprob_options(options, vocab_size=10)
    assert message in str(info.value) and "[0, 10" in str(info.value)


def test_guard_accepts_logprob_options_within_the_vocabulary():
    check_logprob_options(_Logprobs(top_logprobs_num=10), vocab_size=10)
    check_logprob_options(_Logprobs(top_logprobs_num=None), vocab_size=10)
    # SGLang does not read the option without return_logprob, so the guard does not either.
    check_logprob_options(_Logprobs(return_logprob=False, top_logprobs_num=10**6), vocab_size=10)


class _HiddenStates:
    def __init__(self, mode):
        self.return_hidden_states = mode


@pytest.mark.parametrize("mode", [True, "last", "full", ["last", False]])
def test_guard_refuses_hidden_states_under_pp(mode):
    with pytest.raises(InputRejectedError) as info:
        check_hidden_states_request(_HiddenStates(mode), pp_size=2)
    assert "--pp-size 2" in str(info.value) and "return_hidden_states" in str(info.value)


def test_guard_passes_hidden_states_without_pp_and_no_request_under_pp():
    check_hidden_states_request(_HiddenStates("full"), pp_size=1)
    for mode in (False, None, "none"):
        check_hidden_states_request(_HiddenStates(mode), pp_size=3)


def test_unknown_pp_mode_is_one_line_listing_the_choices():
    with pytest.raises(PpModeError) as info:
        check_pp_mode_name("bogus")
    text = str(info.value)
    assert "'bogus'" in text and "cpp, dcpp, vpp, vpp-async, vpp-pack, vpp-taper, vpp-stream" in text and "\n" not in text
    check_pp_mode_name("vpp-pack")


@pytest.mark.parametrize(
    "title,ranks",
    [("sglang::scheduler_PP1", (1, 0)), ("sglang::scheduler_PP0_TP3", (0, 3)), ("sglang::scheduler", (0, 0)),
     ("sglang::scheduler_DP0_PP2_ATTN_CP1_TP1", (2, 1)), ("sglang::detokenizer", None)],
)  # fmt: skip
def test_scheduler_title(title, ranks):
    assert parse_scheduler_title(title) == ranks


def test_exit_wording():
    assert describe_exit(sig=9) == "killed by signal 9 (SIGKILL)"
    assert describe_exit(code=1) == "exited with code 1"


def test_report_names_a_killed_child_without_collecting_it(caplog, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGKILL)
        os.kill(stopped.pid, signal.SIGSTOP)
        time.sleep(0.5)
        ranks = [RankRecord(1, 0, 0, child.pid), RankRecord(0, 0, 0, stopped.pid), RankRecord(0, 1, 0, alive.pid)]
        monkeypatch.setattr(failure_report, "_ranks", ranks)
        with caplog.at_level("ERROR"):
            failure_report.report_failed_ranks()
        lines = [r.getMessage() for r in caplog.records]
        assert f"sglang-vpp: pipeline rank failed: pp_rank=1 tp_rank=0 node=0 pid={child.pid} killed by signal 9 (SIGKILL)" in lines
        assert any(f"pid={stopped.pid} is stopped" in line for line in lines)
        assert not any(f"pid={alive.pid}" in line for line in lines)
        assert child.wait(5) == -9  # still collectable: the report peeked with WNOWAIT
    finally:
        for process in (child, stopped, alive):
            process.kill()
            process.wait(5)


_TEARDOWN_THAT_ABORTS = """
import atexit, logging, os, signal, sys, threading, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
# Stand in for native teardown that aborts (a joinable thread destroyed): an exit handler
# registered first, as a library imported at start-up would register it, and the scheduler's
# own destructor.
atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))
from sglang_vpp.sglang_plugin.rank_exit import around_run_event_loop

class Scheduler:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGABRT)

def loop(scheduler):
    if sys.argv[1] == "raise":
        # a worker still busy (a transfer's thread pool): the interpreter would join it first
        threading.Thread(target=time.sleep, args=(60,)).start()
        raise RuntimeError("peer is gone")
    if sys.argv[1] == "exit":
        sys.exit(3)

def run_scheduler_process():
    scheduler = Scheduler()  # freed when this returns, as in SGLang
    try:
        around_run_event_loop(loop, scheduler)
    except RuntimeError:
        logging.getLogger("scheduler").error("Scheduler hit an exception")  # SGLang's except path
    logging.getLogger("scheduler").info("returned")

run_scheduler_process()
"""


@pytest.mark.parametrize("loop, code", [("raise", 0), ("return", -signal.SIGABRT), ("exit", -signal.SIGABRT)])
def test_a_scheduler_whose_loop_raised_exits_with_code_0_before_native_teardown(loop, code):
    """After the loop raised, the process ends with exit code 0 (what the failure report reads as
    a rank that ended itself) and its log is flushed, whatever the teardown would have done (the
    scheduler object is not destroyed first, a busy thread is not waited for); a loop that
    returned, or ended with SystemExit (its code is the launcher's to read), leaves the teardown
    alone."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _TEARDOWN_THAT_ABORTS, loop], capture_output=True, text=True,
                          timeout=50)
    assert time.monotonic() - began < 40
    assert done.returncode == code, done.stderr
    assert ("returned" in done.stderr) == (loop != "exit")
    assert ("Scheduler hit an exception" in done.stderr) == (loop == "raise")


def test_the_quick_exit_unlinks_the_shared_memory_its_process_created():
    """No destructor runs after a loop that raised, so the segments SGLang created in this process
    (pid-stamped names) are unlinked by the exit handler; another process's stay."""
    from multiprocessing import shared_memory

    from sglang_vpp.sglang_plugin.rank_exit import unlink_own_shared_memory

    own = shared_memory.SharedMemory(create=True, size=4096, name=f"sgl_shm_mq_{os.getpid()}_0a1b2c3d")
    other = shared_memory.SharedMemory(create=True, size=4096, name=f"sgl_shm_mq_{os.getppid()}_0a1b2c3d")
    try:
        assert unlink_own_shared_memory() >= 1
        assert not os.path.exists(f"/dev/shm/{own.name.lstrip('/')}")
        assert os.path.exists(f"/dev/shm/{other.name.lstrip('/')}")
    finally:
        own.close()
        other.close()
        other.unlink()
        if os.path.exists(f"/dev/shm/{own.name.lstrip('/')}"):
            own.unlink()


def _ranks(*states):
    return lambda: [RankProcessState(pid, status, cpu) for pid, status, cpu in states]


def test_stock_watchdog_fires_once_when_a_rank_is_stopped(monkeypatch):
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    clock = {"cpu": 0.0}
    watchdog = StockLoopWatchdog(
        timeout_s=0.2, describe_rank=lambda: "pp_rank=1 tp_rank=0",
        ranks=lambda: [RankProcessState(1, "sleeping", clock["cpu"]), RankProcessState(2, "stopped", 3.0)],
    )  # fmt: skip
    for _ in range(5):  # a loop that keeps coming round does not fire
        watchdog.beat()
        time.sleep(0.05)
    assert sent == []
    time.sleep(0.6)  # then the loop blocks, a peer being stopped
    assert sent == [(os.getppid(), signal.SIGQUIT)]


def test_stock_watchdog_waits_for_a_peer_that_computes():
    cpu = {"s": 0.0}

    def computing():
        cpu["s"] += 0.5  # a peer busy in a long forward
        return [RankProcessState(1, "sleeping", 0.0), RankProcessState(2, "running", cpu["s"])]

    watchdog = StockLoopWatchdog(timeout_s=1.0, ranks=computing)
    watchdog._last_beat = 0.0
    assert all(watchdog.check(now) is None for now in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0))


def test_stock_watchdog_fires_when_nobody_computes_or_a_rank_vanished():
    idle = StockLoopWatchdog(timeout_s=1.0, ranks=_ranks((1, "sleeping", 2.0), (2, "sleeping", 2.0)))
    idle._last_beat = 0.0
    results = [idle.check(now) for now in (0.5, 1.0, 1.5, 2.0)]
    assert results[:2] == [None, None] and "no rank process computed" in results[-1]
    states = [[RankProcessState(1, "sleeping", 0.0), RankProcessState(2, "running", 0.0)],
              [RankProcessState(1, "sleeping", 0.0)]]  # fmt: skip
    reaped = StockLoopWatchdog(timeout_s=1.0, ranks=lambda: list(states.pop(0) if len(states) > 1 else states[0]))
    reaped._last_beat = 0.0
    assert reaped.check(0.5) is None
    assert "pid=2 is gone" in reaped.check(1.5)


def test_transport_errors_carry_our_words_and_keep_the_backend_text_as_cause():
    backend = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234 GLHF")
    error = classify_gloo_error(backend, 5.0)
    assert isinstance(error, PeerDeadError)
    assert "GLHF" not in str(error) and "pair.cc" not in str(error)
    assert "died" in str(error) and "read the peer" not in str(error)
    assert error.__cause__ is backend
    timeout = classify_gloo_error(RuntimeError("Timed out waiting 5000ms for recv operation to complete"), 5.0)
    assert isinstance(timeout, CommTimeoutError) and "5000ms" not in str(timeout)


def test_sigquit_answers_pending_clients_before_the_tree_is_killed(monkeypatch):
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    events: list[tuple[str, float]] = []

    class Manager:
        event_loop = loop
        rid_to_state = {"r1": object()}

    class Handler:
        tokenizer_manager = Manager()

    monkeypatch.setattr(failure_report, "_ranks", [])
    monkeypatch.setattr(failure_report, "_stopping", False)
    monkeypatch.setattr(failure_report, "PENDING_GRACE_S", 0.3)
    monkeypatch.setattr(
        failure_report, "_fail_pending_requests", lambda manager, message: events.append(("fail", time.monotonic()))
    )
    try:
        began = time.monotonic()
        kill = lambda handler, *a: events.append(("kill", time.monotonic()))  # noqa: E731
        failure_report.around_sigquit_handler(kill, Handler(), signal.SIGQUIT, None)
        failure_report.around_sigquit_handler(kill, Handler(), signal.SIGQUIT, None)  # once only
        time.sleep(0.8)
        assert [name for name, _ in events] == ["fail", "kill"]
        assert events[1][1] - began >= 0.3
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_sigquit_without_a_running_loop_kills_at_once(monkeypatch):
    calls = []
    monkeypatch.setattr(failure_report, "_ranks", [])
    monkeypatch.setattr(failure_report, "_stopping", False)
    failure_report.around_sigquit_handler(lambda handler, *a: calls.append(a), object(), signal.SIGQUIT, None)
    assert calls == [(signal.SIGQUIT, None)]


def test_report_waits_for_a_rank_whose_death_is_not_yet_visible(monkeypatch, caplog):
    """A survivor can report its dead peer before the killed process's exit status exists."""
    import threading

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(failure_report, "_ranks", [RankRecord(0, 0, 0, child.pid)])
        threading.Timer(0.3, os.kill, args=(child.pid, signal.SIGKILL)).start()
        with caplog.at_level("ERROR"):
            described = failure_report.report_failed_ranks(settle_s=5.0)
        assert described == [f"pp_rank=0 tp_rank=0 node=0 pid={child.pid} killed by signal 9 (SIGKILL)"]
        assert not any("still running" in r.getMessage() for r in caplog.records)
    finally:
        child.kill()
        child.wait(5)


def test_a_rank_that_ended_itself_is_not_reported_as_the_failure(monkeypatch, caplog):
    """A survivor exits with code 0 after logging the peer failure it saw. Beside a killed rank
    it is "ended", not "failed"; alone (the killed rank on another node) the report says that
    no rank of this launcher failed and where to look."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ended.wait(10)  # collected: the report reads its Process's exit code, as after SGLang's watchdog
        process = types.SimpleNamespace(exitcode=0)
        survivor = RankRecord(0, 0, 0, ended.pid, process)
        os.kill(killed.pid, signal.SIGKILL)
        time.sleep(0.3)
        monkeypatch.setattr(failure_report, "_ranks", [survivor, RankRecord(1, 0, 0, killed.pid)])
        with caplog.at_level("ERROR"):
            described = failure_report.report_failed_ranks(settle_s=0.2)
        lines = [r.getMessage() for r in caplog.records]
        assert described == [f"pp_rank=1 tp_rank=0 node=0 pid={killed.pid} killed by signal 9 (SIGKILL)"]
        assert f"sglang-vpp: pipeline rank ended: pp_rank=0 tp_rank=0 node=0 pid={ended.pid} exited with code 0 " \
               "after the error it logged above" in lines
        assert not any("pipeline rank failed" in line and f"pid={ended.pid}" in line for line in lines)
        assert not any("no pipeline rank of this launcher" in line for line in lines)

        caplog.clear()
        monkeypatch.setattr(failure_report, "_ranks", [survivor])
        began = time.monotonic()
        with caplog.at_level("ERROR"):
            described = failure_report.report_failed_ranks(settle_s=0.5)
        assert time.monotonic() - began >= 0.5, "an ended rank alone must not cut the wait for the failed one"
        assert described == [f"pp_rank=0 tp_rank=0 node=0 pid={ended.pid} exited with code 0 after the error it "
                             "logged: the failure is the peer it names, maybe on another node"]
        assert any("no pipeline rank of this launcher was killed" in r.getMessage() and "--nnodes" in r.getMessage()
                   for r in caplog.records)
    finally:
        killed.kill()
        killed.wait(5)


def test_report_says_every_rank_still_runs_after_the_settle_time(monkeypatch, caplog):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(failure_report, "_ranks", [RankRecord(1, 0, 0, alive.pid)])
        with caplog.at_level("ERROR"):
            assert failure_report.report_failed_ranks(settle_s=0.2) == []
        assert any("every pipeline rank process is still running" in r.getMessage() for r in caplog.records)
    finally:
        alive.kill()
        alive.wait(5)
