"""The data order: every rank the same number of samples whatever the shard sizes, no sample on
two ranks or twice in an epoch, a new order each epoch, any position reachable without reading
the ones before it, and batches that do not depend on the number of decode workers."""
import collections
import itertools
import multiprocessing
import os

import pytest
import torch

import shards
import shardset
import train
import user_noisy

UNEVEN = [150, 90, 200, 60, 130, 170, 100]
# torch advises fewer decode workers than cores; 3 on 2 cores is what this file means to test.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


@pytest.mark.parametrize("shard_samples", [UNEVEN, [200] * 7, [5, 300, 1, 17], [1000]])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_every_rank_gets_as_many_samples_and_none_is_shared_or_repeated(shard_samples, world):
    plans = [shards.EpochPlan(shard_samples, rank, world, seed=3, shuffle_block=64) for rank in range(world)]
    total = sum(shard_samples)
    assert {p.samples_per_rank for p in plans} == {total // world}
    for epoch in (0, 1):
        seen = [p.sample_at(epoch, i) for p in plans for i in range(p.samples_per_rank)]
        assert len(set(seen)) == len(seen) == world * (total // world)
        assert all(0 <= index < shard_samples[shard] for shard, index in seen)


def test_equal_steps_per_rank_and_what_is_dropped():
    # 7 uneven shards over 2 ranks, batch 8 x 2 micro-batches: 450 samples each, 28 steps, 2 dropped.
    plan = shards.EpochPlan(UNEVEN, 0, 2, seed=0, shuffle_block=1000)
    assert train.steps_per_epoch(plan.samples_per_rank, 8, 2) == 28
    # Bounded by world * batch * grad_accum - 1 + (N mod world) per epoch, whatever the shards.
    for world in (1, 2, 3, 8):
        for batch, accum in ((1, 1), (8, 2), (64, 1)):
            plan = shards.EpochPlan(UNEVEN, 0, world, seed=0, shuffle_block=1000)
            used = world * train.steps_per_epoch(plan.samples_per_rank, batch, accum) * batch * accum
            assert sum(UNEVEN) - used <= world * batch * accum - 1 + sum(UNEVEN) % world


def test_the_order_is_a_function_of_seed_and_epoch():
    def order(seed, epoch):
        plan = shards.EpochPlan(UNEVEN, 1, 2, seed=seed, shuffle_block=100)
        return plan.samples(epoch, 0, plan.samples_per_rank)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    # Shuffled within the rank's share, not read in shard order.
    assert order(0, 0) != sorted(order(0, 0))


def test_the_shard_order_is_the_data_pipelines():
    for epoch in range(3):
        order = shards.epoch_shard_order(7, 9, epoch)
        assert sorted(order) == list(range(7))
        assert order[0::2] == shards.assign_shards(7, 0, 2, 9, epoch)


def test_any_position_is_reached_without_the_ones_before_it():
    plan = shards.EpochPlan(UNEVEN, 0, 2, seed=4, shuffle_block=64)
    fresh = shards.EpochPlan(UNEVEN, 0, 2, seed=4, shuffle_block=64)
    whole = plan.samples(2, 0, plan.samples_per_rank)
    assert fresh.samples(2, 333, 50) == whole[333:383]


def test_a_tar_without_its_index_reads_the_same(tmp_path):
    shardset.write_dataset(str(tmp_path), [3, 4])
    index = os.path.join(str(tmp_path), "shard-000001.idx.json")
    with_index = shards.shard_index(os.path.join(str(tmp_path), "shard-000001.tar"), index)
    assert shards.shard_index(os.path.join(str(tmp_path), "shard-000001.tar"), None) == with_index


def batches(dataset, workers, epoch, first, end):
    loader = shards.loader(dataset, workers, 2, False, seed=0)
    loader.sampler.start(epoch, first, end)
    return [(inputs, targets, keys) for (inputs, targets), keys in loader]


def test_batches_do_not_depend_on_the_number_of_decode_workers(uneven_dataset):
    data, _ = uneven_dataset
    dataset = shards.ShardDataset(data, user_noisy.decode, 1, 2, seed=0, batch_size=8, shuffle_block=100)
    alone, three = batches(dataset, 0, 1, 5, 12), batches(dataset, 3, 1, 5, 12)
    assert [k for _, _, k in alone] == [k for _, _, k in three]
    for (a, at, _), (b, bt, _) in zip(alone, three):
        assert torch.equal(a, b) and torch.equal(at, bt), "the same noise (decode runs under the batch's seed)"
    shards.stop_decode_workers()


def test_an_autotune_change_of_workers_mid_epoch_leaves_the_batches_as_they_were(uneven_dataset):
    """Autotune rebuilds the loader with other workers and prefetch between two batches
    (shards.BatchStream.resize): the batches that follow are the same samples, decoded under
    the same seeds, as without any change."""
    data, _ = uneven_dataset
    dataset = shards.ShardDataset(data, user_noisy.decode, 0, 2, seed=0, batch_size=8, shuffle_block=100)
    alone = batches(dataset, 0, 1, 0, 20)
    stream = shards.BatchStream(dataset, 1, 2, False, seed=0)
    stream.start(1, 0, 20)
    changed = []
    for workers, prefetch, count in ((1, 2, 3), (3, 2, 5), (2, 4, 1), (0, 1, 4), (3, 8, 100)):
        if (workers, prefetch) != (stream.workers, stream.prefetch):
            stream.resize(workers, prefetch)
        changed += [(inputs, targets, keys) for (inputs, targets), keys in itertools.islice(stream, count)]
    stream.stop()
    assert stream.next_batch == 20
    assert [k for _, _, k in changed] == [k for _, _, k in alone]
    for (a, at, _), (b, bt, _) in zip(alone, changed):
        assert torch.equal(a, b) and torch.equal(at, bt)
    assert multiprocessing.active_children() == [], "the replaced workers are gone"


def test_a_batch_holds_the_samples_its_keys_name(uneven_dataset):
    data, _ = uneven_dataset
    dataset = shards.ShardDataset(data, lambda s: (s["cls"], s["__key__"]), 0, 2, seed=0, batch_size=4)
    (labels, keys), named = dataset[(0, 3)]
    assert list(keys) == named and len(collections.Counter(named)) == 4


def test_read_ahead_covers_exactly_the_samples_of_a_shuffle_block():
    plan = shards.EpochPlan(UNEVEN, 1, 3, seed=2, shuffle_block=64)
    blocks = range((plan.samples_per_rank + 63) // 64)
    for epoch in (0, 1):
        for block in blocks:
            ahead = {(shard, i) for shard, first, end in plan.block_pieces(epoch, block) for i in range(first, end)}
            positions = range(block * 64, min((block + 1) * 64, plan.samples_per_rank))
            assert ahead == {plan.sample_at(epoch, p) for p in positions}
