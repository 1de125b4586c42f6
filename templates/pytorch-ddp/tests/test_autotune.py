"""Input pipeline autotune: the controller's rule (autotune.Tuner, pure), the windows it is fed,
the limits it keeps within, and the engine tuning a pipeline made slow on purpose end to end."""
import os
import random
import statistics

import pytest

import autotune
import shards
import train
from autotune import Counters, Limits, Setting, Tuner, Window
from fake_trainyard import FakeTrainyard
from jobs import Job

ROOMY = Limits(max_workers=8, max_inflight=64)


def stalled(stall, rate, cpu=0.5):
    return Window(stall_share=stall, batches_per_second=rate, cpu_share=cpu)


def test_workers_rise_while_the_stall_is_high_and_each_raise_helps_then_it_settles():
    tuner = Tuner(Setting(1, 2), ROOMY)
    # Stall 90%: ten times the workers would end it; a raise at most doubles.
    first = tuner.observe(stalled(0.9, 10))
    assert first.setting == Setting(2, 2) and not first.settled
    second = tuner.observe(stalled(0.8, 19))
    assert second.setting == Setting(4, 2) and not second.settled
    done = tuner.observe(stalled(0.02, 36))
    assert done.setting == Setting(4, 2) and done.settled
    assert "stall 2%" in done.reason
    assert tuner.observe(stalled(0.1, 36)) == (Setting(4, 2), True, "settled"), "below the stall that reopens"


def test_settled_on_a_low_stall_it_tunes_again_when_the_stall_comes_back_but_not_after_raises_failed():
    tuner = Tuner(Setting(2, 2), ROOMY)
    assert tuner.observe(stalled(0.01, 20)).settled
    # Training got faster (or the data heavier): the stall is back, the knobs open again.
    again = tuner.observe(stalled(0.4, 30))
    assert again.setting == Setting(4, 2) and not again.settled and "tuning again" in again.reason
    assert tuner.observe(stalled(0.4, 30.3)).setting == Setting(2, 4)
    assert tuner.observe(stalled(0.4, 29)).settled, "raises stopped helping"
    assert tuner.observe(stalled(0.9, 29)) == (Setting(2, 2), True, "settled"), "no more rounds of trials"


def test_a_raise_aims_at_the_workers_that_would_end_the_stall():
    # w / (1 - stall) workers, at least one more, at most twice as many.
    assert Tuner(Setting(2, 2), ROOMY).observe(stalled(0.2, 10)).setting.workers == 3  # 2 / 0.8 = 2.5
    assert Tuner(Setting(3, 2), ROOMY).observe(stalled(0.5, 10)).setting.workers == 6
    assert Tuner(Setting(3, 2), ROOMY).observe(stalled(0.1, 10)).setting.workers == 4  # +1 at least
    assert Tuner(Setting(1, 2), ROOMY).observe(stalled(1.0, 0)).setting.workers == 2


def test_a_raise_that_does_not_help_is_undone_and_prefetch_is_tried_next():
    tuner = Tuner(Setting(2, 2), ROOMY)
    assert tuner.observe(stalled(0.5, 20)).setting == Setting(4, 2)
    # 4 workers: 2% more batches/s, less than the 5% a raise must bring: back to 2, and the
    # next knob, prefetch, is tried from there at once.
    back = tuner.observe(stalled(0.45, 20.4))
    assert back.setting == Setting(2, 4) and not back.settled
    assert "back to 2" in back.reason
    # Deeper prefetch does not help either: back to 2, and nothing is left to raise.
    done = tuner.observe(stalled(0.5, 19.5))
    assert done.setting == Setting(2, 2) and done.settled and "nothing left to raise" in done.reason


def test_a_raise_that_helps_is_kept_and_prefetch_doubles_while_it_helps():
    tuner = Tuner(Setting(2, 2), Limits(max_workers=2, max_inflight=64))
    assert tuner.observe(stalled(0.3, 10)).setting == Setting(2, 4)  # workers at their limit
    assert tuner.observe(stalled(0.2, 12)).setting == Setting(2, 8)
    done = tuner.observe(stalled(0.01, 14))
    assert done.setting == Setting(2, 8) and done.settled


def test_workers_are_not_raised_when_the_cpu_is_exhausted():
    tuner = Tuner(Setting(2, 2), ROOMY)
    decision = tuner.observe(stalled(0.6, 10, cpu=0.97))
    assert decision.setting == Setting(2, 4), "prefetch instead: more workers would take training's cores"
    pinned = Tuner(Setting(2, 2), ROOMY, knobs=("workers",))
    decision = pinned.observe(stalled(0.6, 10, cpu=0.97))
    assert decision.setting == Setting(2, 2) and decision.settled


def test_a_pinned_knob_is_never_changed_and_nothing_to_tune_is_settled_from_the_start():
    tuner = Tuner(Setting(1, 8), Limits(max_workers=16, max_inflight=24), knobs=("workers",))
    seen = [tuner.observe(stalled(0.9, 10 * (i + 1))).setting for i in range(4)]
    assert all(s.prefetch == 8 for s in seen)
    assert max(s.workers for s in seen) == 3, "3 x 8 batches ahead fill the memory budget of 24"
    assert Tuner(Setting(0, 2), ROOMY, knobs=("prefetch",)).settled, "prefetch means nothing without workers"
    assert Tuner(Setting(2, 2), ROOMY, knobs=()).observe(stalled(0.9, 1)).settled


@pytest.mark.parametrize("seed", range(20))
def test_it_never_exceeds_its_limits_and_always_settles(seed):
    rng = random.Random(seed)
    limits = Limits(max_workers=rng.randint(1, 12), max_inflight=rng.randint(1, 40))
    tuner = Tuner(Setting(1, 2), limits)
    for windows in range(1, 40):
        decision = tuner.observe(stalled(rng.random(), rng.uniform(1, 100), cpu=rng.choice([None, rng.random()])))
        workers, prefetch = decision.setting
        assert 1 <= workers <= limits.max_workers and prefetch >= 1
        assert workers * prefetch <= limits.max_inflight, f"{decision.setting} within {limits}"
        if decision.settled:
            break
    assert decision.settled and windows <= limits.max_workers + 8


def test_limits_follow_the_cores_and_the_memory_for_batches_ahead():
    assert Limits.of(cores=2, prefetch_memory=1 << 30, batch_bytes=1 << 20) == Limits(4, 1024)
    assert Limits.of(cores=0.5, prefetch_memory=1 << 20, batch_bytes=4 << 20) == Limits(1, 1)
    assert Limits.of(cores=100, prefetch_memory=1 << 30, batch_bytes=1).max_workers == autotune.MAX_WORKERS


def test_a_window_leaves_out_the_warm_up_and_counts_whole_steps():
    meter = autotune.WindowMeter(min_seconds=1.0, min_batches=2)
    meter.restart(warmup=2)
    meter.batch_taken(5.0)  # new workers' first batches: not counted
    meter.step_ended(10.0, Counters(100.0, 7.0, 3))
    meter.batch_taken(5.0)
    meter.step_ended(15.0, Counters(101.0, 8.0, 4))  # the window starts here
    assert not meter.ready(15.5)
    for now, waited in ((15.5, 0.25), (16.0, 0.25), (17.0, 0.5)):
        meter.batch_taken(waited)
        meter.step_ended(now, Counters(102.0, 9.0, 5))
    assert meter.ready(17.0)
    # 4 batches decoded in 6 worker-seconds by 3 workers: they deliver 2 batches/s.
    window = meter.window(17.0, Counters(103.0, 14.0, 8), cores=2, workers=3)
    assert window == Window(stall_share=0.5, batches_per_second=1.5, cpu_share=0.5, input_batches_per_second=2.0)
    unknown = meter.window(17.0, Counters(None, 14.0, 8), cores=2, workers=0)
    assert (unknown.cpu_share, unknown.input_batches_per_second) == (None, None)


def test_a_raise_of_workers_is_judged_by_what_the_decode_workers_deliver_not_by_trainings_speed():
    # The machine's other load slowed training during the trial (fewer batches/s taken), but
    # the decode workers deliver twice as much: kept.
    tuner = Tuner(Setting(2, 2), ROOMY)
    assert tuner.observe(Window(0.5, 10, 0.3, input_batches_per_second=10)).setting == Setting(4, 2)
    kept = tuner.observe(Window(0.2, 8, 0.5, input_batches_per_second=20))
    assert "input stage +100%" in kept.reason and kept.setting.workers > 4
    # Training sped up during the trial (more batches/s taken) but the workers deliver no more
    # (they share busy cores): back.
    tuner = Tuner(Setting(2, 2), ROOMY)
    tuner.observe(Window(0.5, 10, 0.6, input_batches_per_second=10))
    back = tuner.observe(Window(0.5, 13, 0.8, input_batches_per_second=10.2))
    assert back.setting == Setting(2, 4) and "back to 2" in back.reason


def test_workers_are_raised_to_deliver_what_training_could_take():
    # Training could take 20 batches/s (10 taken at a stall of 50%); 2 workers deliver 10: 4 are
    # needed, 5 with a tenth to spare, but a raise at most doubles.
    assert Tuner(Setting(2, 2), ROOMY).observe(Window(0.5, 10, 0.3, 10)).setting.workers == 4
    # 3 workers delivering 12 when training could take 14 (7 at 50%): 4 (3.85 with the tenth).
    assert Tuner(Setting(3, 2), ROOMY).observe(Window(0.5, 7, 0.3, 12)).setting.workers == 4


def test_a_deeper_prefetch_is_kept_when_the_stall_falls_by_a_quarter_at_the_same_speed():
    tuner = Tuner(Setting(2, 2), Limits(max_workers=2, max_inflight=64))
    assert tuner.observe(stalled(0.4, 10)).setting == Setting(2, 4)
    assert tuner.observe(stalled(0.25, 9.8)).setting == Setting(2, 8), "stall 40% -> 25%, about as fast"
    assert tuner.observe(stalled(0.24, 9.8)).setting == Setting(2, 4), "neither less stall nor faster: back"
    # Less stall bought with training's cores (workers decoding further ahead): back.
    tuner = Tuner(Setting(2, 2), Limits(max_workers=2, max_inflight=64))
    tuner.observe(stalled(0.4, 10))
    assert tuner.observe(stalled(0.1, 7)).setting == Setting(2, 2)


def test_limits_are_read_from_cgroups_v1_and_v2_the_machine_and_the_replica(tmp_path):
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       16384 kB\n")
    root = str(tmp_path)
    assert autotune.cgroup_cpu_quota(root) is None
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert autotune.cgroup_cpu_quota(root) is None
    (cgroup / "cpu.max").write_text("150000 100000\n")
    assert autotune.cgroup_cpu_quota(root) == 1.5
    os.remove(cgroup / "cpu.max")
    (cgroup / "cpu").mkdir()
    (cgroup / "cpu/cpu.cfs_quota_us").write_text("-1\n")
    (cgroup / "cpu/cpu.cfs_period_us").write_text("100000\n")
    assert autotune.cgroup_cpu_quota(root) is None
    (cgroup / "cpu/cpu.cfs_quota_us").write_text("50000\n")
    assert autotune.process_cores(replica_cpu=4, processes=1, root=root) == 0.5
    assert autotune.process_cores(replica_cpu=None, processes=2, root=root) == 0.25
    # The machine's memory, the cgroup's and the replica's: the least, shared by its processes.
    assert autotune.process_memory(None, 1, root) == 16384 * 1024
    (cgroup / "memory.max").write_text("8388608\n")
    assert autotune.process_memory(None, 2, root) == 4 << 20
    assert autotune.process_memory(autotune.quantity_bytes("1Mi"), 1, root) == 1 << 20
    assert [autotune.quantity_bytes(q) for q in ("4Gi", "512Mi", "1000", "", "4G")] == [4 << 30, 512 << 20, 1000,
                                                                                         None, None]
    assert autotune.prefetch_memory(4 << 30, shm=64 << 20, processes=2) == 16 << 20, "half the free /dev/shm"


# The engine end to end: one process (two ranks would add DDP's waits to the step, which a
# loaded 2-core machine makes long and uneven), a decode that sleeps 40 ms a sample (320 ms a
# batch of 8) and a step that sleeps 80 ms: one worker leaves training waiting half the time or
# more, the 4 workers 2 cores allow keep up (a step takes 85 ms on an idle machine, twice that
# on a busy one).
SLOW = {"TEST_DECODE_SECONDS": "0.04", "TEST_STEP_SECONDS": "0.08"}
USER_SLOW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_slow.py")


def test_the_engine_raises_its_workers_on_a_slow_decode_until_the_stall_falls_and_records_them(
        uneven_dataset, tmp_path):
    data, _ = uneven_dataset
    trainyard = FakeTrainyard()
    try:
        job = Job(tmp_path, data, replicas=1, user_module=USER_SLOW, env={**SLOW, **trainyard.env()},
                  workers="auto", prefetch="auto", autotune_window=1, epochs=10, max_steps=160, log_every=4,
                  checkpoint_every=1000).start()
        assert job.wait(150) == [0], job.logs()
    finally:
        trainyard.close()
    log = job.log(0)
    workers = trainyard.series("input_workers")
    stall = dict(trainyard.series("input_stall_share_recent"))
    assert workers[0][1] == 1, "auto starts from one worker"
    assert workers[-1][1] >= 2 and "workers 1 -> 2" in log, log

    # A clear drop: the stall while one worker decoded, against the end of the run.
    at_one = [stall[step] for step, count in workers if count == 1]
    at_end = [stall[step] for step, _ in workers[-5:]]
    assert statistics.mean(at_one) >= 0.3, (at_one, log)
    assert statistics.mean(at_end) <= statistics.mean(at_one) / 2, (at_one, at_end, log)

    # The chosen values: reported as metrics, in the log, and in the run record (posted once,
    # when a setting held for two windows after autotune settled on it; should the stall come
    # back later, autotune tunes again, and the metrics show where it ends).
    final = (int(workers[-1][1]), int(trainyard.series("input_prefetch")[-1][1]))
    assert "settled on %d workers x %d prefetch" % final in log, log
    assert len(trainyard.records) == 1
    recorded = trainyard.records[0]["engine"]["input_pipeline"]
    assert (recorded["autotuned"], recorded["settled"]) == (["workers", "prefetch"], True)
    assert recorded["workers"] >= 2 and f"settled on {recorded['workers']} workers x {recorded['prefetch']} " in log

    # The loader was rebuilt with other workers mid-epoch; the samples stayed exactly the plan's.
    plan_of = shards.ShardDataset(data, None, 0, 1, seed=0, batch_size=8)
    for entry in job.steps(0):
        first = (entry["step"] - 1) % (plan_of.plan.samples_per_rank // 8) * 8
        expected = [plan_of._index(shard)[index]["key"] for shard, index in plan_of.plan.samples(entry["epoch"], first, 8)]
        assert entry["keys"] == expected, entry["step"]
    assert len(job.steps(0)) == 160


def test_a_resumed_attempt_starts_autotune_from_the_settings_its_checkpoint_carries(uneven_dataset, tmp_path):
    """The checkpoint carries the decode settings the run had; a resumed run that leaves them
    `auto` starts there instead of at one worker (a restart after a failure or a preemption does
    not pay for tuning again)."""
    data, _ = uneven_dataset
    first = Job(tmp_path, data, replicas=1, workers=3, prefetch=4, epochs=10, max_steps=8, checkpoint_every=1000)
    assert first.start().wait(90) == [0], first.logs()
    trainyard = FakeTrainyard()
    try:
        resumed = Job(tmp_path, data, replicas=1, workers="auto", prefetch="auto", env=trainyard.env(), epochs=10,
                      max_steps=16, log_every=4, checkpoint_every=1000)
        assert resumed.start().wait(90) == [0], resumed.logs()
    finally:
        trainyard.close()
    log = resumed.log(0)
    assert "resuming from step 8 " in log, log
    assert "tuning workers and prefetch from 3 workers x 4 prefetch (the checkpoint's)" in log, log
    assert trainyard.series("input_workers")[0][1] == 3, trainyard.series("input_workers")


def test_where_autotune_starts_on_resume():
    assert train.resumed_start(None, ["workers", "prefetch"]) == autotune.START
    assert train.resumed_start({"workers": 5, "prefetch": 8}, ["workers", "prefetch"]) == {"workers": 5, "prefetch": 8}
    # A pinned knob is not autotune's to start: only the tuned ones come from the checkpoint.
    assert train.resumed_start({"workers": 5, "prefetch": 8}, ["prefetch"]) == dict(autotune.START, prefetch=8)
    # What is no setting (a checkpoint of an older engine, a damaged value) is ignored.
    for saved in ({}, {"workers": "3"}, {"workers": True}, {"workers": 65}, {"prefetch": 0}):
        assert train.resumed_start(saved, ["workers", "prefetch"]) == autotune.START, saved
