"""The engine end to end on CPU: the real launcher and train.py as subprocesses, 2 ranks over gloo,
on 7 shards of uneven sizes, with the test hooks of train.py (TRAINYARD_TEST_SAMPLE_LOG) and of
user_noisy.py (dropout, noisy decode, failures on demand)."""
import collections
import os
import random
import signal
import time

import pytest
import torch

import checkpoints
from jobs import Job

# 900 samples over 2 ranks, 8 per micro-batch, 2 micro-batches per step: 28 steps per epoch
# (the last 2 samples of each rank's 450 are left out of the epoch).
RESUMABLE = dict(epochs=3, grad_accum=2, deterministic="true", checkpoint_every=10)
STEPS_PER_EPOCH, EPOCHS = 28, 3


def keys_per_epoch(steps):
    """epoch -> Counter of the sample keys trained on in it."""
    seen = collections.defaultdict(collections.Counter)
    for entry in steps:
        seen[entry["epoch"]].update(entry["keys"])
    return seen


def wait_for_step(job, step, timeout=90):
    deadline = time.monotonic() + timeout
    while not any(e["step"] >= step for e in job.steps(0)):
        assert time.monotonic() < deadline, f"no step {step}:\n{job.logs()}"
        assert all(p.poll() is None for p in job.processes), f"the job ended before step {step}:\n{job.logs()}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def interrupted(uneven_dataset, tmp_path_factory):
    """An uninterrupted run, and a run SIGKILLed (every process of the job) at a random step after
    a checkpoint and then started again; the resumed run's steps up to its checkpoint's were
    taken by the killed run."""
    data, keys = uneven_dataset
    whole = Job(tmp_path_factory.mktemp("uninterrupted"), data, **RESUMABLE).start()
    assert whole.wait(120) == [0, 0], whole.logs()

    folder = tmp_path_factory.mktemp("killed")
    kill_at = random.Random().randrange(11, STEPS_PER_EPOCH * EPOCHS - 15)
    killed = Job(folder, data, **RESUMABLE).start()
    wait_for_step(killed, kill_at)
    killed.kill(signal.SIGKILL)
    killed.wait(10)
    resumed_from = killed.latest_step()
    resumed = Job(folder, data, **RESUMABLE)
    resumed.samples = os.path.join(str(folder), "samples-resumed")
    assert resumed.start().wait(120) == [0, 0], resumed.logs()
    assert f"resuming from step {resumed_from} " in resumed.log(0), resumed.logs()
    return {"whole": whole, "killed": killed, "resumed": resumed, "from": resumed_from, "kill_at": kill_at,
            "keys": keys}


def test_a_killed_and_resumed_run_trains_on_each_sample_exactly_once_per_epoch(interrupted):
    """Steps the killed run took after its last checkpoint are lost with it and taken again by the
    resumed run: the record of the killed-and-resumed job is the killed run's steps up to the
    checkpoint the resume started from, then the resumed run's."""
    whole, killed, resumed = interrupted["whole"], interrupted["killed"], interrupted["resumed"]
    start = interrupted["from"]
    context = f"killed at step {interrupted['kill_at']}+, resumed from {start}"
    assert start >= 10, context
    for rank in (0, 1):
        redone = resumed.steps(rank)
        assert redone[0]["step"] == start + 1, context
        job = [e for e in killed.steps(rank) if e["step"] <= start] + redone
        assert [e["step"] for e in job] == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1)), context
        assert [(e["epoch"], e["keys"]) for e in job] == [(e["epoch"], e["keys"]) for e in whole.steps(rank)], context

    job_steps = [e for r in (0, 1) for e in killed.steps(r) if e["step"] <= start] + resumed.steps(0) + resumed.steps(1)
    ours, theirs = keys_per_epoch(job_steps), keys_per_epoch(whole.steps(0) + whole.steps(1))
    assert sorted(ours) == list(range(EPOCHS))
    all_keys = set(interrupted["keys"])
    for epoch in range(EPOCHS):
        assert ours[epoch] == theirs[epoch], f"epoch {epoch}, {context}"
        assert max(ours[epoch].values()) == 1, f"a sample trained on twice in epoch {epoch}, {context}"
        assert set(ours[epoch]) <= all_keys
        assert len(ours[epoch]) == 2 * STEPS_PER_EPOCH * 16, "all but the 4 dropped samples"


def test_a_resumed_run_repeats_the_uninterrupted_losses_bit_for_bit(interrupted):
    whole, killed, resumed = interrupted["whole"], interrupted["killed"], interrupted["resumed"]
    start = interrupted["from"]
    for rank in (0, 1):
        uninterrupted = {e["step"]: e["loss"] for e in whole.steps(rank)}
        before = {e["step"]: e["loss"] for e in killed.steps(rank)}
        after = {e["step"]: e["loss"] for e in resumed.steps(rank)}
        assert before == {s: uninterrupted[s] for s in before}, "runs repeat"
        assert after == {s: uninterrupted[s] for s in range(start + 1, STEPS_PER_EPOCH * EPOCHS + 1)}, \
            f"rank {rank} resumed from step {start}"
    # Ranks differ (their own seeds): a rank-0 seed used everywhere would make them more alike.
    assert whole.steps(0)[0]["loss"] != whole.steps(1)[0]["loss"]



def test_a_paused_run_resumed_later_goes_on_as_if_never_stopped(interrupted, uneven_dataset, tmp_path):
    """An experiment's rung: --stop-at-step pauses a run between checkpoints (exit 0, a checkpoint
    at the pause), the learning-rate schedule still planned for the whole run; the next run over
    the same checkpoints trains the remaining steps with the same samples and losses, bit for
    bit, as the uninterrupted run."""
    data, _ = uneven_dataset
    whole, pause = interrupted["whole"], 33
    paused = Job(tmp_path, data, stop_at_step=pause, **RESUMABLE)
    assert paused.start().wait(120) == [0, 0], paused.logs()
    assert paused.latest_step() == pause, "the pause writes its own checkpoint (checkpoint_every is 10)"
    assert paused.steps(0)[-1]["step"] == pause
    resumed = Job(tmp_path, data, **RESUMABLE)
    resumed.samples = os.path.join(str(tmp_path), "samples-resumed")
    assert resumed.start().wait(120) == [0, 0], resumed.logs()
    assert f"resuming from step {pause} " in resumed.log(0), resumed.logs()
    for rank in (0, 1):
        steps = paused.steps(rank) + resumed.steps(rank)
        assert [(e["step"], e["keys"], e["loss"]) for e in steps] == \
            [(e["step"], e["keys"], e["loss"]) for e in whole.steps(rank)], f"rank {rank}"


def test_shards_that_do_not_divide_among_ranks_finish_every_epoch_with_equal_steps(uneven_dataset, tmp_path):
    data, _ = uneven_dataset
    job = Job(tmp_path, data, epochs=2, workers=3, batch_size=16).start()
    assert job.wait(90) == [0, 0], job.logs()
    per_rank = [collections.Counter(e["epoch"] for e in job.steps(rank)) for rank in (0, 1)]
    # 450 samples per rank, 16 per step: 28 steps per epoch on both.
    assert per_rank[0] == per_rank[1] == {0: 28, 1: 28}, job.logs()
    for rank in (0, 1):
        assert "done: 56 steps" in job.log(rank)
    # Each rank's last step to its exit: no waiting in a barrier for a rank with more batches.
    last_step = max(os.path.getmtime(os.path.join(job.samples, f"rank-{r}.jsonl")) for r in (0, 1))
    assert time.time() - last_step < 10, "the processes ended within seconds of the last step"


@pytest.mark.parametrize("where, replicas, per_replica", [
    ("decode", 2, 0),   # in rank 1's decode worker, two replicas
    ("loss", 1, 2),     # in rank 1's training process, one replica of two local processes
])
def test_an_exception_in_one_rank_ends_every_process_within_seconds(uneven_dataset, tmp_path, where, replicas,
                                                                    per_replica):
    data, _ = uneven_dataset
    env = {"TEST_FAIL_IN": where, "TEST_FAIL_RANK": "1", "TEST_FAIL_AT": "100" if where == "decode" else "30"}
    job = Job(tmp_path, data, replicas=replicas, per_replica=per_replica, env=env, epochs=50, workers=2).start()
    codes = job.wait(60)
    failed_at = os.path.getmtime(os.path.join(job.samples, "rank-1.jsonl"))
    assert job.ended - job.started < 45 and time.time() - failed_at < 15, job.logs()
    assert job.processes_left() == [], "every process of the job is gone, decode workers included"
    error = "ValueError: cannot decode" if where == "decode" else "RuntimeError: test failure in loss_fn on rank 1"
    if replicas == 2:
        # The failing rank exits 1 with its error as its last words; its peer, stopped by the
        # failure, exits as if by SIGTERM, so the job's reason names the error, not the peer.
        assert codes == [143, 1], job.logs()
        assert error in job.last_line(1), job.logs()
    else:
        # The launcher kills the sibling and repeats the failed process's last words last.
        assert codes == [1], job.logs()
        assert job.last_line(0) == f"trainyard: rank 1 exited with code 1: {error}", job.logs()
    assert "Traceback" in job.logs()


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_broken_checkpoint_named_by_latest_fails_clearly_instead_of_starting_over(uneven_dataset, tmp_path, damage):
    data, _ = uneven_dataset
    first = Job(tmp_path, data, max_steps=20).start()
    assert first.wait(90) == [0, 0], first.logs()
    folder = os.path.join(first.replica_dir(0), "checkpoints")
    path = os.path.join(folder, checkpoints.checkpoint_name(20))
    if damage == "missing":
        os.remove(path)
    else:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)

    again = Job(tmp_path, data, max_steps=40)
    again.samples = os.path.join(str(tmp_path), "samples-again")
    codes = again.start().wait(60)
    assert codes == [1, 1], again.logs()
    for replica in (0, 1):
        line = again.last_line(replica)
        assert line.startswith("trainyard: cannot resume: "), again.logs()
        assert "ckpt-00000020.pt" in line and ("missing" if damage == "missing" else "cannot be loaded") in line, line
    assert again.steps(0) == [], "no step was trained from scratch"


def test_rank_0_says_how_its_steps_run_and_the_users_code_runs_so(uneven_dataset, tmp_path):
    """The `engine:` line names every decision of step_settings.py; on CPU, fp16 falls back to
    bf16 and says so, and the user's loss_fn sees bf16 outputs under autocast."""
    data, _ = uneven_dataset
    user = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_gpu.py")
    job = Job(tmp_path, data, replicas=1, user_module=user, precision="fp16", max_steps=4, checkpoint_every=4).start()
    assert job.wait(60) == [0], job.logs()
    log = job.log(0)
    assert "trainyard: fp16 needs a GPU; using bf16 on CPU" in log, log
    assert ("engine: cpu over gloo; bf16 (autocast torch.bfloat16); gradient scaler off; compile off; "
            "pinned memory off; AdamW") in log, log
    assert "user: rank 0 outputs torch.bfloat16 on cpu, autocast True" in log, log


def test_sigterm_ends_training_after_a_final_checkpoint(uneven_dataset, tmp_path):
    data, _ = uneven_dataset
    job = Job(tmp_path, data, epochs=1000, checkpoint_every=1000).start()
    wait_for_step(job, 12)
    signalled = time.monotonic()
    job.kill(signal.SIGTERM)  # to every process, as the executor does on cancel
    assert job.wait(30) == [143, 143], job.logs()
    assert job.ended - signalled < 5, "within the executor's grace period"
    assert "stopping on SIGTERM after a final checkpoint" in job.log(0)
    assert job.latest_step() >= 12
    assert job.processes_left() == []


def test_a_run_fine_tuned_from_a_checkpoint_starts_from_its_weights_at_step_0(uneven_dataset, tmp_path):
    """init_from: the weights of another run's checkpoint, with a fresh optimizer and step count
    (fine-tuning, not a resume). At lr 0 the weights never move, so the fine-tune's own checkpoint
    holds exactly the source's weights (fresh ones from build_model would differ), while its
    optimizer counted only its own steps; a restarted attempt resumes its own checkpoint."""
    data, _ = uneven_dataset
    source = Job(tmp_path / "source", data, max_steps=20).start()
    assert source.wait(120) == [0, 0], source.logs()
    weights = os.path.join(source.replica_dir(0), "checkpoints", checkpoints.checkpoint_name(20))

    tune = Job(tmp_path / "tune", data, max_steps=10, lr=0.0, init_from=weights).start()
    assert tune.wait(120) == [0, 0], tune.logs()
    assert f"fine-tuning from {weights} (the model weights of its step 20)" in tune.log(0), tune.logs()
    assert [e["step"] for e in tune.steps(0)] == list(range(1, 11)), "it counts its steps from 0"
    assert tune.steps(0)[0]["epoch"] == 0
    assert tune.latest_step() == 10
    saved = checkpoints.checkpoint_load(os.path.join(tune.replica_dir(0), "checkpoints", checkpoints.checkpoint_name(10)))
    original = checkpoints.checkpoint_load(weights)
    assert saved["model"].keys() == original["model"].keys()
    for name, tensor in original["model"].items():
        assert torch.equal(saved["model"][name], tensor), f"{name}: not the source's weights"
    steps_counted = {float(s["step"]) for s in saved["optimizer"]["state"].values()}
    assert steps_counted == {10.0}, f"a fresh optimizer counts its own 10 steps, not the source's 20: {steps_counted}"

    again = Job(tmp_path / "tune", data, max_steps=10, lr=0.0, init_from=weights)
    again.samples = os.path.join(str(tmp_path / "tune"), "samples-again")
    assert again.start().wait(120) == [0, 0], again.logs()
    # The log goes on from the first attempt's: one fine-tuning line, then the resume.
    assert "resuming from step 10 " in again.log(0) and again.log(0).count("fine-tuning from") == 1, again.logs()


def test_a_missing_checkpoint_to_fine_tune_from_fails_clearly(uneven_dataset, tmp_path):
    data, _ = uneven_dataset
    missing = str(tmp_path / "gone" / checkpoints.checkpoint_name(40))
    job = Job(tmp_path / "job", data, max_steps=5, init_from=missing).start()
    codes = job.wait(60)
    assert codes[0] != 0, job.logs()
    assert job.last_line(0) == f"trainyard: cannot fine-tune from {missing}: it is missing (deleted by " \
                               f"keep_checkpoints since the run was submitted?)", job.logs()
