"""How ranks exchange tensors: torch.distributed, or threads in one process.

`DistTransport` is the real one.  Every channel (src -> dst) the plan uses gets
its own two-rank process group, so on NCCL/HCCL each channel has its own
communicator and stream carrying traffic one way only (see `plan.py` for why
that makes the message order deadlock-free); on gloo it is equally correct.
Messages are posted with `batch_isend_irecv`, one batch per channel at each
posting point.  Collectives (`BCAST`, `AR`) run asynchronously on a group of
their own; results and control messages travel on a separate gloo group.

Shaped messages (`mpipe run --data`, where every step has other shapes): as
Megatron does with `variable_seq_lengths`, each tensor is preceded by a small
header, `HEADER` int64s (the number of dimensions, then the sizes), on a
header group of its own per channel.  The receiver posts the header's
receive ahead (its size is fixed), and once the header has arrived allocates
the buffer and posts the payload's receive on the channel's group.  Payloads
are received in the order their headers were posted, which is the channel's
order, so the message order argument below still holds; the cost is that a
payload's receive is posted only when the receiver waits for it.  An empty
tensor is a header alone.

`LocalTransport` runs every rank as a thread of one process with in-memory
FIFO channels and the same non-blocking semantics.  Tests use it to run many
schedules in seconds; the torchrun tests prove the real path.
"""
from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from ..errors import TransportTimeout

HEADER = 8  # a shaped message's header: ndim, then up to HEADER - 1 sizes


def encode_header(shape: tuple[int, ...], device) -> torch.Tensor:
    if len(shape) >= HEADER:
        raise ValueError(f"a message of {len(shape)} dimensions (at most {HEADER - 1})")
    values = [len(shape), *shape] + [0] * (HEADER - 1 - len(shape))
    return torch.tensor(values, dtype=torch.int64, device=device)


def decode_header(header: torch.Tensor) -> tuple[int, ...]:
    values = header.tolist()
    return tuple(int(v) for v in values[1:1 + int(values[0])])


# --------------------------------------------------------------------------- torch.distributed

class DistTransport:
    def __init__(self, timeout_s: float):
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.timeout = timedelta(seconds=timeout_s)
        self._channels: dict[tuple[int, int], Any] = {}
        self._headers: dict[tuple[int, int], Any] = {}  # per channel, for shaped messages
        self._collectives: dict[tuple, Any] = {}
        # Results and clock pings travel on CPU whatever the compute backend is.
        self.control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def setup(self, channels: list[tuple[int, int]], groups: list[tuple[int, ...]], shaped: bool = False) -> None:
        """Create the groups a plan needs (a collective call: same order on every rank)."""
        for key in channels:
            if key not in self._channels:
                self._channels[key] = self.dist.new_group(sorted(key))
            if shaped and key not in self._headers:
                self._headers[key] = self.dist.new_group(sorted(key))
        for members in groups:
            key = tuple(sorted(members))
            if len(key) > 1 and key not in self._collectives:
                self._collectives[key] = self.dist.new_group(list(key))

    def post(self, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]):
        """Post sends to (dst, tensor) and receives from (src, tensor); one batch per peer."""
        dist = self.dist
        works = []
        by_peer: dict[tuple[int, int], list] = {}
        for dst, t in sends:
            by_peer.setdefault((self.rank, dst), []).append(dist.P2POp(dist.isend, t, dst, self._channels[(self.rank, dst)]))
        for src, t in recvs:
            by_peer.setdefault((src, self.rank), []).append(dist.P2POp(dist.irecv, t, src, self._channels[(src, self.rank)]))
        for key in sorted(by_peer):
            works += dist.batch_isend_irecv(by_peer[key])
        return works

    def wait(self, works) -> None:
        for w in works:
            if not w.wait(self.timeout):
                raise TransportTimeout(f"no data within {self.timeout.total_seconds():g} s")

    def post_shaped(self, sends: list[tuple[int, torch.Tensor]]):
        """Post each (dst, tensor) as a header on the channel's header group, then its payload."""
        dist = self.dist
        works = []
        for dst, t in sends:
            key = (self.rank, dst)
            header = encode_header(tuple(t.shape), t.device)
            works += dist.batch_isend_irecv([dist.P2POp(dist.isend, header, dst, self._headers[key])])
            if t.numel():
                works += dist.batch_isend_irecv([dist.P2POp(dist.isend, t, dst, self._channels[key])])
        return works

    def post_shaped_recv(self, src: int, device):
        """Post the receive of a shaped message's header; `wait_shaped` gives the tensor."""
        dist = self.dist
        header = torch.empty(HEADER, dtype=torch.int64, device=device)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, header, src, self._headers[(src, self.rank)])])
        return (src, header, works)

    def wait_shaped(self, handle) -> torch.Tensor:
        src, header, works = handle
        self.wait(works)
        buf = torch.empty(decode_header(header), dtype=torch.float32, device=header.device)
        if buf.numel():
            dist = self.dist
            self.wait(dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, src, self._channels[(src, self.rank)])]))
        return buf

    def broadcast(self, tensor: torch.Tensor, src: int, members: tuple[int, ...]):
        if len(members) <= 1:
            return []
        return [self.dist.broadcast(tensor, src, group=self._collectives[tuple(sorted(members))], async_op=True)]

    def all_reduce(self, tensor: torch.Tensor, members: tuple[int, ...]):
        if len(members) <= 1:
            return []
        return [self.dist.all_reduce(tensor, group=self._collectives[tuple(sorted(members))], async_op=True)]

    def adopt_group(self, members: tuple[int, ...], group) -> None:
        """Use `group` (a process-grid dimension's, `executor.parallel.grid`) for collectives
        over `members` instead of creating one."""
        self._collectives[tuple(sorted(members))] = group

    def reduce_scatter(self, out: torch.Tensor, tensor: torch.Tensor, members: tuple[int, ...]):
        """Sum `tensor` over `members`; each gets its own equal slice (in member order) in `out`."""
        if len(members) <= 1:
            out.copy_(tensor)
            return []
        group = self._collectives[tuple(sorted(members))]
        return [self.dist.reduce_scatter_single(out, tensor, group=group, async_op=True)]

    def all_gather(self, out: torch.Tensor, tensor: torch.Tensor, members: tuple[int, ...]):
        """Every member's `tensor`, concatenated in member order, into `out`."""
        if len(members) <= 1:
            out.copy_(tensor)
            return []
        group = self._collectives[tuple(sorted(members))]
        return [self.dist.all_gather_single(out, tensor, group=group, async_op=True)]

    def barrier(self) -> None:
        self.dist.barrier(group=self.control)

    def gather(self, obj: Any) -> list[Any] | None:
        out = [None] * self.world if self.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def measure_offset(self, rounds: int = 8) -> float:
        """This rank's clock minus rank 0's (perf_counter seconds), by ping-pong.

        Rank 0 sends its time t0; rank r answers with its time tr; rank 0 reads
        t1.  With symmetric delays tr ~ (t0 + t1) / 2 + offset; the round with
        the smallest t1 - t0 is kept.  Offsets are sent back to each rank.
        """
        dist = self.dist
        buf = torch.zeros(2, dtype=torch.float64)
        offsets = torch.zeros(self.world, dtype=torch.float64)
        for peer in range(1, self.world):
            if self.rank == 0:
                best = (float("inf"), 0.0)
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    buf[0] = t0
                    dist.send(buf, peer, group=self.control)
                    dist.recv(buf, peer, group=self.control)
                    t1 = time.perf_counter()
                    rtt = t1 - t0
                    if rtt < best[0]:
                        best = (rtt, float(buf[1]) - (t0 + t1) / 2)
                # The estimate is off by at most half the round trip.  Ranks on one host
                # share one clock (perf_counter is CLOCK_MONOTONIC), and an offset inside
                # that bound cannot be told from none: taking none keeps same-host
                # timestamps exactly ordered instead of skewing them by up to rtt/2.
                rtt, estimate = best
                offsets[peer] = estimate if abs(estimate) > rtt / 2 else 0.0
            elif self.rank == peer:
                for _ in range(rounds):
                    dist.recv(buf, 0, group=self.control)
                    buf[1] = time.perf_counter()
                    dist.send(buf, 0, group=self.control)
        dist.broadcast(offsets, 0, group=self.control)
        return float(offsets[self.rank])


# --------------------------------------------------------------------------- threads in one process

class LocalHub:
    """Shared state of the ranks of one in-process run."""

    def __init__(self, world: int, timeout_s: float):
        self.world = world
        self.timeout_s = timeout_s
        self.channels: dict[tuple[int, int], queue.Queue] = {}
        self.lock = threading.Lock()
        self.collectives: dict[tuple, dict] = {}
        self.cond = threading.Condition(self.lock)
        self.counters: dict[tuple[int, str, tuple], int] = {}
        self.barrier_obj = threading.Barrier(world)
        self.gathered: list[Any] = [None] * world

    def channel(self, key: tuple[int, int]) -> queue.Queue:
        with self.lock:
            return self.channels.setdefault(key, queue.Queue())


class _LocalRecv:
    def __init__(self, q: queue.Queue, tensor: torch.Tensor):
        self.q, self.tensor = q, tensor

    def wait(self, timeout_s: float) -> bool:
        try:
            data = self.q.get(timeout=timeout_s)
        except queue.Empty:
            return False
        if data.shape != self.tensor.shape:
            raise RuntimeError(f"message shape {tuple(data.shape)} != expected {tuple(self.tensor.shape)}")
        self.tensor.copy_(data)
        return True


class _LocalCollective:
    def __init__(self, hub: LocalHub, key: tuple, rank: int, tensor: torch.Tensor, members, op: str, src: int,
                 out: torch.Tensor | None = None):
        self.hub, self.key, self.rank, self.tensor = hub, key, rank, tensor
        self.members, self.op, self.src = members, op, src
        self.out = tensor if out is None else out

    def wait(self, timeout_s: float) -> bool:
        hub = self.hub
        with hub.cond:
            slot = hub.collectives[self.key]
            if not hub.cond.wait_for(lambda: len(slot["parts"]) == len(self.members), timeout_s):
                return False
            if self.op in ("sum", "reduce_scatter"):
                total = torch.zeros_like(self.tensor)
                for r in sorted(slot["parts"]):
                    total += slot["parts"][r]
                if self.op == "sum":
                    self.out.copy_(total)
                else:  # this member's slice, members in the order given
                    n = self.out.numel()
                    at = list(self.members).index(self.rank)
                    self.out.copy_(total.reshape(-1)[at * n:(at + 1) * n].view_as(self.out))
            elif self.op == "gather":
                self.out.copy_(torch.cat([slot["parts"][r].reshape(-1) for r in self.members]).view_as(self.out))
            else:
                self.tensor.copy_(slot["parts"][self.src])
        return True


class LocalTransport:
    def __init__(self, hub: LocalHub, rank: int):
        self.hub, self.rank, self.world = hub, rank, hub.world

    def setup(self, channels, groups, shaped: bool = False) -> None:
        pass

    def post_shaped(self, sends):
        """Header, then payload, each on a queue of its own per channel (as `DistTransport`)."""
        for dst, t in sends:
            self.hub.channel((self.rank, dst, "header")).put(encode_header(tuple(t.shape), "cpu"))
            if t.numel():
                self.hub.channel((self.rank, dst)).put(t.detach().clone())
        return []

    def post_shaped_recv(self, src: int, device):
        return (src, device)

    def wait_shaped(self, handle) -> torch.Tensor:
        src, device = handle
        try:
            header = self.hub.channel((src, self.rank, "header")).get(timeout=self.hub.timeout_s)
        except queue.Empty:
            raise TransportTimeout(f"no data within {self.hub.timeout_s:g} s") from None
        buf = torch.empty(decode_header(header), dtype=torch.float32, device=device)
        if buf.numel() and not _LocalRecv(self.hub.channel((src, self.rank)), buf).wait(self.hub.timeout_s):
            raise TransportTimeout(f"no data within {self.hub.timeout_s:g} s")
        return buf

    def post(self, sends, recvs):
        works = []
        for dst, t in sends:
            self.hub.channel((self.rank, dst)).put(t.detach().clone())
        for src, t in recvs:
            works.append(_LocalRecv(self.hub.channel((src, self.rank)), t))
        return works

    def wait(self, works) -> None:
        for w in works:
            if not w.wait(self.hub.timeout_s):
                raise TransportTimeout(f"no data within {self.hub.timeout_s:g} s")

    def _collective(self, tensor, members, op, src, out=None):
        if len(members) <= 1:
            if out is not None:
                out.copy_(tensor)
            return []
        hub = self.hub
        with hub.cond:
            ckey = (self.rank, op, tuple(members))
            n = hub.counters.get(ckey, 0)
            hub.counters[ckey] = n + 1
            key = (op, tuple(members), n)
            slot = hub.collectives.setdefault(key, {"parts": {}})
            slot["parts"][self.rank] = tensor.detach().clone()
            hub.cond.notify_all()
        return [_LocalCollective(hub, key, self.rank, tensor, members, op, src, out)]

    def broadcast(self, tensor, src, members):
        return self._collective(tensor, members, "bcast", src)

    def all_reduce(self, tensor, members):
        return self._collective(tensor, members, "sum", -1)

    def adopt_group(self, members, group) -> None:
        pass  # threads need no process group

    def reduce_scatter(self, out, tensor, members):
        return self._collective(tensor, members, "reduce_scatter", -1, out)

    def all_gather(self, out, tensor, members):
        return self._collective(tensor, members, "gather", -1, out)

    def barrier(self) -> None:
        self.hub.barrier_obj.wait(self.hub.timeout_s)

    def gather(self, obj):
        self.hub.gathered[self.rank] = obj
        self.barrier()
        out = list(self.hub.gathered) if self.rank == 0 else None
        self.barrier()
        return out

    def measure_offset(self, rounds: int = 8) -> float:
        return 0.0  # one process, one clock
