"""sglang-vpp: Virtual Pipeline Parallelism (fold-back pipeline) for chunked prefill.

Layers of the package, imports pointing one way (schedule <- sim/runtime/sglang_plugin <- cli):

- ``schedule``: the pure-Python scheduler core (layouts, action IR, policies, validator,
  deadlock checker). Imports no torch.
- ``sim``: runs schedules on a virtual clock with cost models.
- ``comm``: the pipeline communicator abstraction and its gloo backend.
- ``runtime``: real multi-process execution with torch.distributed.
- ``sglang_plugin``: the only importer of sglang.
- ``cli``: the ``sglang-vpp`` Typer application.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
