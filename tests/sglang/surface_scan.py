"""Read the project's code (AST only) and list every SGLang name it touches.

What counts as touching a name (each a ``Touch(name, file, line)``):

- an import from ``sglang`` (``from sglang.srt.x import Y`` -> ``sglang.srt.x.Y``);
- an attribute of a local name bound to an SGLang module or class (``ps._PP``,
  ``TokenizerManager._validate_one_request``), or ``getattr(that, "name")``;
- a string that folds (module constants and ``+`` included) to a dotted ``sglang.`` path
  (hook targets, ``importlib`` paths);
- an attribute of a receiver whose name says which SGLang class it holds (``ROLES``:
  ``scheduler``, ``s``, ``self.s``, ``server_args``, ``adder``, ...), read or written;
- a private attribute (``x._name``) that the project itself never defines: it can only be
  SGLang's (or Python's own ``_``-names, listed in ``NOT_SGLANG_PRIVATE``);
- an attribute of a function parameter annotated with an SGLang class (``pool:
  MLATokenToKVPool``, or the name in quotes), read or written in that function: a receiver
  named for its own use (``pool``) says nothing by its name, its annotation does.

A name is declared when ``surface.SURFACE`` holds its path, or, for a role or private attribute,
an entry of the role's class or any entry ending in that attribute.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


_GROUP = "sglang.srt.distributed.parallel_state.GroupCoordinator"
_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
ROLES: dict[str, tuple[str, str]] = {
    "scheduler": (_SCHEDULER, ""),
    "self.s": (_SCHEDULER, ""),
    "self.scheduler": (_SCHEDULER, ""),
    "server_args": ("sglang.srt.server_args.ServerArgs", ""),
    "adder": ("sglang.srt.managers.schedule_policy.PrefillAdder", ""),
    "runner": ("sglang.srt.model_executor.model_runner.ModelRunner", ""),
    "manager": ("sglang.srt.managers.tokenizer_manager.TokenizerManager", ""),
    "grammar_manager": ("sglang.srt.constrained.grammar_manager.GrammarManager", ""),
    "batch": ("sglang.srt.managers.schedule_batch.ScheduleBatch", ""),
    "job.batch": ("sglang.srt.managers.schedule_batch.ScheduleBatch", ""),
    "req": ("sglang.srt.managers.schedule_batch.Req", ""),
    "watchdog": ("sglang.srt.utils.watchdog.SubprocessWatchdog", "failure_report.py"),
    "handler": ("sglang.srt.managers.tokenizer_manager.SignalHandler", "failure_report.py"),
    "pp": (_GROUP, "/vpp/"),
    "tp": (_GROUP, "/vpp/"),
    "group": (_GROUP, "/vpp/"),
    "self.state.pp_group": (_GROUP, "/vpp/"),
}
"""Receiver expression -> (the SGLang class it holds, the files where it does: a substring of
the path). A local name assigned from one of these (``s = self.s``) holds the same class in
that file."""


NOT_SGLANG_PRIVATE = frozenset({"_actions", "_asdict", "_replace", "_fields", "_value_", "_name_", "_register_atexit"})
"""Private names of Python or argparse themselves (``parser._actions``, ``threading._register_atexit``)."""

CLASS_SWAP = "<class swap>"
"""The name of a ``x.__class__ = ...`` assignment: declared by any ``Use.SWAP`` entry."""
_PATH = re.compile(r"^sglang(\.[A-Za-z_]\w*)+$")


@dataclass(frozen=True, slots=True)
class Touch:
    name: str
    """Dotted SGLang path, ``Class.attr`` for a role, or ``*._attr`` for a private attribute."""
    file: str
    line: int
    how: str


def _module_constants(tree: ast.Module) -> dict[str, str]:
    consts: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _fold(node.value, consts)
            for target in targets:
                if isinstance(target, ast.Name) and value is not None:
                    consts[target.id] = value
    return consts


def _fold(node: ast.AST, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left, consts), _fold(node.right, consts)
        return left + right if left is not None and right is not None else None
    return None


def project_private_names(files: list[Path]) -> set[str]:
    """``_names`` the project defines: functions, classes, attributes it assigns, fields."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Dict):  # attributes of a class built with type(name, bases, dict)
                names.update(key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str))
    return {name for name in names if name.startswith("_")}


def scan_file(path: Path, rel: str, project_private: set[str]) -> list[Touch]:
    tree = ast.parse(path.read_text())
    consts = _module_constants(tree)
    bound: dict[str, str] = {}  # local name -> SGLang path (module or class)
    touches: list[Touch] = []
    roles = {receiver: klass for receiver, (klass, where) in ROLES.items() if where in rel}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and ast.unparse(node.value) in roles:
            roles[node.targets[0].id] = roles[ast.unparse(node.value)]

    def add(name: str, node: ast.AST, how: str) -> None:
        touches.append(Touch(name, rel, getattr(node, "lineno", 0), how))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang" \
                and node.level == 0:
            for alias in node.names:
                path_ = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = path_
                add(path_, node, "import")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sglang":
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    add(alias.name, node, "import")
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for name, klass in _annotated_parameters(function, bound).items():
                for node in ast.walk(function):
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
                        add(f"{klass}.{node.attr}", node, "annotation")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            receiver = ast.unparse(node.value)
            if isinstance(node.value, ast.Name) and node.value.id in bound:
                add(f"{bound[node.value.id]}.{node.attr}", node, "attribute")
            elif node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                add(CLASS_SWAP, node, "class-swap")
            elif receiver in roles:
                add(f"{roles[receiver]}.{node.attr}", node, "role")
            elif _foreign_private(node.attr, project_private):
                add(f"*.{node.attr}", node, "private")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            receiver = ast.unparse(node.args[0])
            attr = node.args[1].value
            if isinstance(node.args[0], ast.Name) and node.args[0].id in bound:
                add(f"{bound[node.args[0].id]}.{attr}", node, "getattr")
            elif receiver in roles:
                add(f"{roles[receiver]}.{attr}", node, "getattr")
            elif _foreign_private(attr, project_private):
                add(f"*.{attr}", node, "private")
        folded = _fold(node, consts) if isinstance(node, (ast.Constant, ast.BinOp)) else None
        if folded is not None and _PATH.match(folded):
            add(folded, node, "string")
    return touches


def _annotated_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, bound: dict[str, str]) -> dict[str, str]:
    """Parameter name -> the SGLang class its annotation names (an imported name, quoted or not)."""
    out: dict[str, str] = {}
    args = function.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        note = arg.annotation
        if isinstance(note, ast.Constant) and isinstance(note.value, str):
            text = note.value
        elif isinstance(note, ast.Name):
            text = note.id
        else:
            continue
        klass = bound.get(text) or (text if _PATH.match(text) else None)
        if klass is not None:
            out[arg.arg] = klass
    return out


def _foreign_private(attr: str, project_private: set[str]) -> bool:
    return attr.startswith("_") and not attr.startswith("__") and attr not in project_private \
        and attr not in NOT_SGLANG_PRIVATE


def scan(roots: list[Path], base: Path) -> list[Touch]:
    files = sorted(path for root in roots for path in root.rglob("*.py"))
    private = project_private_names(files)
    out: list[Touch] = []
    for path in files:
        out.extend(scan_file(path, str(path.relative_to(base)), private))
    return out
