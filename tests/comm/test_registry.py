"""Backend discovery, probing and specs; the CPU path imports no device library."""

from __future__ import annotations

import importlib.metadata as metadata
import sys

import pytest

from comm_support import REPO
from sglang_vpp.comm import registry
from sglang_vpp.comm.errors import BackendUnavailableError, CommConfigError, UnknownBackendError
from sglang_vpp.comm.gloo import GlooBackend


def test_gloo_is_registered_through_the_entry_point_group() -> None:
    entry = {ep.name: ep for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}["gloo"]
    assert entry.value == "sglang_vpp.comm.gloo:GlooBackend"
    assert entry.load() is GlooBackend


def test_sibling_distributions_declare_their_entry_points() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    for name, folder in (("nccl", "cuda"), ("hccl", "ascend")):
        project = tomllib.loads((REPO / "backends" / folder / "pyproject.toml").read_text())
        points = project["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
        assert points == {name: registry.KNOWN_BACKENDS[name].target}
        assert project["project"]["name"] == registry.KNOWN_BACKENDS[name].distribution
    cuda = tomllib.loads((REPO / "backends" / "cuda" / "pyproject.toml").read_text())
    assert "nvidia-nccl-cu12" in cuda["project"]["dependencies"]


def test_a_third_party_backend_is_found_without_touching_the_core(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = metadata.EntryPoint("mine", "sglang_vpp.comm.gloo:GlooBackend", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"mine": fake})
    assert "mine" in registry.backend_names()
    assert isinstance(registry.make_backend("mine"), GlooBackend)


def test_specs_and_unknown_names() -> None:
    assert registry.parse_backend_spec("hccl@double") == ("hccl", True)
    assert registry.parse_backend_spec("gloo") == ("gloo", False)
    with pytest.raises(UnknownBackendError) as info:
        registry.parse_backend_spec("mpi")
    assert isinstance(info.value, ValueError)
    for name in ("gloo", "hccl", "nccl", "@double"):
        assert name in str(info.value)
    with pytest.raises(CommConfigError, match="only device backends"):
        registry.make_backend("gloo@double")
    with pytest.raises(CommConfigError, match="only device backends"):  # before any rank starts
        registry.parse_backend_spec("gloo@double")
    with pytest.raises(CommConfigError, match="takes no options"):
        registry.make_backend("gloo", hccl_buffer_size_mb=3)


def test_probe_never_raises_and_says_why() -> None:
    statuses = {s.name: s for s in registry.probe_backends()}
    assert statuses["gloo"].available and "torch" in statuses["gloo"].versions
    assert statuses["gloo"].distribution == "sglang-vpp" and statuses["gloo"].version
    for name in ("nccl", "hccl"):
        status = statuses[name]
        if not status.available:
            assert status.reason and status.fix, status


def test_device_backends_report_missing_hardware_here() -> None:
    from sglang_vpp_ascend.hccl import HcclBackend
    from sglang_vpp_cuda.nccl import NcclBackend
    import torch

    if torch.version.cuda is None:
        status = NcclBackend.probe()
        assert not status.available and "CPU build" in status.reason
        with pytest.raises(BackendUnavailableError, match="CPU build"):
            NcclBackend().api  # noqa: B018 - loading the real API is what must fail
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        status = HcclBackend.probe()
        assert not status.available and "torch_npu" in status.reason
        with pytest.raises(BackendUnavailableError, match="torch_npu is not installed"):
            HcclBackend().api  # noqa: B018


def test_double_specs_build_the_real_backend_classes() -> None:
    backend = registry.make_backend("hccl@double", hccl_buffer_size_mb=64)
    assert type(backend).__name__ == "HcclBackend" and backend.describe() == "hccl@double"
    assert backend.hccl_buffer_size_mb == 64
    assert type(registry.make_backend("nccl@double")).__name__ == "NcclBackend"


def test_cpu_path_imports_no_device_library() -> None:
    # In-process: this test session imported every comm module, both sibling distributions, and
    # probed every backend; none of that may have pulled in a device library.
    import sglang_vpp_ascend.hccl  # noqa: F401
    import sglang_vpp_cuda.nccl  # noqa: F401

    registry.probe_backends()
    loaded = [name for name in sys.modules if name.startswith(("torch_npu", "nvidia"))]
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        assert loaded == [], loaded
