"""Seeds: each rank its own, nothing reseeds them, and a rank's saved states bring its
generators back exactly (Python, NumPy, torch)."""
import random

import numpy
import pytest
import torch

import seeds


def draws():
    return random.random(), float(numpy.random.random()), torch.rand(3).tolist()


def test_rank_seeds_differ_between_ranks_and_jobs_and_repeat():
    values = {(seed, rank): seeds.rank_seed(seed, rank) for seed in (0, 1, 1000, 2**32 - 1) for rank in range(16)}
    assert len(set(values.values())) == len(values), "distinct for every (seed, rank)"
    # The old rule, seed + 1000 * rank, gave job seed 1000's rank 0 the generators of seed 0's rank 1.
    assert seeds.rank_seed(1000, 0) != seeds.rank_seed(0, 1)
    assert seeds.rank_seed(7, 3) == seeds.rank_seed(7, 3)
    for value in values.values():
        assert 0 <= value < 2**64
        torch.Generator().manual_seed(value)  # in torch's accepted range


def test_batch_seeds_depend_on_every_part():
    base = seeds.batch_seed(1, 2, 3, 4)
    assert len({base, seeds.batch_seed(0, 2, 3, 4), seeds.batch_seed(1, 0, 3, 4), seeds.batch_seed(1, 2, 0, 4),
                seeds.batch_seed(1, 2, 3, 0)}) == 5


def test_seeding_a_rank_makes_its_draws_repeat_and_ranks_differ():
    seeds.seed_everything(seeds.rank_seed(5, 0))
    first = draws()
    seeds.seed_everything(seeds.rank_seed(5, 0))
    assert draws() == first
    seeds.seed_everything(seeds.rank_seed(5, 1))
    assert draws() != first


def test_a_saved_state_brings_every_generator_back():
    seeds.seed_everything(123)
    draws()
    saved = seeds.rng_state(torch.device("cpu"))
    expected = draws()
    seeds.seed_everything(999)  # what a restarted process does before it restores
    seeds.rng_restore(saved, torch.device("cpu"))
    assert draws() == expected
    assert set(saved) == {"python", "numpy", "torch"}


def test_numpys_state_is_saved_as_plain_values():
    state = seeds.rng_state(torch.device("cpu"))["numpy"]
    assert state[0] == "MT19937" and isinstance(state[1], list) and len(state[1]) == 624
    assert all(type(value) in (str, list, int, float) for value in state)


@pytest.mark.gpu
def test_a_saved_state_brings_the_cuda_generator_back():
    device = torch.device("cuda:0")
    saved = seeds.rng_state(device)
    expected = torch.rand(3, device=device).tolist()
    seeds.rng_restore(saved, device)
    assert torch.rand(3, device=device).tolist() == expected


def test_decoding_under_a_batch_seed_leaves_the_training_generators_alone():
    seeds.seed_everything(42)
    expected = draws()
    seeds.seed_everything(42)
    with seeds.seeded(7):
        inside = draws()
    assert draws() == expected, "the training process's generators are as they were"
    with seeds.seeded(7):
        assert draws() == inside, "what decode draws depends on the batch seed only"
