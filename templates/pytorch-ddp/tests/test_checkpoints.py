"""Checkpoint files: durable writes, pruning by step beyond 10^8 steps, loading onto the CPU, and
a clear error when `latest.json` names a checkpoint that cannot be loaded."""
import json
import os

import pytest
import torch

import checkpoints
import seeds
import train


def test_names_carry_the_step_and_parse_back_beyond_10_to_the_8():
    assert checkpoints.checkpoint_name(280) == "ckpt-00000280.pt"
    for step in (0, 280, 99_999_999, 100_000_000, 12_345_678_901):
        assert checkpoints.checkpoint_step(checkpoints.checkpoint_name(step)) == step
    assert checkpoints.checkpoint_step("ckpt-00000280.pt.partial") is None
    assert checkpoints.checkpoint_step("latest.json") is None


def test_pruning_keeps_the_newest_by_step_not_by_name():
    names = ["ckpt-99999998.pt", "latest.json", "ckpt-100000000.pt", "ckpt-99999999.pt", "ckpt-100000001.pt.partial"]
    # By name, "ckpt-100000000.pt" sorts first and would be deleted as the oldest.
    assert checkpoints.checkpoints_to_prune(names, 2) == ["ckpt-99999998.pt"]
    assert checkpoints.checkpoints_to_prune(names, 0) == []
    assert checkpoints.checkpoints_to_prune(names, 5) == []


def test_a_save_is_fsynced_file_and_folder_then_named_by_latest(tmp_path, monkeypatch):
    synced, fsync = [], os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    folder = str(tmp_path / "out")
    for step in (10, 20, 30, 40):
        checkpoints.checkpoint_save(folder, {"step": step}, step, keep=3)
    assert sorted(os.listdir(folder)) == ["ckpt-00000020.pt", "ckpt-00000030.pt", "ckpt-00000040.pt", "latest.json"]
    assert json.load(open(os.path.join(folder, "latest.json"))) == {"checkpoint": "ckpt-00000040.pt", "step": 40}
    assert folder in synced, "the folder is fsynced, so the renames survive a power loss"
    assert os.path.join(folder, "ckpt-00000040.pt.partial") in synced
    last = {path: i for i, path in enumerate(synced)}
    assert last[os.path.join(folder, "ckpt-00000040.pt.partial")] < last[os.path.join(folder, "latest.json.partial")], \
        "the checkpoint is durable before latest.json names it"


def test_a_partial_file_left_by_a_killed_writer_is_cleaned_up(tmp_path):
    folder = str(tmp_path)
    open(os.path.join(folder, "ckpt-00000050.pt.partial"), "wb").close()
    checkpoints.checkpoint_save(folder, {}, 40, keep=3)
    assert sorted(os.listdir(folder)) == ["ckpt-00000040.pt", "latest.json"]


def test_no_latest_is_a_first_start(tmp_path):
    assert checkpoints.checkpoint_latest(str(tmp_path)) is None
    assert checkpoints.checkpoint_latest(str(tmp_path / "absent")) is None


def test_the_latest_checkpoint_loads_onto_the_cpu(tmp_path, monkeypatch):
    checkpoints.checkpoint_save(str(tmp_path), {"w": torch.ones(2)}, 7, keep=0)
    calls, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k) or load(*a, **k))
    state = checkpoints.checkpoint_latest(str(tmp_path))
    assert torch.equal(state["w"], torch.ones(2))
    assert calls[0]["map_location"] == "cpu", "not onto the device each tensor was saved from (cuda:0 for every rank)"
    assert calls[0]["weights_only"] is True, "tensors and plain values only: unpickling runs no code"


class RunsCode:
    """What a crafted file pickles to run code as it loads (here only os.getpid)."""

    def __reduce__(self):
        return (os.getpid, ())


def test_a_checkpoint_that_would_run_code_as_it_loads_is_refused(tmp_path):
    checkpoints.checkpoint_save(str(tmp_path), {"w": torch.ones(2), "payload": RunsCode()}, 5, keep=0)
    with pytest.raises(checkpoints.CheckpointError, match="cannot be loaded: UnpicklingError"):
        checkpoints.checkpoint_latest(str(tmp_path))


def test_what_the_engine_saves_loads_with_weights_only(tmp_path):
    """Every kind of value a checkpoint holds: tensors, an optimizer's and a scheduler's state,
    the generator states (Python's tuples, NumPy's as a list), per-rank dicts."""
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.1)
    net(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "scaler": {}, "step": 3, "epoch": 0,
             "ranks": [{"rng": seeds.rng_state(torch.device("cpu")), "data": {"epoch": 0, "cursor": 8, "order": {}}}]}
    checkpoints.checkpoint_save(str(tmp_path), state, 3, keep=0)
    path = os.path.join(str(tmp_path), checkpoints.checkpoint_name(3))
    unsafe = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if unsafe is not None:
        assert unsafe(path) == [], "nothing beyond what weights_only allows by itself"
    loaded = checkpoints.checkpoint_latest(str(tmp_path))
    assert isinstance(loaded["ranks"][0]["rng"]["numpy"][1], list)
    assert torch.equal(loaded["model"]["weight"], net.state_dict()["weight"])


def test_a_checkpoint_of_an_engine_before_1_8_with_numpys_state_as_an_array_still_resumes(tmp_path):
    numpy = pytest.importorskip("numpy")
    numpy.random.seed(7)
    legacy = {"python": seeds.random.getstate(), "torch": torch.get_rng_state(), "numpy": numpy.random.get_state()}
    expected = numpy.random.random()
    checkpoints.checkpoint_save(str(tmp_path), {"ranks": [{"rng": legacy}]}, 9, keep=0)
    loaded = checkpoints.checkpoint_latest(str(tmp_path))
    numpy.random.seed(0)
    seeds.rng_restore(loaded["ranks"][0]["rng"], torch.device("cpu"))
    assert numpy.random.random() == expected


@pytest.mark.parametrize("damage, message", [
    ("missing", "which is missing"),
    ("truncated", "cannot be loaded"),
    ("latest-garbage", "is unreadable"),
    ("latest-not-a-checkpoint", "is unreadable"),
])
def test_a_broken_checkpoint_named_by_latest_is_an_error(tmp_path, damage, message):
    folder = str(tmp_path)
    checkpoints.checkpoint_save(folder, {"w": torch.ones(1000)}, 20, keep=0)
    path, latest = os.path.join(folder, "ckpt-00000020.pt"), os.path.join(folder, "latest.json")
    if damage == "missing":
        os.remove(path)
    elif damage == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
    elif damage == "latest-garbage":
        open(latest, "w").write("{\"checkpoint\": ")
    else:
        open(latest, "w").write(json.dumps({"checkpoint": "../../etc/passwd"}))
    with pytest.raises(checkpoints.CheckpointError, match=message) as error:
        checkpoints.checkpoint_latest(folder)
    assert "\n" not in str(error.value), "one line: the job's reason is the log's last line"


def test_a_position_at_the_end_of_an_epoch_is_the_start_of_the_next():
    assert train.position_after(2, 448, 448) == (3, 0)
    assert train.position_after(2, 160, 448) == (2, 160)


def test_a_rank_resumes_its_own_position_only_for_the_same_order():
    order = {"seed": 0, "rank": 1, "world_size": 2, "batch_size": 8}
    saved = [{"data": {"order": dict(order, rank=0), "epoch": 1, "cursor": 16}},
             {"data": {"order": order, "epoch": 1, "cursor": 16}}]
    assert train.saved_rank_state(saved, 1, 2, order) is saved[1]
    assert train.saved_rank_state(saved, 1, 2, dict(order, batch_size=16)) is None
    assert train.saved_rank_state(saved, 1, 4, order) is None, "another world size"
    assert train.saved_rank_state(None, 1, 2, order) is None, "a checkpoint from before engine 1.2"


def test_checkpoints_go_to_the_jobs_folder_in_the_volume_when_one_is_given():
    assert checkpoints.checkpoint_dir("checkpoints", "", "j1") == "checkpoints"
    assert checkpoints.checkpoint_dir("checkpoints", "/volumes/checkpoints", "j1") == \
        "/volumes/checkpoints/jobs/j1/checkpoints"
    assert checkpoints.checkpoint_dir("/mnt/elsewhere", "/volumes/checkpoints", "j1") == "/mnt/elsewhere"
    with pytest.raises(checkpoints.CheckpointError, match="TRAINYARD_JOB_ID"):
        checkpoints.checkpoint_dir("checkpoints", "/volumes/checkpoints", None)


def test_each_saved_checkpoint_is_reported_with_its_step(uneven_dataset, tmp_path):
    """After each checkpoint rank 0 reports `checkpoint_step` (its value the step saved): the
    scheduler stops, of jobs on spare room, the one that saved last, which loses least."""
    import os
    import signal
    import time

    from fake_trainyard import FakeTrainyard
    from jobs import Job

    data, _ = uneven_dataset
    trainyard = FakeTrainyard()
    try:
        job = Job(tmp_path, data, replicas=2, env=trainyard.env(), epochs=1000, max_steps=1000, log_every=5,
                  checkpoint_every=10).start()
        def saved():
            try:
                return job.latest_step()
            except FileNotFoundError:
                return 0

        deadline = time.monotonic() + 90
        while saved() < 20:
            assert time.monotonic() < deadline and all(p.poll() is None for p in job.processes), job.logs()
            time.sleep(0.05)
        job.kill(signal.SIGTERM)
        assert job.wait(30) == [143, 143], job.logs()
    finally:
        trainyard.close()
    saved = trainyard.series("checkpoint_step")
    steps = [step for step, _ in saved]
    assert [value for _, value in saved] == steps, "the value is the step saved"
    assert steps[:2] == [10, 20], saved
    # The final checkpoint on SIGTERM is reported too, once, by rank 0 alone.
    assert steps[-1] == job.latest_step() and len(steps) == len(set(steps)), saved
    assert os.path.exists(os.path.join(job.replica_dir(0), "checkpoints", "latest.json"))
