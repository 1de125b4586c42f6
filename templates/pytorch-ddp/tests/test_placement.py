"""Which device, backend and environment each training process gets: a table over CPU and CUDA,
1, 2 and 8 GPUs per replica, the local executor (CUDA_VISIBLE_DEVICES names the replica's GPUs)
and Kubernetes (it is unset; the pod sees only its GPUs), written from torch's documented rules:
torchrun gives each process LOCAL_RANK and DDP's documented setup is one GPU per process,
`cuda:<LOCAL_RANK>`; NCCL reduces CUDA tensors only, gloo CPU and CUDA ones."""
import pytest
import torch.distributed as dist

import placement
import train

UNSET = None


def processes(gpus, replica, replicas, visible, cuda_devices):
    """What each local process of a replica gets: launch.py's per_replica is max(1, gpus); each
    process sees `cuda_devices` devices (torch.cuda.device_count())."""
    env = {} if visible is UNSET else {"CUDA_VISIBLE_DEVICES": visible}
    rows = []
    for local in range(max(1, gpus)):
        mine = placement.process_env(env, replica, replicas, max(1, gpus), local)
        local, local_world = int(mine["LOCAL_RANK"]), int(mine["LOCAL_WORLD_SIZE"])
        device, backend = placement.device_and_backend(local, local_world, cuda_devices)
        rows.append((int(mine["RANK"]), int(mine["WORLD_SIZE"]), device, backend,
                     placement.collective_device(backend, device), mine.get("CUDA_VISIBLE_DEVICES")))
    return rows


@pytest.mark.parametrize("case, gpus, replica, replicas, visible, cuda_devices, expected", [
    ("CPU replica (gpus=0) on the local executor", 0, 1, 2, "", 0,
     [(1, 2, "cpu", "gloo", "cpu", "")]),
    ("1 GPU per replica, local executor gave GPU 5", 1, 1, 2, "5", 1,
     [(1, 2, "cuda:0", "nccl", "cuda:0", "5")]),
    ("2 GPUs per replica, local executor gave GPUs 2,3", 2, 1, 2, "2,3", 2,
     [(2, 4, "cuda:0", "nccl", "cuda:0", "2,3"),
      (3, 4, "cuda:1", "nccl", "cuda:1", "2,3")]),
    ("8 GPUs per replica, local executor", 8, 0, 1, "0,1,2,3,4,5,6,7", 8,
     [(r, 8, f"cuda:{r}", "nccl", f"cuda:{r}", "0,1,2,3,4,5,6,7") for r in range(8)]),
    ("8 GPUs per replica on Kubernetes (the pod sees its 8)", 8, 1, 2, UNSET, 8,
     [(8 + r, 16, f"cuda:{r}", "nccl", f"cuda:{r}", UNSET) for r in range(8)]),
    ("2 simulated GPUs (indices that name no device): CPU processes", 2, 0, 2, "0,1", 0,
     [(0, 4, "cpu", "gloo", "cpu", "0,1"), (1, 4, "cpu", "gloo", "cpu", "0,1")]),
    ("2 processes sharing 1 GPU: NCCL refuses a duplicate GPU, so gloo", 2, 0, 1, "0", 1,
     [(0, 2, "cuda:0", "gloo", "cpu", "0"), (1, 2, "cuda:0", "gloo", "cpu", "0")]),
    ("8 processes over 2 GPUs", 8, 0, 1, "0,1", 2,
     [(r, 8, f"cuda:{r % 2}", "gloo", "cpu", "0,1") for r in range(8)]),
])
def test_each_process_gets_a_valid_device_backend_and_visible_devices(case, gpus, replica, replicas, visible,
                                                                      cuda_devices, expected):
    rows = processes(gpus, replica, replicas, visible, cuda_devices)
    assert rows == expected, case
    for _, _, device, _, _, _ in rows:
        if device.startswith("cuda:"):
            assert int(device.split(":")[1]) < cuda_devices, f"{case}: {device} is a valid ordinal"


def test_nccl_collectives_use_the_process_gpu_and_gloo_the_cpu():
    assert placement.collective_device("nccl", "cuda:3") == "cuda:3"
    assert placement.collective_device("gloo", "cpu") == "cpu"
    assert placement.collective_device("gloo", "cuda:1") == "cpu"
    with pytest.raises(ValueError, match="NCCL reduces CUDA tensors only"):
        placement.collective_device("nccl", "cpu")


def test_the_backend_device_rules_are_torchs():
    capability = dist.Backend.backend_capability
    for backend, devices in placement.BACKEND_DEVICES.items():
        assert sorted(devices) == sorted(capability[backend]), backend
    assert dist.Backend.default_device_backend_map["cuda"] == "nccl"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"


def test_process_env_keeps_the_rest_of_the_environment():
    env = placement.process_env({"PATH": "/bin", "RANK": "1", "LOCAL_RANK": "1"}, 1, 2, 2, 0)
    assert env["PATH"] == "/bin" and env["LOCAL_RANK"] == "0" and env["RANK"] == "2"


@pytest.mark.parametrize("codes, expected", [
    ([0, 0], 0),
    ([1, 137], 1),          # a sibling killed after the failure
    ([143, 1], 1),          # a peer stopped by the failure exited first
    ([137], 137),           # killed (out of memory): reported as such
    ([143, 143], 143),      # a requested stop
    ([2, 1], 2),            # the first failure of the program's own
])
def test_a_replica_reports_the_failure_that_caused_the_others(codes, expected):
    assert placement.replica_exit_code(codes) == expected


def test_a_child_killed_by_a_signal_exits_as_shells_report():
    assert placement.exit_code(-9) == 137
    assert placement.exit_code(3) == 3


def test_failures_caused_by_a_peer_are_told_apart():
    assert train.caused_by_a_peer(RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:33671"))
    assert not train.caused_by_a_peer(RuntimeError("CUDA out of memory"))
    assert not train.caused_by_a_peer(ValueError("cannot decode img00001"))


def test_gpu_utilization_is_reported_for_a_cuda_device_only(monkeypatch):
    import torch
    assert train.gpu_utilization(torch.device("cpu")) == {}
    # As NVML reports it through torch (percent), as a share; a refusal reports nothing.
    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: 75)
    assert train.gpu_utilization(torch.device("cuda", 0)) == {"gpu_utilization": 0.75}

    def refuse(device=None):
        raise RuntimeError("pynvml does not seem to be installed")
    monkeypatch.setattr(torch.cuda, "utilization", refuse)
    assert train.gpu_utilization(torch.device("cuda", 0)) == {}
