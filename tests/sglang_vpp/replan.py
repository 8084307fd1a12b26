"""Replan a traced server's workload with its cost table in the simulator and in the reference
runtime's control plane (both run the schedule core's planner), recording their decisions in the
server's trace format."""

from __future__ import annotations


from sglang_vpp.runtime.control import run_controller_config
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.schedule import ActionKind, Planner, RequestSpec
from sglang_vpp.schedule.auto_size import LiveSituation
from sglang_vpp.serving.decision_replay import DecisionRecorder, ServerWorkload
from sglang_vpp.sim.engine import simulate_live
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.workloads.base import Workload


def _computes(actions, positions) -> list[tuple[int, int]]:
    return [(a.stage_index, positions[(a.request_index, a.chunk_index)]) for a in actions
            if a.kind is ActionKind.COMPUTE]


def replan(workload: ServerWorkload, monkeypatch) -> tuple[list[DecisionRecorder], list, list]:
    """Plan the server's workload with its cost table in the simulator and in the reference
    runtime's control plane; returns both planners' recorded decisions and per-rank orders."""
    import sglang_vpp.schedule.factory as factory_module

    recorders: list[DecisionRecorder] = []

    def recording(*args, **kwargs):
        recorders.append(DecisionRecorder(*args, names=workload.request_ids, **kwargs))
        return recorders[-1]

    with monkeypatch.context() as patch:  # only these two planners record
        patch.setattr(factory_module, "Controller", recording)
        layout = workload.layout()
        cost = workload.cost_model()
        pp = layout.num_ranks
        # The simulator: decides as it executes the streams on the recorded costs.
        sim_run = run_mode(workload.mode, Workload("server", tuple(RequestSpec(n) for n in workload.lengths)), cost,
                           RunConfig(pp, workload.chunk_size, workload.stage_layers, max_in_flight=workload.inputs.get("max_in_flight"),
                                     fold=layout.fold),
                           layout.num_layers, keep_schedule=True)
        positions = {chunk.key: i for i, chunk in enumerate(sim_run.schedule.chunks)}
        sim_order = [[] for _ in range(pp)]
        for piece in sorted(sim_run.sim.timeline, key=lambda piece: (piece.start, piece.end)):
            if piece.kind == "compute":
                sim_order[piece.rank].append((piece.stage_index, positions[(piece.request_index, piece.chunk_index)]))
        # The reference runtime: rank 0's control feed, as it plans while running (every request here).
        spec = RunSpec(model="tiny", mode=workload.mode, num_ranks=pp, chunk_size=workload.chunk_size,
                       requests=tuple(RequestArrival(n) for n in workload.lengths), split=workload.stage_layers,
                       planner_cost=cost, fold=str(layout.fold))
        # The runtime's planner decides on its executor's reports; the simulator's live engine
        # stands in for the executor here (durations from the same cost table).
        planner = Planner(run_controller_config(spec, layout), sees_transfers=True)
        # Admit the burst as rank 0 does: sized together (Sent), then submitted.
        LiveSituation(planner).sent([RequestSpec(n, 0.0) for n in workload.lengths])
        for n in workload.lengths:
            planner.submit(RequestSpec(n, 0.0))
        simulate_live(planner, cost)
    runtime_positions = {chunk.key: i for i, chunk in enumerate(planner.sequence)}
    runtime_order = [_computes(planner.rank_actions(r), runtime_positions) for r in range(pp)]
    return recorders, sim_order, runtime_order
