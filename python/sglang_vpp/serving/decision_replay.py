"""Decision replay: did a VPP server follow the schedule core's controller?

Data flow: ``<trace_dir>/vpp_rank<r>.records.json`` (written with ``--vpp-trace``; see
``sglang_plugin/accounting.py``) -> per rank, a fresh ``Controller`` built from the recorded
inputs (mode, layout, limits, cost model) -> the rank's recorded calls replayed in order:

- rank 0's ``admit`` and ``hold`` records carry the micro-batch SGLang built (requests, prefix,
  tokens, prefill or decode, whether a request continues): the controller must answer the
  recorded decision (``yes`` / ``packed`` for an admission, ``no`` for a hold);
- ``left`` records (a micro-batch finished the last stage) update the controller's in-flight set;
- ``pick`` records (every rank, whenever two stages were ready) carry the ready items: the
  controller must choose the recorded one.

The first mismatch is a ``Divergence`` naming the rank, the micro-batch and both decisions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..schedule import (
    Admission,
    Controller,
    LinearAttentionCost,
    MicroBatch,
    StageCostModel,
    build_layout,
    get_policy,
)

__all__ = ["TraceError", "Divergence", "ReplayResult", "replay_trace", "load_trace"]


class TraceError(ValueError):
    """The trace directory cannot be read as a VPP decision trace."""


@dataclass(frozen=True, slots=True)
class Divergence:
    rank: int
    index: int
    """Position of the record in the rank's decision list."""
    seq: int | None
    """The micro-batch concerned (None when a pick concerns several)."""
    expected: str
    observed: str

    def describe(self) -> str:
        where = f"rank {self.rank}, decision {self.index}" + (f", micro-batch {self.seq}" if self.seq is not None else "")
        return f"{where}: controller expected {self.expected}, server did {self.observed}"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    mode: str
    num_ranks: int
    num_decisions: int
    num_admitted: int
    num_packed: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None


def load_trace(trace_dir: str | Path) -> dict[int, dict]:
    """Rank -> records file contents; ``TraceError`` when missing, unreadable or not a VPP trace."""
    root = Path(trace_dir)
    if not root.is_dir():
        raise TraceError(f"--trace {str(root)!r} is not a directory; pass the directory given to --vpp-trace")
    ranks: dict[int, dict] = {}
    for path in sorted(root.glob("vpp_rank*.records.json")):
        try:
            rank = int(path.name[len("vpp_rank"):].split(".")[0])
            data = json.loads(path.read_text())
        except (ValueError, OSError) as exc:
            raise TraceError(f"{path} is not a readable records file ({exc}); re-run the server with --vpp-trace") from None
        if not isinstance(data, dict):
            raise TraceError(f"{path} holds no records object; re-run the server with --vpp-trace")
        ranks[rank] = data
    if not ranks:
        raise TraceError(f"no vpp_rank*.records.json in {str(root)!r}; start the server with --vpp-trace {root}")
    if sorted(ranks) != list(range(len(ranks))):
        raise TraceError(f"{str(root)!r} holds records of ranks {sorted(ranks)}; every rank 0..P-1 is needed")
    if not all(data.get("controller") for data in ranks.values()):
        raise TraceError(
            f"{str(root)!r} holds no controller decisions: stock --pp-mode cpp / dcpp run SGLang's own loop, "
            "which the controller does not drive; use --pp-mode vpp, vpp-async, vpp-pack or vpp-taper"
        )
    return ranks


def replay_trace(trace_dir: str | Path) -> ReplayResult:
    ranks = load_trace(trace_dir)
    inputs = ranks[0]["controller"]
    divergence: Divergence | None = None
    num_decisions = 0
    controllers: dict[int, Controller] = {}
    for rank, data in ranks.items():
        controllers[rank] = controller = _build_controller(data["controller"], rank)
        decisions = data.get("decisions") or []
        num_decisions += len(decisions)
        divergence = _replay_rank(controller, rank, decisions)
        if divergence is not None:
            break
    leader = controllers[0]
    return ReplayResult(str(inputs["mode"]), len(ranks), num_decisions, leader.num_admitted, leader.num_packed,
                        divergence)


def _build_controller(inputs: dict, rank: int) -> Controller:
    try:
        policy = get_policy(inputs["mode"])
        stage_layers = [int(n) for n in inputs["stage_layers"]]
        layout = build_layout(int(inputs["pp_size"]), sum(stage_layers), policy.layout_kind, stage_layers)
        return Controller(policy, layout, _cost_model(inputs["cost"]), inputs.get("max_in_flight"))
    except (KeyError, TypeError) as exc:
        raise TraceError(f"rank {rank}: the controller inputs in the trace are incomplete ({exc!r})") from None


def _cost_model(spec: dict) -> StageCostModel:
    if spec.get("kind") == "fitted":
        from ..sim.cost.fitted import FittedCostModel

        return FittedCostModel.from_json(spec["model"])
    if spec.get("kind") != "linear-attention":
        raise TraceError(f"unknown cost model {spec.get('kind')!r} in the trace; expected 'linear-attention' or 'fitted'")
    return LinearAttentionCost(float(spec["linear_per_token"]), float(spec["attention_per_pair"]),
                               float(spec["fixed_per_chunk"]))


def _micro_batch(record: dict) -> MicroBatch:
    return MicroBatch(int(record["seq"]), frozenset(record["requests"]), int(record["start"]), int(record["tokens"]),
                      bool(record["ends_request"]), bool(record["prefill"]))


def _replay_rank(controller: Controller, rank: int, decisions: list[dict]) -> Divergence | None:
    for index, record in enumerate(decisions):
        try:
            kind = record["kind"]
            if kind in ("admit", "hold"):
                mb = _micro_batch(record)
                expected = controller.admission(mb)
                observed = Admission(record["decision"]) if kind == "admit" else Admission.NO
                if observed is not expected:
                    return Divergence(rank, index, mb.seq, _admission_text(expected), _admission_text(observed))
                if observed is not Admission.NO:
                    controller.on_admitted(mb, observed)
            elif kind == "left":
                seq = int(record["seq"])
                if seq not in controller.in_flight_seqs:
                    return Divergence(rank, index, seq, "no such micro-batch in flight", f"micro-batch {seq} left")
                controller.on_left(seq)
            elif kind == "pick":
                ready = [(int(stage), int(seq)) for stage, seq in record["ready"]]
                expected_item = controller.pick(rank, ready)
                observed_item = tuple(int(x) for x in record["chosen"])
                if observed_item != expected_item:
                    return Divergence(rank, index, None, f"run {_item_text(expected_item)} first of {_items_text(ready)}",
                                      f"{_item_text(observed_item)} first")
            else:
                raise TraceError(f"rank {rank}, decision {index}: unknown kind {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"rank {rank}, decision {index}: unreadable record {record!r} ({exc!r})") from None
    return None


def _admission_text(decision: Admission) -> str:
    return {"no": "hold (no admission)", "yes": "admit", "packed": "admit as packed"}[decision.value]


def _item_text(item: tuple[int, int]) -> str:
    return f"stage {item[0]} of micro-batch {item[1]}"


def _items_text(items: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(_item_text(item) for item in items) + "]"
