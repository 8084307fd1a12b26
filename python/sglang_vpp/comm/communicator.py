"""``Communicator``: the one ``PipelineCommunicator`` implementation, for every backend.

Creation (``create_communicator``), on every rank, collectively:

1. ``backend.prepare``: device choice and checks (NCCL/HCCL: one rank per device).
2. ``backend.open_link`` for every (rank pair, group name), pairs sorted, groups in config order:
   the same sequence of ``new_group`` calls on every rank, as torch requires. Each group gets the
   transport timeout explicitly.
3. One ``Channel`` (thread) per link of this rank.
4. Warm-up: one ``exchange`` per link in the same global order. Each rank's sequence is a
   subsequence of one global order, so no cycle of waits can form. It connects lazily initialised
   device communicators and proves every link before real traffic.
5. Distinct-communicator check: the links to one peer must have pairwise different
   ``communicator_id()``; otherwise ``CommunicatorAliasError`` (a registry that merged "two"
   groups into one communicator brings back exactly the single-group hang).

Use: ``isend`` / ``irecv`` / ``exchange`` route to the channel of ``(group, peer)``; handles
complete from channel threads and wake ``wait_any`` through one condition variable.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Sequence

import torch.distributed as dist

from .base import CommBackend, CommHandle, Link, LinkSpec, OpKind, PipelineCommunicator, TensorDict
from .channel import Channel, OpHandle
from .config import CommConfig
from .errors import CommConfigError, CommTimeoutError, CommunicatorAliasError

__all__ = ["Communicator", "create_communicator"]

_log = logging.getLogger(__name__)
_CLOSE_GRACE_S = 0.2  # threads not stuck in a transport wait end within milliseconds of stop()


class Communicator(PipelineCommunicator):
    """Pipeline communicator of one rank over any ``CommBackend``. Build with ``create_communicator``."""

    def __init__(self, backend: CommBackend, rank: int, world_size: int, config: CommConfig,
                 links: dict[tuple[str, int], Link], all_links: list[Link]) -> None:
        self.backend = backend
        self.backend_name = backend.describe()
        self.rank = rank
        self.world_size = world_size
        self.config = config
        self.group_names = tuple(config.group_names)
        self._cond = threading.Condition()
        self._closed = False
        self._links = links
        self._ordered_links = all_links  # this rank's links in the global creation order
        self._channels: dict[tuple[str, int], Channel] = {
            key: Channel(link, transport_timeout_s=config.effective_transport_timeout_s,
                         default_timeout_s=config.timeout_s, notify=self._notify)
            for key, link in links.items()
        }

    def __repr__(self) -> str:
        return (f"<Communicator rank {self.rank}/{self.world_size} backend {self.backend_name} "
                f"links {sorted(self._channels)}>")

    # ------------------------------------------------------------------ operations
    def isend(self, tensors: TensorDict, dst: int, group: str, *, action: str | None = None) -> CommHandle:
        return self._channel(group, dst, action).submit(OpKind.SEND, tensors, action)

    def irecv(self, src: int, group: str, *, action: str | None = None) -> CommHandle:
        return self._channel(group, src, action).submit(OpKind.RECV, None, action)

    def exchange(self, tensors: TensorDict, peer: int, group: str, *, action: str | None = None) -> CommHandle:
        return self._channel(group, peer, action).submit(OpKind.EXCHANGE, tensors, action)

    def wait_any(self, handles: Sequence[CommHandle], timeout_s: float | None = None) -> list[CommHandle]:
        if not handles:
            raise CommConfigError("wait_any() got no handles. Fix: pass at least one pending handle.")
        limit = self.config.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._cond:
            while True:
                ready = [h for h in handles if h.is_ready()]
                if ready:
                    return ready
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        shown = ", ".join(h.action for h in handles[:4]) + (" ..." if len(handles) > 4 else "")
        first = handles[0]
        pending = first._channel.describe_pending(first) if isinstance(first, OpHandle) else "pending"
        raise CommTimeoutError(rank=self.rank, peer=first.peer, group=first.group, action=first.action,
                               timeout_s=limit,
                               detail=f"none of {len(handles)} operations ready ({shown}); first: {pending}")

    def communicator_ids(self) -> dict[tuple[str, int], str]:
        return {key: link.communicator_id() for key, link in self._links.items()}

    def links(self) -> dict[tuple[str, int], Link]:
        """``(group, peer) -> Link`` of this rank (for diagnostics and backend-specific checks)."""
        return dict(self._links)

    # ------------------------------------------------------------------ lifecycle
    def warm_up(self) -> None:
        """Exchange one small message on every link, in the global link order."""
        for link in self._ordered_links:
            key = (link.spec.group, link.peer)
            self._channels[key].submit(OpKind.EXCHANGE, {"warmup": self.rank}, f"warmup@{link.spec}").wait(
                self.config.effective_transport_timeout_s)

    def check_distinct(self) -> None:
        """Raise ``CommunicatorAliasError`` if two groups to one peer share a communicator."""
        by_peer: dict[int, dict[str, str]] = {}
        for (group, peer), link in self._links.items():
            by_peer.setdefault(peer, {})[group] = link.communicator_id()
        for peer, ids in sorted(by_peer.items()):
            seen: dict[str, str] = {}
            for group, comm_id in ids.items():
                if comm_id in seen:
                    raise CommunicatorAliasError(
                        rank=self.rank, peer=peer, group=group, action="create",
                        detail=(f"groups '{seen[comm_id]}' and '{group}' to rank {peer} resolve to the same "
                                f"communicator {comm_id!r}; the two directions would share one ordered "
                                "queue and the fold-back exchange can hang"),
                        fix=("give every group distinct creation options (HCCL: a distinct hccl_config "
                             "group_name per direction) so no registry can merge them"))
                seen[comm_id] = group

    def close(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
        limit = self.config.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        if drain:
            for channel in self._channels.values():
                if channel.broken is None:
                    channel.drain(max(0.0, deadline - time.monotonic()))
        for channel in self._channels.values():
            channel.stop()
        grace_end = time.monotonic() + _CLOSE_GRACE_S
        for key, channel in self._channels.items():
            if channel.join(max(0.0, grace_end - time.monotonic())):
                self._links[key].close()
            else:
                # Stuck in a transport wait: leave the daemon thread and its group to the transport
                # deadline; destroying the group under it gains nothing.
                _log.warning("rank %d: channel %s still in a transport wait at close", self.rank, key)
        self._notify()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ internals
    def _channel(self, group: str, peer: int, action: str | None) -> Channel:
        channel = self._channels.get((group, peer))
        if channel is None:
            known = ", ".join(f"{g}<->{p}" for g, p in sorted(self._channels)) or "none"
            raise CommConfigError(
                f"rank {self.rank} has no link on group {group!r} to rank {peer!r} (action {action}); "
                f"its links are: {known}. Fix: use one of these, or add the pair to CommConfig.pairs "
                "and the group to CommConfig.group_names.")
        return channel

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()


def create_communicator(backend: str | CommBackend = "gloo", config: CommConfig | None = None) -> Communicator:
    """Create this rank's communicator; collective: every rank of the world calls it alike.

    ``backend``: a registered name (``gloo``, ``nccl``, ``hccl``), a test-double spec
    (``nccl@double``, ``hccl@double``) or a ``CommBackend`` instance. Requires an initialised
    default process group (any backend; gloo suffices) for rendezvous."""
    from .registry import make_backend

    config = config or CommConfig()
    if not dist.is_available() or not dist.is_initialized():
        raise CommConfigError(
            "torch.distributed is not initialised. Fix: call torch.distributed.init_process_group(...) "
            "first (sglang_vpp.comm.launcher.run_ranks does it for local tests).")
    if isinstance(backend, str):
        backend = make_backend(backend, **dict(config.backend_options))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size < 2:
        raise CommConfigError(f"a pipeline communicator needs at least 2 ranks, the world has {world_size}. "
                              "Fix: launch 2 or more ranks.")
    backend.prepare(rank, world_size, config)
    timeout_s = config.effective_transport_timeout_s
    links: dict[tuple[str, int], Link] = {}
    ordered: list[Link] = []
    for pair in config.resolved_pairs(world_size):
        for group in config.group_names:
            link = backend.open_link(LinkSpec(group, pair), rank, timeout_s)
            if link is not None:
                links[(group, link.peer)] = link
                ordered.append(link)
    communicator = Communicator(backend, rank, world_size, config, links, ordered)
    try:
        if config.warmup:
            communicator.warm_up()
        if config.check_distinct:
            communicator.check_distinct()
    except BaseException:
        communicator.close(drain=False, timeout_s=0.0)
        raise
    return communicator
