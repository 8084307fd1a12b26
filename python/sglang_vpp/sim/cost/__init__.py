"""Cost models for the simulator (all ``StageCostModel``\\ s of the schedule core).

- ``base``: ``StageTime`` and ``BreakdownCostModel`` (split a stage's time into math, exposed TP
  collectives and host overhead).
- ``analytic``: FLOPs and bytes from a model preset and a hardware preset.
- ``fitted``: ``f(c, L) = a c (c + L) + b (c + L) + d`` fitted on measured actions.
- ``table``: exact measured costs replayed by (stage, request, chunk).
- ``samples``: the measured-cost file format.
"""
