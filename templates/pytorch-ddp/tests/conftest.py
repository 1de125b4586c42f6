"""Shared by the engine's tests: the engine's modules on the import path, and a packed dataset."""
import os
import sys

import pytest
import torch

# templates/ is embedded in the server binary as it is on disk: leave no __pycache__ in it.
sys.dont_write_bytecode = True
TESTS = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(TESTS), "engine")
sys.path.insert(0, ENGINE)
sys.path.insert(0, TESTS)

import shardset  # noqa: E402

# Why a test marked `gpu` is skipped: said in pytest's summary (-rs), so that a run on a machine
# without one shows what it did not check. tests/gpu/run runs them on one.
NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is False here (tests/gpu/run runs these on one)"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped, with the reason, without one")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


# Seven shards of uneven sizes: they divide among no number of ranks.
UNEVEN_SHARDS = [150, 90, 200, 60, 130, 170, 100]


@pytest.fixture(scope="session")
def uneven_dataset(tmp_path_factory):
    """A dataset of 900 samples in 7 shards of uneven sizes; (folder, keys)."""
    folder = tmp_path_factory.mktemp("uneven-shards")
    return str(folder), shardset.write_dataset(str(folder), UNEVEN_SHARDS)
