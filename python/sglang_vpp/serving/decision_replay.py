"""Decision replay: did a VPP server follow the schedule core's controller?

Data flow: ``<trace_dir>/vpp_rank<r>.records.json`` (written with ``--vpp-trace``; see
``sglang_plugin/accounting.py``) -> per rank, a fresh ``Controller`` built from the recorded
inputs (mode, layout, limits, cost model) -> the rank's recorded calls replayed in order:

- rank 0's ``admit`` and ``hold`` records carry the micro-batch SGLang built (requests, prefix,
  tokens, prefill or decode, whether a request continues): the controller must answer the
  recorded decision (``yes`` / ``packed`` for an admission, ``no`` for a hold);
- ``left`` records (a micro-batch finished the last stage) update the controller's in-flight set;
- ``pick`` records (every rank, whenever two stages were ready) carry the ready items: the
  controller must choose the recorded one;
- ``chunk`` records (``--chunked-prefill-size auto``: the inputs carry ``auto_chunk_cap``) carry
  each chunk size the ``auto`` chunker gave: the controller must give the same size;
- ``resize`` records (``auto``: the prompt lengths waiting and in flight when rank 0 formed a
  batch, on every rank the size it applied) carry each situation: the controller, told the same
  lengths (``Controller.resize``), must choose the same size; the ``chunk`` records after it
  replay at that size, and no prefill micro-batch admitted after it may carry more tokens;
- ``decode`` records (requests of a prefill-only slot waited to decode) carry that slot and the
  running requests of the decode slots that could take them: the controller, asked about that
  slot with the others in flight, must decide the recorded move (the slot joined, or a hold).

The first mismatch is a ``Divergence`` naming the rank, the micro-batch and both decisions.

The same records compare a server with the planner (hence the simulator and the reference
runtime, which execute the planner's streams): ``server_workload`` rebuilds the prefill work and
the cost table from a trace, ``DecisionRecorder`` writes a planner's controller calls in the same
records, and ``compare_decisions`` compares the two lists of a rank. The two executors keep
different clocks, so the *events* (a micro-batch built, one leaving the last stage, which items
are ready) may come in another order; what must be equal is every decision taken in the same
*situation*: the same micro-batch asked about in the same controller state (``state_key``) gets
the same admission, the same ready items the same choice. A different decision in a situation
both met is a ``Divergence``; ``OrderComparison`` also counts the situations met and the records
the two lists share from the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .. import json_text
from ..schedule import (
    Admission,
    FOLDBACK_MODES,
    Controller,
    ControllerConfig,
    Fold,
    FixedChunker,
    Layout,
    MicroBatch,
    StageCostModel,
    build_controller,
    build_layout,
    get_policy,
    server_controller_config,
    split_request,
)
from ..schedule.errors import CostModelError, LayoutError, PolicyError
from ..workload_file import MAX_TOKENS
from ..trace_records import (
    ADMIT,
    CHUNK,
    DECODE,
    HOLD,
    LEFT,
    PICK,
    RECORDS_GLOB,
    RESIZE,
    cost_from_record,
    micro_batch_from_record,
    micro_batch_record,
    rank_of_records_file,
)

__all__ = ["TraceError", "Divergence", "ReplayResult", "replay_trace", "load_trace", "ServerWorkload",
           "server_workload", "DecisionRecorder", "OrderComparison", "compare_decisions"]


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
    paths: dict[int, Path] = {}
    for path in sorted(root.glob(RECORDS_GLOB)):
        try:
            rank = rank_of_records_file(path)
            data = json_text.loads(path.read_text())
        except (ValueError, OSError) as exc:
            raise TraceError(f"{path} is not a readable records file ({exc}); re-run the server with --vpp-trace") from None
        if not isinstance(data, dict):
            raise TraceError(f"{path} holds no records object; re-run the server with --vpp-trace")
        if not isinstance(data.get("decisions") or [], list):
            raise TraceError(f"{path}: 'decisions' is not a list; re-run the server with --vpp-trace")
        ranks[rank], paths[rank] = data, path
    if not ranks:
        raise TraceError(f"no vpp_rank*.records.json in {str(root)!r}; start the server with --vpp-trace {root}")
    if sorted(ranks) != list(range(len(ranks))):
        raise TraceError(f"{str(root)!r} holds records of ranks {sorted(ranks)}; every rank 0..P-1 is needed")
    # Every records file a server writes (stock cpp/dcpp too) holds its compute records: a file
    # with neither those nor a controller is another JSON file, not a stock trace.
    foreign = [paths[rank] for rank, data in ranks.items()
               if not data.get("controller") and not isinstance(data.get("records"), list)]
    if foreign:
        raise TraceError(f"{foreign[0]} holds neither \"records\" nor \"controller\", so it is no records file a "
                         "server wrote; re-run the server with --vpp-trace")
    if not all(data.get("controller") for data in ranks.values()):
        raise TraceError(
            f"{str(root)!r} holds no controller decisions: stock --pp-mode cpp / dcpp run SGLang's own loop, "
            "which the controller does not drive; use --pp-mode vpp, vpp-async, vpp-pack, vpp-taper or vpp-stream"
        )
    for rank, data in ranks.items():
        _check_plan_inputs(data["controller"], paths[rank])
    # A rank whose file is missing would replay as if it had made no decision at all.
    pp_size = ranks[0]["controller"]["pp_size"]
    if pp_size != len(ranks):
        raise TraceError(f"{str(root)!r} holds records of ranks {sorted(ranks)}, but the server ran pp_size "
                         f"{pp_size}; every rank 0..{pp_size - 1} is needed (copy the whole --vpp-trace directory)")
    return ranks


def _check_plan_inputs(inputs: object, path: Path) -> None:
    """The controller inputs that describe the server's plan (mode, pp size, layers per stage,
    fold), which every replay builds its layout from: TraceError naming the file, the field and
    what it must hold, rather than a bare conversion error."""
    def bad(field: str, value: object, expected: str) -> TraceError:
        return TraceError(f"{path}: controller {field} is {value!r}, not {expected}; re-run the server with "
                          "--vpp-trace")

    if not isinstance(inputs, dict):
        raise bad("inputs", inputs, "an object of the server's plan")
    mode = inputs.get("mode")
    if mode not in FOLDBACK_MODES:  # stock cpp/dcpp servers record no controller decisions
        raise bad("mode", mode, f"a VPP mode name ({', '.join(FOLDBACK_MODES)})")
    pp_size = inputs.get("pp_size")
    if type(pp_size) is not int or pp_size < 1:
        raise bad("pp_size", pp_size, "a whole number >= 1 (the server's pipeline ranks)")
    stage_layers = inputs.get("stage_layers")
    if (not isinstance(stage_layers, list) or not stage_layers
            or any(type(n) is not int or n < 1 for n in stage_layers)):
        raise bad("stage_layers", stage_layers, "a list of each stage's layer count, whole numbers >= 1 "
                  "(e.g. [2, 2, 2, 2])")
    if pp_size > len(stage_layers):  # every rank runs a stage; a huge count would be planned rank by rank
        raise bad("pp_size", pp_size, f"at most the {len(stage_layers)} stages of stage_layers")
    # A chunk is at least a token and at most the most tokens any size takes (16m): a larger or
    # empty one is an edit, and would size the replayed controller's chunker.
    for field, least, most in (("chunk_size", 1, MAX_TOKENS), ("auto_chunk_cap", 1, MAX_TOKENS),
                               ("max_in_flight", 1, None)):
        value = inputs.get(field)  # absent or null: a server that recorded none
        if value is not None and (type(value) is not int or value < least or (most is not None and value > most)):
            raise bad(field, value, f"a whole number >= {least}{'' if most is None else f' and <= {most}'} (or null)")
    try:
        recorded_layout(inputs)
    except (LayoutError, PolicyError) as error:
        raise TraceError(f"{path}: controller inputs do not describe a layout: {error}") from None
    try:
        cost_from_record(inputs.get("cost"))
    except CostModelError as error:
        raise TraceError(f"{path}: {error}") from None


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


def recorded_layout(inputs: dict) -> Layout:
    """The layout a server ran, from its recorded controller inputs (``fold`` absent: split)."""
    stage_layers = [int(n) for n in inputs["stage_layers"]]
    return build_layout(int(inputs["pp_size"]), sum(stage_layers), get_policy(inputs["mode"]).layout_kind,
                        stage_layers, inputs.get("fold", Fold.SPLIT))


def _build_controller(inputs: dict, rank: int) -> Controller:
    try:
        return build_controller(_controller_config(inputs))
    except (KeyError, TypeError) as exc:
        raise TraceError(f"rank {rank}: the controller inputs in the trace are incomplete ({exc!r})") from None


def _controller_config(inputs: dict) -> ControllerConfig:
    """The configuration the server built its controller from (``VppState.controller_config``),
    from its recorded controller inputs; KeyError or TypeError where they are incomplete."""
    policy = get_policy(inputs["mode"])
    layout = recorded_layout(inputs)
    # Admission and order never read the chunker; traces written before chunk sizes were
    # recorded replay with any. An ``auto`` server records its cap instead.
    cap = inputs.get("auto_chunk_cap")
    chunk_size = int(cap if cap is not None else (inputs.get("chunk_size") or 1))
    return server_controller_config(policy, layout, chunk_size, _cost_model(inputs["cost"]),
                                    max_in_flight=inputs.get("max_in_flight"), auto_chunk=cap is not None,
                                    decodes=bool(inputs.get("decodes", True)),
                                    # A trace without the field comes from a server whose auto weighed no tapered cut.
                                    auto_taper=bool(inputs.get("auto_taper", False)),
                                    # Nor without this one: its auto planned whole requests only.
                                    auto_partial_fill=bool(inputs.get("auto_partial_fill", False)))


def _cost_model(spec: dict) -> StageCostModel:
    try:
        return cost_from_record(spec)
    except CostModelError as exc:
        raise TraceError(str(exc)) from None


def _replay_rank(controller: Controller, rank: int, decisions: list[dict]) -> Divergence | None:
    for index, record in enumerate(decisions):
        try:
            kind = record["kind"]
            if kind in ("admit", "hold"):
                mb = micro_batch_from_record(record)
                expected = controller.admission(mb)
                observed = Admission(record["decision"]) if kind == "admit" else Admission.NO
                if observed is not expected:
                    return Divergence(rank, index, mb.seq, _admission_text(expected), _admission_text(observed))
                if observed is not Admission.NO:
                    if mb.seq in controller.in_flight_seqs:
                        return Divergence(rank, index, mb.seq, "a micro-batch not already in flight",
                                          f"admit micro-batch {mb.seq} again while it was in flight")
                    divergence = _over_budget(controller, rank, index, mb)
                    if divergence is not None:
                        return divergence
                    controller.on_admitted(mb, observed)
            elif kind == "left":
                seq = int(record["seq"])
                if seq not in controller.in_flight_seqs:
                    return Divergence(rank, index, seq, "no such micro-batch in flight", f"micro-batch {seq} left")
                controller.on_left(seq)
            elif kind == CHUNK:
                if controller.chunker is None:
                    raise TraceError(f"rank {rank}, decision {index}: a chunk-size record in a trace without "
                                     "auto_chunk_cap in its controller inputs")
                expected_size = controller.next_chunk_size(_count(record, "prefix", 0), _count(record, "remaining", 1))
                if expected_size != _count(record, "size", 1):
                    return Divergence(rank, index, None, f"a chunk of {expected_size} tokens after prefix "
                                      f"{record['prefix']}", f"{record['size']} tokens")
            elif kind == RESIZE:
                divergence = _replay_resize(controller, rank, index, record)
                if divergence is not None:
                    return divergence
            elif kind == DECODE:
                divergence = _replay_decode(controller, rank, index, record)
                if divergence is not None:
                    return divergence
            elif kind == "pick":
                ready = [(int(stage), int(seq)) for stage, seq in record["ready"]]
                if not ready:
                    raise ValueError("a pick needs at least one ready item")
                stages = controller.layout.num_stages
                if any(not 0 <= stage < stages or seq < 0 for stage, seq in ready):
                    raise ValueError(f"a ready item names a stage outside 0..{stages - 1} or a negative "
                                     "micro-batch")
                expected_item = controller.pick(rank, ready)
                observed_item = tuple(int(x) for x in record["chosen"])
                if len(observed_item) != 2:
                    raise ValueError(f"chosen must be a [stage, micro-batch] pair, got {record['chosen']!r}")
                if observed_item != expected_item:
                    return Divergence(rank, index, None, f"run {_item_text(expected_item)} first of {_items_text(ready)}",
                                      f"{_item_text(observed_item)} first")
            else:
                raise TraceError(f"rank {rank}, decision {index}: unknown kind {kind!r}")
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(inf)
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"rank {rank}, decision {index}: unreadable record {record!r} ({exc!r})") from None
    return None


def _count(record: dict, key: str, least: int) -> int:
    """A token count of a decision record; ValueError (an unreadable record) below ``least``."""
    value = int(record[key])
    if value < least:
        raise ValueError(f"{key} must be >= {least}, got {value}")
    return value


def _over_budget(controller: Controller, rank: int, index: int, mb: MicroBatch) -> Divergence | None:
    """On a server that only prefills, an ``auto`` size bounds every prefill forward formed
    after it: a batch of new requests gets it as budget (``Controller.new_batch_budget``), a
    chunked request's chunks are cut at it."""
    bound = controller.new_batch_budget(mb.num_tokens)
    if not mb.is_prefill or mb.num_tokens <= bound:
        return None
    return Divergence(rank, index, mb.seq, f"a prefill forward of at most {bound} tokens (the auto size)",
                      f"{mb.num_tokens} tokens")


def _replay_resize(controller: Controller, rank: int, index: int, record: dict) -> Divergence | None:
    """The controller told the recorded situation must choose the recorded cut (size, and
    whether tapered; a record without ``tapered`` is a fixed cut)."""
    lengths = [int(n) for n in record["lengths"]]
    expected = controller.resize(lengths)
    if expected is None:
        raise TraceError(f"rank {rank}, decision {index}: a resize record in a trace without auto_chunk_cap "
                         "in its controller inputs")
    cut = (expected, controller.auto_tapered)
    recorded = (int(record["size"]), bool(record.get("tapered", False)))
    if cut != recorded:
        shown = ", ".join(map(str, lengths[:8])) + (", ..." if len(lengths) > 8 else "")
        return Divergence(rank, index, None, f"a {_cut_text(*cut)} for prompts of [{shown}] tokens",
                          _cut_text(*recorded))
    return None


def _cut_text(size: int, tapered: bool) -> str:
    return f"size of {size} tokens" + (", tapered" if tapered else "")


def _replay_decode(controller: Controller, rank: int, index: int, record: dict) -> Divergence | None:
    """A ``decode`` record names the decode slots that could take the requests (the others were
    in flight); the controller, asked with those, must decide the recorded move."""
    slot = int(record["from_slot"])
    running = {int(d): int(count) for d, count in record["running"]}
    observed_slot = None if record["chosen"] is None else int(record["chosen"])
    in_flight = [d for d in controller.decode.decode_slots if d not in running]
    move = controller.decode_move(slot, prefill_ended=True, running=running, in_flight=in_flight)
    observed = f"slot {observed_slot} of {running} from slot {slot}"
    if move is None:
        return Divergence(rank, index, None, f"no move: slot {slot} is a decode slot", observed)
    if dict(move.running) != running:
        return Divergence(rank, index, None, f"decode slots {sorted(dict(move.running))} to choose from",
                          observed)
    if move.chosen != observed_slot:
        def text(chosen: int | None) -> str:
            return "hold (no decode slot open)" if chosen is None else f"join decode slot {chosen} of {running}"
        return Divergence(rank, index, None, text(move.chosen), text(observed_slot))
    return None


def _admission_text(decision: Admission) -> str:
    return {"no": "hold (no admission)", "yes": "admit", "packed": "admit as packed"}[decision.value]


def _item_text(item: tuple[int, int]) -> str:
    return f"stage {item[0]} of micro-batch {item[1]}"


def _items_text(items: list[tuple[int, int]]) -> str:
    return "[" + ", ".join(_item_text(item) for item in items) + "]"


# --------------------------------------------------------------------- server vs planner
@dataclass(frozen=True, slots=True)
class ServerWorkload:
    """The prefill work of a traced server, in the order it admitted it, and its controller inputs."""

    inputs: dict
    request_ids: tuple[str, ...]
    chunk_sizes: tuple[tuple[int, ...], ...]
    """Per request, the tokens of each of its micro-batches (SGLang's chunks)."""

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sum(sizes) for sizes in self.chunk_sizes)

    @property
    def chunk_size(self) -> int:
        return max(size for sizes in self.chunk_sizes for size in sizes)

    @property
    def mode(self) -> str:
        return str(self.inputs["mode"])

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.inputs["stage_layers"])

    def layout(self) -> Layout:
        return recorded_layout(self.inputs)

    def cost_model(self) -> StageCostModel:
        return _cost_model(self.inputs["cost"])


def server_workload(trace_dir: str | Path) -> ServerWorkload:
    """Rank 0's admitted prefill micro-batches as requests with chunk sizes (``TraceError`` when the
    planner cannot express them: a micro-batch of several requests, decode, or chunks that a fixed
    chunk size does not reproduce)."""
    inputs = load_trace(trace_dir)[0]
    chunks: dict[str, list[int]] = {}
    for record in inputs.get("decisions") or []:
        if record.get("kind") != "admit":
            continue
        if not record["prefill"] or len(record["requests"]) != 1:
            raise TraceError(f"micro-batch {record['seq']} carries {'prefill' if record['prefill'] else 'decode'} "
                             f"of requests {record['requests']}: the planner plans one request's prefill chunk per "
                             "micro-batch; trace a load of one-token answers whose lengths divide the chunk size")
        chunks.setdefault(record["requests"][0], []).append(int(record["tokens"]))
    if not chunks:
        raise TraceError(f"{str(trace_dir)!r} holds no admitted prefill micro-batch")
    workload = ServerWorkload(inputs["controller"], tuple(chunks), tuple(tuple(sizes) for sizes in chunks.values()))
    fixed = FixedChunker(workload.chunk_size)
    for rid, sizes in zip(workload.request_ids, workload.chunk_sizes):
        if [n for _, n in split_request(fixed, sum(sizes))] != list(sizes):
            raise TraceError(f"request {rid}'s chunks {list(sizes)} are not fixed chunks of {workload.chunk_size}")
    return workload


class DecisionRecorder(Controller):
    """A ``Controller`` that writes each call as the server's loops record it (``--vpp-trace``):
    drop-in for the planner's, whose request indices ``names`` turns into request ids."""

    def __init__(self, *args, names: Sequence[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.names = names
        self.decisions: dict[int, list[dict]] = {rank: [] for rank in range(self.layout.num_ranks)}
        self._held: set[int] = set()

    def admission(self, mb: MicroBatch) -> Admission:
        decision = super().admission(mb)
        if decision is Admission.NO and mb.seq not in self._held:
            self._held.add(mb.seq)
            self.decisions[0].append({"kind": HOLD, **micro_batch_record(mb, self.names)})
        return decision

    def on_admitted(self, mb: MicroBatch, decision: Admission) -> None:
        self.decisions[0].append({"kind": ADMIT, "decision": str(decision), **micro_batch_record(mb, self.names)})
        super().on_admitted(mb, decision)

    def on_left(self, seq: int) -> None:
        self.decisions[0].append({"kind": LEFT, "seq": seq})
        super().on_left(seq)

    def pick(self, rank: int, ready: Sequence[tuple[int, int]]) -> tuple[int, int]:
        chosen = super().pick(rank, ready)
        if len(ready) > 1:
            self.decisions[rank].append({"kind": PICK, "ready": [list(i) for i in ready], "chosen": list(chosen)})
        return chosen


@dataclass(frozen=True, slots=True)
class OrderComparison:
    rank: int
    num_equal: int
    """Records equal on both sides before the first different event."""
    event_difference: str | None
    """The first different event (None: both lists are equal to their ends)."""
    num_compared: int
    """Server decisions taken in a situation the planner also met (same controller state and
    micro-batch, or same ready items), each compared with the planner's decision there."""
    num_decisions: int
    """Server decisions on this rank."""
    divergence: Divergence | None


def compare_decisions(server: Sequence[dict], planner: Sequence[dict], rank: int, inputs: dict,
                      fold_stage: int | None = None) -> OrderComparison:
    """A rank's server records against a planner's (see the module doc): the records shared from
    the start, then every server decision whose situation the planner met too. ``inputs``:
    the trace's controller inputs. ``fold_stage``: on the rank that owns both sides of the fold
    point the server runs the fold stage right after the stage before it without asking; the
    planner's picks of it are checked and skipped."""
    # The planner has no micro-batch slots, so no decode grouping to compare.
    server = [record for record in server if record["kind"] not in (DECODE, RESIZE)]
    ours: list[dict] = []
    for record in planner:
        if fold_stage is not None and record["kind"] == "pick" and any(s == fold_stage for s, _ in record["ready"]):
            if record["chosen"][0] != fold_stage:
                divergence = Divergence(rank, len(ours), None, f"stage {fold_stage} right after stage {fold_stage - 1}",
                                        f"{_item_text(tuple(record['chosen']))} first")
                return OrderComparison(rank, 0, None, 0, 0, divergence)
            continue
        ours.append(record)
    num_equal, event_difference = _common_events(server, ours)
    planner_answers = dict(_situations(ours, inputs, rank))
    compared = 0
    situations = _situations(server, inputs, rank)
    for index, (situation, answer) in enumerate(situations):
        if situation not in planner_answers:
            continue
        compared += 1
        if planner_answers[situation] != answer:
            divergence = _situation_divergence(rank, index, situation, planner_answers[situation], answer)
            return OrderComparison(rank, num_equal, event_difference, compared, len(situations), divergence)
    return OrderComparison(rank, num_equal, event_difference, compared, len(situations), None)


def _situations(records: Sequence[dict], inputs: dict, rank: int) -> list[tuple[tuple, str]]:
    """(situation, decision) of each decision in ``records``, with a fresh controller fed the
    records' own events to know the state each admission question was asked in."""
    controller = _build_controller(inputs, rank)
    out: list[tuple[tuple, str]] = []
    for record in records:
        kind = record["kind"]
        if kind in ("admit", "left") and (int(record["seq"]) in controller.in_flight_seqs) == (kind == "admit"):
            break  # events the controller cannot follow (replay_trace reports them): no later state is known
        if kind in ("admit", "hold"):
            mb = micro_batch_from_record(record)
            fields = (mb.seq, tuple(record["requests"]), mb.start, mb.num_tokens, mb.ends_request, mb.is_prefill)
            decision = record.get("decision", "no")
            out.append((("admission", controller.state_key(), fields), decision))
            if kind == "admit":
                controller.on_admitted(mb, Admission(decision))
        elif kind == "left":
            controller.on_left(int(record["seq"]))
        elif kind == "pick":
            ready = tuple(sorted(tuple(item) for item in record["ready"]))
            out.append((("pick", ready, controller.pick_key(rank)), str(tuple(record["chosen"]))))
    return out


def _situation_divergence(rank: int, index: int, situation: tuple, expected: str, observed: str) -> Divergence:
    if situation[0] == "pick":
        ready = list(situation[1])
        return Divergence(rank, index, None, f"{expected} first of {_items_text(ready)} (as the planner)",
                          f"{observed} first")
    return Divergence(rank, index, situation[2][0], f"{_admission_text(Admission(expected))} (as the planner)",
                      _admission_text(Admission(observed)))


def _common_events(server: Sequence[dict], planner: Sequence[dict]) -> tuple[int, str | None]:
    """Records equal on both sides from the start, and the first difference."""
    for index, (a, b) in enumerate(zip(server, planner)):
        if _record_key(a) != _record_key(b):
            return index, f"record {index}: {_record_key(a)} on the server, {_record_key(b)} in the planner"
    num_equal = min(len(server), len(planner))
    if len(server) != len(planner):
        longer = "server" if len(server) > num_equal else "planner"
        return num_equal, f"the {longer} has {abs(len(server) - len(planner))} more records"
    return num_equal, None


def _record_key(record: dict) -> tuple:
    if record["kind"] == "pick":
        return ("pick", tuple(sorted(map(tuple, record["ready"]))), tuple(record["chosen"]))
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in record.items()))
