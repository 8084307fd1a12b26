"""Shared pytest options and hooks.

- ``--update-golden`` rewrites golden files instead of comparing.
- After each test, an SGLang server that the next test will not use is stopped
  (``sglang_harness.close_idle_pools``).
"""

from __future__ import annotations

import sys

import pytest


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
