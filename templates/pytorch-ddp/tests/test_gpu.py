"""The engine on a CUDA GPU: every decision it takes there (step_settings.py and placement.py),
as a job would run it (the real launcher and train.py as subprocesses, on one GPU) and in this
process where that shows more. All are marked `gpu`: skipped, with the reason, without one;
tests/gpu/run runs them on one. test_step_settings.py checks the same rules without a GPU.

One GPU shows NCCL with one rank only: two NCCL ranks need two devices (NCCL refuses two ranks on
one GPU, "Duplicate GPU detected"), so several processes on one GPU go over gloo instead
(placement.device_and_backend), which `test_two_processes_share_one_gpu_over_gloo` runs: DDP's
gradient all-reduce on CUDA tensors is shown there (a job of one process skips it, having
nothing to average), NCCL's with several GPUs only.
"""
import math
import os
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import checkpoints
import example
import seeds
import shards
import step_settings
import train
from fake_trainyard import FakeTrainyard
from jobs import Job, free_port

pytestmark = pytest.mark.gpu

USER_GPU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_gpu.py")
# A job on this machine's first GPU (the one the process sees first when CUDA_VISIBLE_DEVICES
# names several): jobs.Job hides GPUs by default.
FIRST_GPU = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
ONE_GPU = {"CUDA_VISIBLE_DEVICES": FIRST_GPU}
STEPS = 20


def gpu_job(folder, data, env=None, **options):
    """One replica of one training process on the first GPU, with user_gpu.py; `options` are
    train.py's."""
    settings = dict(replicas=1, per_replica=1, user_module=USER_GPU, max_steps=STEPS, epochs=10, workers=2,
                    prefetch=2, precision="bf16")
    settings.update(options)
    return Job(folder, data, env=dict(ONE_GPU, **(env or {})), **settings)


def checkpoint(job, step):
    return checkpoints.checkpoint_load(os.path.join(job.replica_dir(0), "checkpoints", checkpoints.checkpoint_name(step)))


@pytest.fixture(scope="module")
def bf16_run(uneven_dataset, tmp_path_factory):
    """A bf16 run on one GPU, eager, reporting to a stand-in Trainyard."""
    data, _ = uneven_dataset
    trainyard = FakeTrainyard()
    try:
        job = gpu_job(tmp_path_factory.mktemp("gpu-bf16"), data, env=trainyard.env(), checkpoint_every=STEPS)
        codes = job.start().wait(90)
    finally:
        trainyard.close()
    assert codes == [0], job.logs()
    return job, trainyard


def test_one_gpu_trains_over_nccl_with_bf16_autocast_pinned_batches_and_no_scaler(bf16_run):
    job, _ = bf16_run
    log = job.log(0)
    assert ("engine: cuda:0 over nccl; bf16 (autocast torch.bfloat16); gradient scaler off; compile off; "
            "pinned memory on; fused AdamW") in log, log
    assert "user: rank 0 outputs torch.bfloat16 on cuda:0, autocast True" in log, log
    assert "user: rank 0 compiled graphs: 0" in log, log
    assert f"done: {STEPS} steps" in log
    losses = [e["loss"] for e in job.steps(0)]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    saved = checkpoint(job, STEPS)
    assert saved["scaler"] == {}, "no gradient scaler with bf16"
    assert saved["ranks"][0]["rng"]["cuda"].dtype == torch.uint8, "the CUDA generator's state is saved"


def test_the_run_record_names_the_gpu_its_driver_and_cuda(bf16_run):
    _, trainyard = bf16_run
    assert len(trainyard.records) == 1
    hardware = trainyard.records[0]["hardware"]
    assert (hardware["backend"], hardware["device_type"], hardware["world_size"]) == ("nccl", "cuda", 1)
    assert hardware["gpus"] and hardware["gpus"][0]["name"] and hardware["gpus"][0]["memory_bytes"] > 0
    assert hardware["driver"] and hardware["cuda"] and hardware["nccl"], hardware
    utilization = trainyard.series("gpu_utilization")
    assert utilization and all(0.0 <= value <= 1.0 for _, value in utilization)


@pytest.fixture(scope="module")
def fp16_interrupted(uneven_dataset, tmp_path_factory):
    """fp16 in deterministic mode on one GPU: an uninterrupted run of 30 steps, and a run killed
    (SIGKILL, its whole process group, no final checkpoint) in step 25 then resumed from its
    checkpoint of step 20."""
    data, _ = uneven_dataset
    options = dict(precision="fp16", deterministic="true", max_steps=30, checkpoint_every=10, keep_checkpoints=0)
    whole = gpu_job(tmp_path_factory.mktemp("gpu-fp16-whole"), data, **options).start()
    assert whole.wait(90) == [0], whole.logs()
    folder = tmp_path_factory.mktemp("gpu-fp16-killed")
    killed = gpu_job(folder, data, env={"TEST_KILL_AT": "25"}, **options).start()
    assert killed.wait(90) == [-9], killed.logs()
    resumed = gpu_job(folder, data, **options)
    resumed.samples = os.path.join(str(folder), "samples-resumed")
    assert resumed.start().wait(90) == [0], resumed.logs()
    assert "resuming from step 20 " in resumed.log(0), resumed.logs()
    return whole, killed, resumed


def test_fp16_runs_with_the_gradient_scaler_and_a_resume_continues_its_state(fp16_interrupted):
    whole, _, resumed = fp16_interrupted
    assert "fp16 (autocast torch.float16); gradient scaler on" in whole.log(0), whole.log(0)
    assert "user: rank 0 outputs torch.float16 on cuda:0, autocast True" in whole.log(0)
    expected, got = checkpoint(whole, 30)["scaler"], checkpoint(resumed, 30)["scaler"]
    assert {"scale", "_growth_tracker"} <= set(expected), expected
    # Not restored, the resumed scaler would count its growth interval from step 20 afresh.
    assert got == expected


def test_a_killed_and_resumed_run_on_a_gpu_repeats_the_losses_bit_for_bit(fp16_interrupted):
    """Dropout draws from the CUDA generator: restored wrongly, the resumed losses would differ."""
    whole, killed, resumed = fp16_interrupted
    uninterrupted = {e["step"]: e["loss"] for e in whole.steps(0)}
    before = {e["step"]: e["loss"] for e in killed.steps(0)}
    after = {e["step"]: e["loss"] for e in resumed.steps(0)}
    assert sorted(before) == list(range(1, 25)), "killed in step 25"
    assert before == {s: uninterrupted[s] for s in before}, "deterministic runs repeat"
    assert after == {s: uninterrupted[s] for s in range(21, 31)}
    assert torch.equal(checkpoint(killed, 20)["ranks"][0]["rng"]["cuda"],
                       checkpoint(whole, 20)["ranks"][0]["rng"]["cuda"])


def test_compile_on_a_gpu_makes_graphs_and_trains(uneven_dataset, tmp_path):
    data, _ = uneven_dataset
    job = gpu_job(tmp_path, data, compile="true", max_steps=12, checkpoint_every=100).start()
    assert job.wait(150) == [0], job.logs()
    log = job.log(0)
    assert "; compile on;" in log, log
    line = next(line for line in log.splitlines() if "compiled graphs:" in line)
    graphs = line.rsplit(":", 1)[1].strip()
    assert graphs.isdigit() and int(graphs) > 0, line
    assert all(math.isfinite(e["loss"]) for e in job.steps(0))


def test_two_processes_share_one_gpu_over_gloo(uneven_dataset, tmp_path):
    """Two training processes of one replica and one visible GPU: NCCL would refuse them, so
    both train on cuda:0 and talk over gloo (placement.device_and_backend)."""
    data, _ = uneven_dataset
    job = gpu_job(tmp_path, data, per_replica=2, max_steps=10, checkpoint_every=10).start()
    assert job.wait(90) == [0], job.logs()
    log = job.log(0)
    assert "engine: cuda:0 over gloo; bf16" in log, log
    for rank in (0, 1):
        assert f"user: rank {rank} outputs torch.bfloat16 on cuda:0" in log, log
        assert len(job.steps(rank)) == 10


@pytest.fixture(scope="module")
def nccl_group():
    """This process as the single rank of an NCCL group on its first GPU."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=device)
    yield device
    dist.destroy_process_group()


def test_nccl_initialises_with_the_one_rank_one_gpu_allows(nccl_group):
    """World size 1 is all one GPU can show of NCCL: two ranks need two devices."""
    assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    values = torch.arange(3.0, device=nccl_group)
    dist.all_reduce(values)
    assert values.tolist() == [0.0, 1.0, 2.0]


def test_votes_on_a_gpu_wait_for_the_step_before_not_for_the_work_queued_since(nccl_group):
    votes = train.StepVotes(nccl_group, 2)
    work = torch.randn(4096, 4096, device=nccl_group)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        votes.cast(True, False)  # raises on any implicit wait for the GPU
        with pytest.raises(RuntimeError):
            torch.ones(2, device=nccl_group).tolist()  # what reading the sums at once would do
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for _ in range(100):  # a quarter of a second of fp32 matrix products: the next step's work
        work = work @ work / 64
    began = time.monotonic()
    sums = votes.collect()
    waited = time.monotonic() - began
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert sums == (1.0, 0.0)
    assert still_busy and waited < 0.1, f"read the votes after {waited:.3f} s; the GPU was busy: {still_busy}"


def test_a_loader_for_a_gpu_pins_its_batches_also_after_autotune_resizes_it(uneven_dataset):
    data, _ = uneven_dataset
    dataset = shards.ShardDataset(data, example.decode, 0, 1, 0, 8)
    stream = shards.BatchStream(dataset, 1, 2, pin_memory=True, seed=0)
    try:
        stream.start(0, 0, 6)
        (inputs, targets), _ = next(stream)
        assert inputs.is_pinned() and targets.is_pinned()
        stream.resize(2, 2)
        (inputs, targets), _ = next(stream)
        assert inputs.is_pinned() and targets.is_pinned()
        assert inputs.to("cuda", non_blocking=True).device.type == "cuda"
    finally:
        stream.stop()


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_on_a_gpu_computes_in_the_dtype_the_settings_name(precision, dtype):
    settings = step_settings.step_settings(precision, False, "cuda", bf16_supported=train.native_bf16(torch.device("cuda", 0)))
    assert settings.autocast_dtype == dtype, settings.notes
    layer = nn.Linear(8, 4).cuda()
    with torch.autocast("cuda", dtype=settings.autocast_dtype):
        out = layer(torch.randn(2, 8, device="cuda"))
        loss = nn.functional.cross_entropy(out, torch.tensor([0, 1], device="cuda"))
    assert out.dtype == dtype and loss.dtype == torch.float32


def test_the_gradient_scaler_skips_an_overflowing_step_of_the_fused_optimizer_and_its_state_survives_a_checkpoint(
        tmp_path):
    settings = step_settings.step_settings("fp16", False, "cuda")
    net = nn.Linear(4, 4).cuda()
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1, **step_settings.optimizer_options(settings))
    # A start small enough that no ordinary step of this layer overflows fp16.
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=settings.grad_scaler)

    def step(overflow=False):
        with torch.autocast("cuda", dtype=settings.autocast_dtype):
            loss = net(torch.randn(8, 4, device="cuda")).float().pow(2).mean()
        if overflow:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    before = net.weight.detach().clone()
    step(overflow=True)
    assert torch.equal(net.weight, before), "an overflowing step is skipped"
    step()
    state = scaler.state_dict()
    assert state["scale"] == 512.0 and state["_growth_tracker"] == 1, state  # halved, then one good step
    checkpoints.checkpoint_save(str(tmp_path), {"scaler": state}, 5, keep=0)
    again = torch.amp.GradScaler("cuda")
    again.load_state_dict(checkpoints.checkpoint_latest(str(tmp_path))["scaler"])
    assert again.state_dict() == state and again.get_scale() == 512.0


def test_the_cuda_generator_comes_back_from_a_checkpoint_file(tmp_path):
    device = torch.device("cuda", 0)
    seeds.seed_everything(5)
    nn.functional.dropout(torch.ones(100, device=device), 0.5)
    checkpoints.checkpoint_save(str(tmp_path), {"rng": seeds.rng_state(device)}, 1, keep=0)
    expected = nn.functional.dropout(torch.ones(100, device=device), 0.5).tolist()
    seeds.seed_everything(99)
    seeds.rng_restore(checkpoints.checkpoint_latest(str(tmp_path))["rng"], device)
    assert nn.functional.dropout(torch.ones(100, device=device), 0.5).tolist() == expected
