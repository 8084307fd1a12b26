"""The pipeline options the plugin adds to SGLang, and how they travel to every process.

Data flow::

    argv --argparse (flags added by cli_args.add_pipeline_args)--> Namespace.pp_mode, ...
         --PipelineOptions.from_namespace--> PipelineOptions
         --attach(server_args)--> server_args._sglang_vpp   (underscore attribute)
         --pickled with ServerArgs into every spawned subprocess-->
         options_of(server_args) in the scheduler processes

ServerArgs (a msgspec struct) seals its fields once resolution starts, but non-field
underscore attributes stay writable and ``ServerArgs.__reduce__`` pickles them along with the
fields, so the options reach every scheduler process. Two checks keep that from failing
silently (which would run stock PP under ``--pp-mode vpp``): ``check_options_travel`` pickles
the launcher's ServerArgs once and compares, and the launcher names its mode in
``EXPECTED_MODE_ENV`` (inherited by its subprocesses), which ``check_options_reached``
compares with what a scheduler process received.

``--vpp-comm-timeout`` precedence: the flag, else ``SGLANG_VPP_COMM_TIMEOUT_S``, else
``DEFAULT_COMM_TIMEOUT_S`` (``resolve_comm_timeout``).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any

from sglang_vpp.comm.config import SERVED_COMM_TIMEOUT_S
from sglang_vpp.timeouts import MAX_TIMEOUT_S
from sglang_vpp.schedule import FOLDBACK_MODES, Fold, LayoutError, Policy, parse_fold, stage_count
from sglang_vpp.sglang_plugin.errors import PpModeError

__all__ = [
    "COMM_TIMEOUT_ENV",
    "DEFAULT_COMM_TIMEOUT_S",
    "EXPECTED_MODE_ENV",
    "OPTIONS_ATTR",
    "PipelineOptions",
    "PpMode",
    "attach",
    "check_options_reached",
    "check_options_travel",
    "is_vpp_mode",
    "layer_split_count_error",
    "options_of",
    "parse_layer_split",
    "parse_vpp_fold",
    "resolve_comm_timeout",
]

OPTIONS_ATTR = "_sglang_vpp"
"""Name of the ServerArgs attribute that carries the PipelineOptions."""

EXPECTED_MODE_ENV = "SGLANG_VPP_EXPECTED_MODE"
"""Set by the launcher that parsed ``--pp-mode``: the mode its scheduler processes must run."""

COMM_TIMEOUT_ENV = "SGLANG_VPP_COMM_TIMEOUT_S"
DEFAULT_COMM_TIMEOUT_S = SERVED_COMM_TIMEOUT_S
"""``--vpp-comm-timeout`` when neither the flag nor ``COMM_TIMEOUT_ENV`` is given."""


def resolve_comm_timeout(flag: float | None) -> float:
    """Flag > ``SGLANG_VPP_COMM_TIMEOUT_S`` > ``DEFAULT_COMM_TIMEOUT_S``; PpModeError unless it is
    in (0, ``MAX_TIMEOUT_S``] seconds (every mode: the stock loop watchdog of cpp and dcpp
    waits on it too)."""
    raw = os.environ.get(COMM_TIMEOUT_ENV)
    if flag is not None:
        value, given = float(flag), f"--vpp-comm-timeout {flag}"
    elif not raw:
        return DEFAULT_COMM_TIMEOUT_S
    else:
        try:
            value, given = float(raw), f"{COMM_TIMEOUT_ENV}={raw!r}"
        except ValueError:
            raise PpModeError(f"{COMM_TIMEOUT_ENV}={raw!r} is not a number of seconds; set e.g. {COMM_TIMEOUT_ENV}=60") from None
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise PpModeError(f"{given} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}] (a week), e.g. 60")
    return value


# The mode names are the schedule core's policy names: one vocabulary from CLI to schedule.
PpMode = Policy
SERVED_MODES = tuple(Policy)
"""The modes the plugin serves: every schedule-core policy."""


def is_vpp_mode(mode: str) -> bool:
    """True for the fold-back modes (vpp, vpp-async, vpp-pack, vpp-taper, vpp-stream)."""
    return Policy(mode) in FOLDBACK_MODES


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """The plugin's flags after parsing. Picklable; lives on ``server_args._sglang_vpp``."""

    pp_mode: Policy = Policy.CPP
    """Which pipeline to run (``--pp-mode``); the schedule core's ``Policy``."""
    vpp_layer_split: tuple[int, ...] | None = None
    """Layers per virtual stage s_0 .. s_{2P-1} (``--vpp-layer-split 3,2,2,1``); None = even."""
    vpp_trace: str | None = None
    """Where the VPP code writes Perfetto/Chrome traces of the pipeline (``--vpp-trace``)."""
    vpp_comm_timeout: float = field(default_factory=lambda: resolve_comm_timeout(None))
    """Seconds any pipeline send/receive may wait before failing (``--vpp-comm-timeout``, see
    ``resolve_comm_timeout``)."""
    vpp_cost_profile: str | None = None
    """A fitted cost model file for the VPP controller's estimates (``--vpp-cost-profile``)."""
    vpp_auto_chunk: bool = False
    """``--chunked-prefill-size auto``: SGLang gets a cap, the controller sizes each chunk."""
    vpp_fold: Fold = Fold.SPLIT
    """``--vpp-fold``: ``fused`` runs the fold rank's two virtual stages as one forward
    (``schedule/layout.py``, [Note: fused fold])."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pp_mode", PpMode(self.pp_mode))
        object.__setattr__(self, "vpp_fold", parse_vpp_fold(self.vpp_fold))
        if self.vpp_layer_split is not None:
            object.__setattr__(self, "vpp_layer_split", tuple(int(n) for n in self.vpp_layer_split))

    @property
    def is_vpp(self) -> bool:
        return is_vpp_mode(self.pp_mode)

    @classmethod
    def from_namespace(cls, namespace: Any) -> PipelineOptions:
        """Build from an argparse Namespace that went through ``add_pipeline_args``."""
        return cls(
            pp_mode=PpMode(getattr(namespace, "pp_mode", PpMode.CPP)),
            vpp_layer_split=parse_layer_split(getattr(namespace, "vpp_layer_split", None)),
            vpp_trace=getattr(namespace, "vpp_trace", None),
            vpp_comm_timeout=resolve_comm_timeout(getattr(namespace, "vpp_comm_timeout", None)),
            vpp_cost_profile=getattr(namespace, "vpp_cost_profile", None),
            vpp_auto_chunk=bool(getattr(namespace, "vpp_auto_chunk", False)),
            vpp_fold=parse_vpp_fold(getattr(namespace, "vpp_fold", None) or Fold.SPLIT),
        )


def parse_vpp_fold(text: str | Fold) -> Fold:
    """``--vpp-fold`` as a ``Fold``; PpModeError naming the choices otherwise."""
    try:
        return parse_fold(text)
    except LayoutError as exc:
        raise PpModeError(f"--vpp-fold: {exc}") from None


def parse_layer_split(text: str | tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Parse ``"3,2,2,1"`` into ``(3, 2, 2, 1)``; raise PpModeError with the fix otherwise."""
    if text is None or isinstance(text, tuple):
        return text
    try:
        split = tuple(int(part) for part in str(text).replace(" ", "").split(","))
    except ValueError:
        raise PpModeError(
            f"--vpp-layer-split {text!r} is not a comma-separated list of integers; "
            "write e.g. --vpp-layer-split 3,2,2,1 (layers of virtual stages s0..s3)"
        ) from None
    if any(n < 1 for n in split):
        raise PpModeError(f"--vpp-layer-split {text!r}: every virtual stage needs at least 1 layer")
    return split


def layer_split_count_error(split: tuple[int, ...] | None, pp_size: int, fold: Fold) -> str | None:
    """Why ``--vpp-layer-split`` has the wrong number of counts for ``--pp-size`` and the fold, or
    None when it has one per virtual stage (or is not given). The launcher's flag check and the
    scheduler's ``VppConfig`` both refuse with these words."""
    num_counts = stage_count("foldback", pp_size, fold)
    if split is None or len(split) == num_counts:
        return None
    per_rank = "2 per rank, 1 on the last with --vpp-fold fused" if fold is Fold.FUSED else "2 per rank"
    return (
        f"--vpp-layer-split {','.join(map(str, split))} has {len(split)} entries but "
        f"--pp-size {pp_size} has {num_counts} virtual stages ({per_rank}); give {num_counts} layer counts"
    )


def attach(server_args: Any, options: PipelineOptions) -> None:
    """Store ``options`` on ``server_args`` (allowed before and after resolution)."""
    setattr(server_args, OPTIONS_ATTR, options)


def options_of(server_args: Any) -> PipelineOptions:
    """The PipelineOptions of a ServerArgs; stock ``cpp`` when the plugin did not parse it
    (e.g. ``sglang.Engine(**kwargs)``, which never goes through the command line)."""
    options = getattr(server_args, OPTIONS_ATTR, None)
    return options if options is not None else PipelineOptions()


def check_options_travel(server_args: Any) -> None:
    """Raise PpModeError unless the options survive the pickling that carries ServerArgs into
    every scheduler process (an SGLang whose ``ServerArgs`` stopped pickling its ``__dict__``
    would hand the schedulers stock options)."""
    sent = getattr(server_args, OPTIONS_ATTR, None)
    received = getattr(pickle.loads(pickle.dumps(server_args)), OPTIONS_ATTR, None)
    if received != sent:
        raise PpModeError(
            f"this SGLang's ServerArgs does not carry {OPTIONS_ATTR} to its subprocesses (sent "
            f"{sent}, a pickled copy holds {received}); the scheduler processes would run stock "
            "pipeline parallelism: install the SGLang version the plugin supports"
        )


def check_options_reached(server_args: Any) -> None:
    """Raise PpModeError when this (scheduler) process got other options than its launcher parsed."""
    expected = os.environ.get(EXPECTED_MODE_ENV)
    received = getattr(server_args, OPTIONS_ATTR, None)
    if expected and (received is None or str(received.pp_mode) != expected):
        got = "no pipeline options" if received is None else f"--pp-mode {received.pp_mode}"
        raise PpModeError(
            f"the launcher parsed --pp-mode {expected} but this scheduler process received {got} "
            f"(ServerArgs.{OPTIONS_ATTR} did not travel); refusing to run another pipeline in its "
            "place: install the SGLang version the plugin supports"
        )
