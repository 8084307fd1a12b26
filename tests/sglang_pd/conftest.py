"""Fixtures for the prefill-decode (PD) tests: the plugin's harness, imported (not copied).

``tests/sglang/conftest.py`` builds tiny models; it is loaded here under another module name and
its ``tiny_model`` fixture re-exported. The PD deployment itself (one decode server, prefill
servers in turn, SGLang's router) is ``sglang_vpp.serving.pd_launcher.PdDeployment``.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang")
sys.path.insert(0, _HARNESS_DIR)

_spec = importlib.util.spec_from_file_location("sglang_harness_pd_conftest", os.path.join(_HARNESS_DIR, "conftest.py"))
_harness_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness_conftest)

tiny_model = _harness_conftest.tiny_model
