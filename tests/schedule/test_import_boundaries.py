"""The SGLang plugin and what it imports (schedule core, comm, the trace schema) never import
the simulator, lazily or not; the controller's cost estimates load without numpy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sglang_vpp

PACKAGE = Path(sglang_vpp.__file__).parent
NO_SIM = ["sglang_plugin", "schedule", "comm", "trace_records.py", "parent_death.py", "plan_process.py", "plan_child.py",
          "plan_wire.py"]


def _imported_modules(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_plugin_and_its_imports_never_import_the_simulator() -> None:
    offenders = []
    for entry in NO_SIM:
        root = PACKAGE / entry
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            offenders += [f"{path.relative_to(PACKAGE)}: {name}" for name in _imported_modules(path)
                          if name == "sglang_vpp.sim" or name.startswith("sglang_vpp.sim.")]
    assert not offenders, offenders


def test_the_scan_sees_relative_and_lazy_imports() -> None:
    runner = PACKAGE / "sim" / "runner.py"
    assert "sglang_vpp.schedule" in _imported_modules(runner)
    # Inside a function, relative: factory.py imports auto_size where it builds an auto chunker.
    assert "sglang_vpp.schedule.auto_size" in _imported_modules(PACKAGE / "schedule" / "factory.py")
    replica = PACKAGE / "sglang_plugin" / "vpp" / "replica.py"
    assert "sglang.srt.managers.scheduler_pp_mixin" in _imported_modules(replica)


def test_controller_cost_estimates_load_without_numpy_or_the_simulator() -> None:
    code = (
        "import sys; from sglang_vpp.schedule.fitted_cost import FittedCostModel, Coefficients; "
        "from sglang_vpp.trace_records import cost_from_record, cost_record; "
        "from sglang_vpp.schedule import build_controller, controller_config, build_layout; "
        "cost = cost_from_record(cost_record(FittedCostModel({}, Coefficients(1e-9, 1e-7, 1e-4)))); "
        "layout = build_layout(2, 8, 'foldback'); "
        "build_controller(controller_config('vpp-taper', layout, 512, cost, 4096)); "
        "bad = [m for m in sys.modules if m == 'numpy' or m.startswith(('sglang_vpp.sim', 'torch'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
