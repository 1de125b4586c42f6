"""Where each training process runs and how the processes talk: the ranks and environment the
launcher gives each local process, the device and collective backend a process uses, the device
its collective tensors must live on, and the exit code a replica reports. Pure functions (no torch
import, so the launcher starts fast); the rules follow torchrun and torch.distributed as
documented in torch 2.15.
"""
import signal

# torch.distributed.Backend.backend_capability (distributed_c10d.py): the devices whose tensors
# each backend can reduce. NCCL has no CPU implementation: a CPU tensor in an NCCL collective
# fails with "No backend type associated with device type cpu".
BACKEND_DEVICES = {"nccl": ("cuda",), "gloo": ("cpu", "cuda")}

# A process that stopped because another process of the job failed (a collective raised when its
# peer went away) exits as if stopped by SIGTERM, the way the rest of a gang is stopped. Trainyard
# names the failure after the program's own exit codes (below 128) first, so the job's reason is
# the error that caused the failure, not the peers' "connection closed".
EXIT_STOPPED_BY_PEER = 128 + signal.SIGTERM


def process_env(env, replica, replicas, per_replica, local):
    """The environment of local process `local` of replica `replica` (of `replicas`, each running
    `per_replica` processes), torchrun style: RANK = replica * per_replica + local, WORLD_SIZE =
    replicas * per_replica, LOCAL_RANK = local, LOCAL_WORLD_SIZE = per_replica.

    CUDA_VISIBLE_DEVICES stays the replica's list (Trainyard's local executor gives each replica
    its GPUs; on Kubernetes the device plugin does and it is unset): every process sees all of
    them and takes the one at ordinal LOCAL_RANK (see `device_and_backend`), as under torchrun.
    Narrowing it to one device per process would make `cuda:{LOCAL_RANK}` an invalid ordinal and
    would hide the peers' GPUs from NCCL, which needs them visible for peer-to-peer transfers."""
    out = dict(env)
    out.update(RANK=str(replica * per_replica + local), WORLD_SIZE=str(replicas * per_replica),
               LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(per_replica))
    return out


def device_and_backend(local_rank, local_world_size, cuda_devices):
    """The device (as torch spells it) and the process group backend of the process with
    `local_rank` of `local_world_size` on a replica, when `cuda_devices` CUDA devices are visible
    to it (torch.cuda.device_count(): 0 without a GPU, and with Trainyard's simulated GPUs).

    - No CUDA device: "cpu" and gloo.
    - A device for every local process: "cuda:<local_rank>" and NCCL (DDP's documented setup:
      one GPU per process, device_ids=[local_rank]).
    - Fewer devices than processes: processes share them round-robin, over gloo, because NCCL
      refuses two ranks on one GPU ("Duplicate GPU detected")."""
    if cuda_devices <= 0:
        return "cpu", "gloo"
    if local_world_size <= cuda_devices:
        return f"cuda:{local_rank}", "nccl"
    return f"cuda:{local_rank % cuda_devices}", "gloo"


def collective_device(backend, device):
    """The device of tensors this process passes to collectives it issues itself (the stop flag,
    object broadcasts): the process's own GPU for NCCL, the CPU for gloo (it accepts CUDA tensors
    too, but small flags are cheapest on the CPU)."""
    kind = device.split(":")[0]
    if backend == "nccl":
        if kind not in BACKEND_DEVICES["nccl"]:
            raise ValueError(f"NCCL reduces CUDA tensors only; this process runs on {device}")
        return device
    if backend == "gloo":
        return "cpu"
    raise ValueError(f"unknown backend {backend!r}")


def exit_code(returncode):
    """A child's return code as a shell reports it: killed by signal N (-N) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def replica_exit_code(codes_in_exit_order):
    """The exit code a replica reports for its processes' exit codes (in the order they exited):
    0 when all succeeded, else the first failure of a process's own (1-127: an error, a failed
    import) before the first signal-like one (128 and above: stopped, killed, or stopped because
    a peer failed), so the code and the log point at the cause."""
    failures = [c for c in codes_in_exit_order if c != 0]
    own = [c for c in failures if c < 128]
    return (own or failures or [0])[0]
