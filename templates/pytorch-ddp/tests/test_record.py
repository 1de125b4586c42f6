"""The engine's part of the run record: built from injected facts (no machine, no torch state),
listing every installed package, each rank's seed and each rank's shards as the input pipeline
really assigns them."""
import json
import os
import re

import pytest

import record
import seeds
import shards
from conftest import UNEVEN_SHARDS

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""
MEMINFO = "MemTotal:       2113511244 kB\nMemFree:        1000 kB\n"


def facts(**overrides):
    base = {
        "python": {"version": "3.12.3", "executable": "/opt/venv/bin/python", "implementation": "CPython"},
        "platform": "Linux-6.8.0-x86_64-with-glibc2.39",
        # sys.path order: the venv's torch first, a system copy after it.
        "distributions": [("torch", "2.15.0"), ("filelock", "3.20.0"), ("typing_extensions", "4.16.0"),
                          ("Jinja2", "3.1.6"), ("torch", "2.0.0"), ("nvidia-nccl-cu13", "2.30.7"), (None, "1")],
        "cpuinfo": CPUINFO, "meminfo": MEMINFO, "cpu_count": 224,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_520_809_984}],
        "driver": "580.65.06", "cuda": "13.2", "cudnn": 92600, "nccl": "2.30.7",
        "deterministic_algorithms": True, "cudnn_benchmark": False, "cublas_workspace_config": ":4096:8",
    }
    base.update(overrides)
    return base


def run(**overrides):
    base = {"seed": 7, "deterministic": True, "world_size": 4, "replicas": 2, "processes_per_replica": 2,
            "backend": "nccl", "device_type": "cuda", "data_path": "/data/shards",
            "content_hash": "sha256:" + "ab" * 32, "shard_samples": UNEVEN_SHARDS,
            "user_module": "", "user_module_sha256": "sha256:" + "cd" * 32, "user_repo": "", "user_commit": "",
            "input_pipeline": {"workers": 4, "prefetch": 2, "autotuned": ["workers", "prefetch"], "settled": True}}
    base.update(overrides)
    return base


def test_the_record_lists_every_installed_package_once_by_its_normalized_name():
    body = record.build(facts(), run())
    assert body["environment"]["packages"] == {
        "filelock": "3.20.0", "jinja2": "3.1.6", "nvidia-nccl-cu13": "2.30.7", "torch": "2.15.0",
        "typing-extensions": "4.16.0",
    }, "the first of two copies (the one imported) counts; a nameless entry is left out"
    assert list(body["environment"]["packages"]) == sorted(body["environment"]["packages"])
    assert body["environment"]["python"]["executable"] == "/opt/venv/bin/python"


def test_hardware_and_drivers_are_read_from_the_facts():
    hardware = record.build(facts(), run())["hardware"]
    assert hardware["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert hardware["memory_bytes"] == 2113511244 * 1024
    assert hardware["cudnn"] == "9.26.0" and hardware["nccl"] == "2.30.7" and hardware["driver"] == "580.65.06"
    assert (hardware["world_size"], hardware["replicas"], hardware["processes_per_replica"]) == (4, 2, 2)
    cpu = record.build(facts(cpuinfo="Hardware\t: BCM2835\n", meminfo="", gpus=[], driver=None, cudnn=None), run())
    assert cpu["hardware"]["cpu_model"] == "BCM2835" and cpu["hardware"]["memory_bytes"] is None
    assert cpu["hardware"]["cudnn"] is None
    assert record.cudnn_version(8907) == "8.9.7"


def test_seeds_are_each_ranks_own_and_the_flags_are_recorded():
    body = record.build(facts(), run())["seeds"]
    assert body["rank_seeds"] == [seeds.rank_seed(7, r) for r in range(4)]
    assert len(set(body["rank_seeds"])) == 4
    assert (body["seed"], body["deterministic"], body["cublas_workspace_config"]) == (7, True, ":4096:8")
    many = record.build(facts(), run(world_size=record.MAX_LISTED_SEEDS + 1))["seeds"]
    assert many["rank_seeds"] is None and "sha256('rank:<seed>:<r>')" in many["rule"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_shard_assignment_is_what_each_rank_reads(world):
    data = record.build(facts(), run(world_size=world))["data"]
    assert (data["shards"], data["samples"], data["content_hash"]) == (7, 900, "sha256:" + "ab" * 32)
    ranks = data["assignment"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(world))
    per_rank = 900 // world
    seen = set()
    for entry in ranks:
        # The rank's samples as the training plan gives them, before any shuffle or drop.
        plan = shards.EpochPlan(UNEVEN_SHARDS, entry["rank"], world, 7, shuffle_block=1_000_000)
        planned = set(plan.samples(0, 0, per_rank))
        listed = set()
        for i, shard in enumerate(entry["shards"]):
            first = entry["first_index"] if i == 0 else 0
            end = entry["end_index"] if i == len(entry["shards"]) - 1 else UNEVEN_SHARDS[shard]
            listed |= {(shard, k) for k in range(first, end)}
        assert listed == planned
        assert not listed & seen, "no sample is given to two ranks"
        seen |= listed
    assert len(seen) == per_rank * world


def test_past_the_limit_the_rule_stands_for_the_list():
    many = [1] * (record.MAX_LISTED_SHARDS + 1)
    data = record.build(facts(), run(shard_samples=many))["data"]
    assert data["assignment"]["ranks"] is None and "sha256('<seed>:<epoch>:<position>')" in data["assignment"]["rule"]
    assert data["shards"] == len(many)


def test_the_body_has_exactly_the_fields_the_api_takes_and_is_json():
    body = record.build(facts(), run(user_repo="https://example.com/r.git", user_commit="abc1234"))
    assert set(body) == {"environment", "hardware", "seeds", "data", "user_code", "engine"}
    assert set(body["environment"]) == {"python", "platform", "packages"}
    assert body["user_code"]["commit"] == "abc1234" and body["user_code"]["module"] is None
    assert json.loads(json.dumps(body)) == body
    assert record.build(facts(), run()) == record.build(facts(), run()), "the same facts, the same record"


def test_the_engine_part_keeps_the_decode_settings_a_rerun_can_pin():
    engine = record.build(facts(), run())["engine"]
    assert engine["input_pipeline"] == {"workers": 4, "prefetch": 2, "autotuned": ["workers", "prefetch"],
                                        "settled": True}
    assert (engine["name"], engine["version"]) == (record.ENGINE["name"], record.ENGINE["version"])
    pinned = {"workers": 0, "prefetch": 2, "autotuned": [], "settled": True}
    assert record.build(facts(), run(input_pipeline=pinned))["engine"]["input_pipeline"] == pinned


def test_the_engine_version_is_the_templates():
    manifest = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "template.yaml")
    with open(manifest) as f:
        version = re.search(r"^version: (\S+)$", f.read(), re.MULTILINE).group(1)
    assert record.ENGINE == {"name": "pytorch-ddp", "version": version}


def test_gathered_facts_list_torch_and_what_it_depends_on():
    gathered = record.gather()
    packages = record.package_lock(gathered["distributions"])
    assert "torch" in packages and "filelock" in packages
    assert gathered["python"]["executable"]
