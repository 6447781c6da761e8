"""Data-parallel training in PyTorch's own engine (--parallel ddp).

A rank joins a torch.distributed process group from the variables its launcher set (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): ckcheck's own launcher (`--world-size N`, ranks meeting on
127.0.0.1) or torchrun. Rank 0 hosts the store, listening on the address the ranks meet on only
(PyTorch's own store server listens on every interface); under torchrun the agent's store is
joined instead. Gloo's connections stay on loopback for ranks on one machine.

The engine wraps the user's module in DistributedDataParallel with the factory's options; the
runner's steps go through it, except the single-process reference, which runs the bare module.
"""

import datetime
import os
import socket

import torch
import torch.distributed as dist

# The options of DistributedDataParallel a factory may set (its 'ddp' dict).
DDP_OPTIONS = ("find_unused_parameters", "static_graph", "broadcast_buffers", "bucket_cap_mb",
               "gradient_as_bucket_view", "output_device", "device_ids", "init_sync")


def check_ddp_options(options):
    """The factory's 'ddp' dict, checked: a UsageError names an unknown key."""
    from ckcheck._model import UsageError

    if options is None:
        return {}
    if not isinstance(options, dict):
        raise UsageError(f"the factory's 'ddp' must be a dict of DistributedDataParallel options, not "
                         f"{type(options).__name__}")
    unknown = sorted(set(options) - set(DDP_OPTIONS))
    if unknown:
        raise UsageError(f"the factory's 'ddp' has unknown keys {unknown}; known: {', '.join(DDP_OPTIONS)}")
    return dict(options)


def _listen(host, port):
    """A listening socket on host:port only, handed to the store as its server socket."""
    last = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
            s.listen(128)
            return s.detach()
        except OSError as e:
            last = e
            s.close()
    raise RuntimeError(f"cannot listen on {host}:{port} ({last})")


class ProcessGroup:
    """This rank's process group, and what the runner's Collective needs of it."""

    def __init__(self, timeout_s, device_type="cpu"):
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = int(os.environ["MASTER_PORT"])
        if addr == "localhost":
            addr = "127.0.0.1"
        if addr == "127.0.0.1":
            # Gloo's own sockets: on the loopback interface, like the store's.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        host = self.rank == 0 and not agent
        # A collective gives up in half the run's limit, so that a rank waiting on a hung peer says
        # so before the limit stops them all (as ckcheck's own process group does).
        op_timeout = datetime.timedelta(seconds=max(1, timeout_s // 2))
        try:
            store = dist.TCPStore(addr, port, self.world_size, host, datetime.timedelta(seconds=timeout_s),
                                  wait_for_workers=not agent, master_listen_fd=_listen(addr, port) if host else None,
                                  use_libuv=False)
        except Exception as e:
            raise RuntimeError(f"rank {self.rank} could not reach the store at {addr}:{port} within {timeout_s} s: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        store.set_timeout(op_timeout)
        self.store = dist.PrefixStore("ckcheck", store) if agent else store
        self.backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self.store), rank=self.rank,
                                world_size=self.world_size, timeout=op_timeout)

    def allreduce_sum(self, tensors):
        for t in tensors:
            dist.all_reduce(t)

    def set(self, key, value):
        self.store.set(key, value)

    def get(self, key):
        return self.store.get(key).decode()

    def barrier(self):
        dist.barrier()

    def close(self):
        if dist.is_initialized():
            dist.destroy_process_group()


class Engine:
    """DistributedDataParallel around the module, made when the first engine step begins (every
    rank begins it together) and made again after a step the reducer did not finish."""

    def __init__(self, module, options, timeout_s):
        self.module = module
        self.options = options
        self.group = ProcessGroup(timeout_s, next((p.device.type for p in module.parameters()), "cpu"))
        self.wrapper = None
        self.on = False

    def use(self, on):
        self.on = on
        if on and self.wrapper is None:
            from torch.nn.parallel import DistributedDataParallel

            self.wrapper = DistributedDataParallel(self.module, **self.options)

    def __call__(self, *args, **kwargs):
        return (self.wrapper if self.on else self.module)(*args, **kwargs)

    def step_done(self):
        """Raises DDP's own error when the step's reduction did not finish (a parameter whose
        gradient never came); the next step gets a fresh wrapper."""
        if not self.on or self.wrapper is None:
            return
        try:
            self.wrapper._check_reducer_finalized()
        except RuntimeError:
            self.wrapper = None
            raise

    def close(self):
        self.wrapper = None
        self.group.close()
