"""Test support for the communication layer, importable by tests, the doctor and device runners.

- ``device_double``: ``DoubleDeviceApi``, the gloo-based stand-in for NCCL/HCCL hardware.
- ``scenarios``: rank programs of the conformance suite (round trip, exchange, stress, dead and
  stuck peers, negative control), run through ``sglang_vpp.comm.launcher.run_ranks``.
- ``schedule_walk``: executes a schedule core ``Schedule``'s SEND/RECV/F actions on a communicator.
"""
