"""Fixtures for the fault and input-guard tests: the plugin's harness, imported (not copied).

``tests/sglang/sglang_harness.py`` starts and always kills real servers; its fixtures live in
``tests/sglang/conftest.py``, loaded here under another module name and re-exported.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang")
sys.path.insert(0, _HARNESS_DIR)

_spec = importlib.util.spec_from_file_location("sglang_faults_harness_conftest", os.path.join(_HARNESS_DIR, "conftest.py"))
_harness_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness_conftest)

tiny_model = _harness_conftest.tiny_model
tiny_model_dir = _harness_conftest.tiny_model_dir
server_pool = _harness_conftest.server_pool
