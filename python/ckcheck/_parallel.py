"""Data-parallel and sharded training in PyTorch's own engines (--parallel ddp|fsdp).

A rank joins a torch.distributed process group from the variables its launcher set (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT): ckcheck's own launcher (`--world-size N`, ranks meeting on
127.0.0.1) or torchrun. Rank 0 hosts the store, listening on the address the ranks meet on only
(PyTorch's own store server listens on every interface); under torchrun the agent's store is
joined instead. Gloo's connections stay on loopback for ranks on one machine.

`ddp` wraps the user's module in DistributedDataParallel with the factory's options; the runner's
steps go through it, except the single-process reference, which runs the bare module. `fsdp`
shards a copy of the module with FSDP2's fully_shard (its blocks, then the root): fully_shard turns
a module's parameters into DTensor shards in place, and the runner keeps comparing full tensors
-- the user's module stays whole, runs the single-process reference, and holds the full gradients
the sharded copy's step produced.
"""

import datetime
import os
import socket

import torch
import torch.distributed as dist

from ckcheck._base import UsageError, _failure
from ckcheck._core import ParallelKind

# The options of DistributedDataParallel a factory may set (its 'ddp' dict).
DDP_OPTIONS = ("find_unused_parameters", "static_graph", "broadcast_buffers", "bucket_cap_mb",
               "gradient_as_bucket_view", "output_device", "device_ids", "init_sync")


# The types each DistributedDataParallel option takes (checked before any rank starts).
DDP_TYPES = {"find_unused_parameters": bool, "static_graph": bool, "broadcast_buffers": bool,
             "bucket_cap_mb": (int, float), "gradient_as_bucket_view": bool, "init_sync": bool}

# The options of fully_shard a factory may set (its 'fsdp' dict), and 'modules': the module paths
# sharded before the root (default: the model's blocks).
FSDP_OPTIONS = ("reshard_after_forward", "modules")

# --mixed-precision: the parameters' dtype of FSDP2's MixedPrecisionPolicy (gradients reduce in fp32).
MIXED_PRECISION = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_options(key, options, known, what):
    """The factory's `key` dict of `what` options, checked: a UsageError names an unknown key."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise UsageError(f"the factory's '{key}' must be a dict of {what} options, not {type(options).__name__}")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(f"the factory's '{key}' has unknown keys {unknown}; known: {', '.join(known)}")
    return dict(options)


def check_ddp_options(options):
    options = check_options("ddp", options, DDP_OPTIONS, "DistributedDataParallel")
    for key, kind in DDP_TYPES.items():
        if key not in options:
            continue
        value = options[key]
        wrong = isinstance(value, bool) and kind is not bool or not isinstance(value, kind)
        if wrong or (key == "bucket_cap_mb" and not value > 0):
            expected = "True or False" if kind is bool else "a positive number"
            raise UsageError(f"the factory's ddp option {key} takes {expected}, not {type(value).__name__} {value!r}")
    return options


def check_fsdp_options(options):
    options = check_options("fsdp", options, FSDP_OPTIONS, "fully_shard")
    reshard = options.get("reshard_after_forward", True)
    if not isinstance(reshard, (bool, int)) or (not isinstance(reshard, bool) and reshard < 1):
        raise UsageError(f"the factory's fsdp option reshard_after_forward takes True, False or a positive whole "
                         f"number, not {type(reshard).__name__} {reshard!r}")
    modules = options.get("modules")
    if modules is not None and (isinstance(modules, str) or not all(isinstance(m, str) for m in modules)):
        raise UsageError("the factory's fsdp 'modules' must be a list of module paths, as ['layers.0', 'layers.1']")
    return options


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

    kind = ParallelKind.ddp

    def __init__(self, module, options, timeout_s):
        self.module = module
        self.options = options
        self.group = ProcessGroup(timeout_s, next((p.device.type for p in module.parameters()), "cpu"))
        self.wrapper = None
        self.on = False

    def use(self, on):
        self.on = on
        if on and self.wrapper is not None and self._unfinished_anywhere():
            # A step that threw in its backward (a hook fired twice) never reached step_done: its
            # reducer still waits, and would refuse every later step. Every rank makes a fresh one.
            self.wrapper = None
        if on and self.wrapper is None:
            from torch.nn.parallel import DistributedDataParallel

            self.wrapper = DistributedDataParallel(self.module, **self.options)

    def _unfinished_anywhere(self):
        """Whether some rank's last step left its reducer unfinished: decided by all ranks together
        (each calls this as its step begins), so that they make a fresh wrapper together."""
        try:
            self.wrapper._check_reducer_finalized()
            unfinished = torch.zeros(1)
        except RuntimeError:
            unfinished = torch.ones(1)
        dist.all_reduce(unfinished)
        return unfinished.item() > 0

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

    def prepare(self):
        """DDP is made when the first engine step begins (it broadcasts from rank 0)."""

    def hook_fires(self):
        """DDP's reducer fires the parameters' own gradient hooks: the runner counts them."""
        return None

    def close(self):
        self.wrapper = None
        self.group.close()


class FsdpEngine:
    """FSDP2 on a copy of the user's module, made when the first engine step begins.

    The user's module (what the runner reads and the single-process reference trains) is loaded
    into the copy's shards before each engine forward; after the step, the copy's gradients,
    gathered whole (DTensor.full_tensor, every rank together), its buffers and its state
    attributes go back to the module. The parameters' gradient hooks are counted on the shards:
    FSDP2 runs their post-accumulate hooks once it has reduced a gradient."""

    kind = ParallelKind.fsdp
    # FSDP2's own work (all-gathers, casts, reduce-scatters) runs in record_function scopes of these
    # names: ops there are the engine's, not the model's (a checkpoint around an FSDP unit runs its
    # pre-forward all-gather in the forward and not in the recompute).
    op_scopes = ("FSDP::",)

    def __init__(self, adapter, options, timeout_s, mixed_precision="off"):
        self.adapter = adapter
        self.module = adapter.module
        self.options = options
        self.mixed_precision = mixed_precision
        self.param_dtype = MIXED_PRECISION[mixed_precision]
        self.group = ProcessGroup(timeout_s, next((p.device.type for p in self.module.parameters()), "cpu"))
        self.sharded = None
        self.on = False
        self._finished = True  # the copy's last step ran to its end
        self._fires = []

    def _build(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        twin = self.adapter.twin_module()
        policy = (MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
                  if self.param_dtype is not None else MixedPrecisionPolicy())
        kwargs = {"mp_policy": policy}
        if "reshard_after_forward" in self.options:
            kwargs["reshard_after_forward"] = self.options["reshard_after_forward"]
        paths = self.options.get("modules")
        paths = list(paths) if paths is not None else self.adapter.blocks()
        for path in paths:
            try:
                block = twin.get_submodule(path)
            except AttributeError as e:
                raise UsageError(f"the factory's fsdp 'modules' names {path!r}, which the model does not have") from e
            if any(True for _ in block.parameters()):
                fully_shard(block, **kwargs)
        fully_shard(twin, **kwargs)
        self.adapter.wrap_twin(twin)
        self.sharded = twin
        self.shards = dict(twin.named_parameters())
        self.names = [n for n, _ in self.module.named_parameters()]
        self._fires = [0] * len(self.names)
        for k, n in enumerate(self.names):
            if self.shards[n].requires_grad:
                self.shards[n].register_post_accumulate_grad_hook(lambda _p, k=k: self._fired(k))

    def prepare(self):
        """Shards the copy now, when the model is loaded: what fully_shard refuses (a 0-dim
        parameter) is a usage error naming the model, not a failed step."""
        try:
            self._build()
        except UsageError:
            raise
        except Exception as e:
            raise UsageError(_failure("FSDP2's fully_shard cannot shard the model", e)) from e

    def _fired(self, k):
        self._fires[k] += 1

    def use(self, on):
        self.on = on
        if on and self.sharded is not None and not self._finished:
            # A step that stopped inside FSDP2's backward leaves its state mid-step: shard afresh.
            self.sharded = None
        if on and self.sharded is None:
            self._build()
        if on:
            for p in self.shards.values():
                p.grad = None

    def _load(self):
        """The user's module into the copy: its parameters as this rank's shards, its buffers and
        state attributes as they are."""
        from torch.distributed.tensor import distribute_tensor

        with torch.no_grad():
            for n, p in self.module.named_parameters():
                s = self.shards[n]
                local = distribute_tensor(p.detach(), s.device_mesh, s.placements, src_data_rank=None).to_local()
                s.to_local().copy_(local)
            self._copy_buffers(self.module, self.sharded)
        self.adapter.copy_state(self.module, self.sharded)
        self._fires = [0] * len(self.names)

    @staticmethod
    def _copy_buffers(src, dst):
        theirs = dict(dst.named_buffers())
        for n, b in src.named_buffers():
            if n in theirs and theirs[n] is not b:
                theirs[n].copy_(b)

    def __call__(self, *args, **kwargs):
        if not self.on:
            return self.module(*args, **kwargs)
        self._load()
        self._finished = False
        return self.sharded(*args, **kwargs)

    def step_done(self):
        """The copy's step into the user's module: full gradients, buffers, state attributes."""
        if not self.on or self.sharded is None:
            return
        with torch.no_grad():
            for n, p in self.module.named_parameters():
                g = self.shards[n].grad
                if g is not None and hasattr(g, "full_tensor"):
                    g = g.full_tensor()
                p.grad = None if g is None else g.to(p.dtype)
                self.shards[n].grad = None
            self._copy_buffers(self.sharded, self.module)
        self.adapter.copy_state(self.sharded, self.module)
        self._finished = True

    def hook_fires(self):
        """How often each parameter's gradient hook fired in the last backward (FSDP2 runs the
        shards' post-accumulate hooks once it reduced their gradients), in named_parameters order."""
        return list(self._fires) if self.on and self.sharded is not None else None

    def close(self):
        self.sharded = None
        self.group.close()
