"""Client-side tools for real SGLang servers: start and stop them, read their pipeline records.

- ``launcher``: ``ServerConfig`` / ``SGLangServer`` / ``ServerPool`` (start, health, kill the tree).
- ``pipeline_report``: per-rank prefill idle from the plugin's ``--vpp-trace`` files.
- ``decision_replay``: ``check --trace``: replays a VPP server's recorded decisions through the
  schedule core's controller and reports the first divergence.
- ``record_replay``: a server's executed prefill order on the simulator's engine, timed by
  measured per-stage CPU times (dedicated-hardware estimate).
- ``bench_serving``: one pass of SGLang's own load generator (``python -m sglang.benchmark.serving``'s
  command line, run by ``bench_worker``'s process that imports it once) and its JSONL read back; ``report`` / ``results`` / ``plots``: bench-serve's tables, tagged JSON
  lines, TTFT/ITL distributions and per-rank Gantt.

Used by ``sglang-vpp bench-serve`` and by the tests under tests/sglang and tests/sglang_vpp.
"""
