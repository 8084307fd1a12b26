"""Shared pytest options and hooks.

- ``--update-golden`` rewrites golden files instead of comparing.
- After each test, an SGLang server that the next test will not use is stopped
  (``sglang_harness.close_idle_pools``).
- The summary counts the SGLang servers this process started and the seconds they took to
  start, and names configurations started more than once (drawn ports and tmp paths aside;
  the model by its directory's name): server start-up is most of the suite's time, and a
  configuration started twice is one that test order or a shared fixture could reuse.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import pytest

_SERVER_STARTS: list[tuple[object, float]] = []
"""(configuration, seconds from spawn to healthy or failure) of each SGLang server started here."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current code instead of comparing")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's fixtures are torn down: stop an SGLang server nobody needs next."""
    result = yield
    harness = sys.modules.get("sglang_harness")  # imported by the server tests' conftest
    if harness is not None:
        harness.close_idle_pools(item, nextitem)
    return result


def pytest_configure(config: pytest.Config) -> None:
    """Record every SGLang server start of this process (``_SERVER_STARTS``)."""
    from sglang_vpp.serving.launcher import SGLangServer

    original = SGLangServer.start
    if getattr(original, "_counted", False):
        return

    def start(self, *args, **kwargs):
        began = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            _SERVER_STARTS.append((self.config, time.monotonic() - began))

    start._counted = True  # type: ignore[attr-defined]
    SGLangServer.start = start  # type: ignore[method-assign]


_DRAWN_ARGS = frozenset({"--nccl-port", "--disaggregation-bootstrap-port", "--dist-init-addr", "--port", "--vpp-trace"})
"""Flags whose values tests draw per launch (free ports, tmp paths): not part of what a start is."""


def _start_key(config) -> str:
    """A server configuration with its drawn ports and paths left out."""
    args = list(getattr(config, "extra_args", ()))
    kept = [arg for i, arg in enumerate(args) if not (i and args[i - 1] in _DRAWN_ARGS)]
    model = getattr(config, "model_dir", "")
    return repr((model.rsplit("/", 1)[-1], getattr(config, "pp_size", None), getattr(config, "pp_mode", None),
                 getattr(config, "chunked_prefill_size", None), tuple(kept)))


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SERVER_STARTS:
        return
    total = sum(seconds for _, seconds in _SERVER_STARTS)
    counts = Counter(_start_key(config) for config, _ in _SERVER_STARTS)
    again = {key: n for key, n in counts.items() if n > 1}
    again_s = sum(seconds for config, seconds in _SERVER_STARTS if _start_key(config) in again)
    terminalreporter.write_sep("=", "SGLang servers started by this process")
    terminalreporter.write_line(f"{len(_SERVER_STARTS)} starts, {total:.0f} s until healthy; "
                                f"{len(counts)} configurations, {len(again)} of them started more than once "
                                f"({sum(again.values())} starts, {again_s:.0f} s)")
    for key, n in sorted(again.items(), key=lambda item: -item[1])[:5]:
        terminalreporter.write_line(f"  {n} x {key[:300]}")
