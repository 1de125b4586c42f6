"""Datasets on Trainyard's object store (`--data store:NAME@VERSION`): the engine trains on
exactly what it trains on from the packed folder, the node's second job fetches no shard byte,
a shard damaged in the cache is fetched again, a refused token or an unknown version fails with
a clear line, and the view holds its shards against eviction until it is closed."""
import hashlib
import json
import os
import socket

import pytest

import cache
import remote
import shards
import shardset
from fake_trainyard import FakeTrainyard
from jobs import Job

# 140 samples in 4 shards; 2 ranks x batch 8: 8 steps, one epoch.
SHARDS = [40, 30, 50, 20]
TINY_RUN = dict(epochs=1, workers=0, deterministic="true", checkpoint_every=1000)
NAMESPACE = "team-a"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The packed dataset folder and its manifest."""
    folder = str(tmp_path_factory.mktemp("packed"))
    shardset.write_dataset(folder, SHARDS)
    with open(os.path.join(folder, "dataset.json")) as f:
        return folder, json.load(f)


def serving(packed):
    trainyard = FakeTrainyard()
    trainyard.serve_dataset("tiny", "1", packed[0])
    return trainyard


def run_job(folder, data, trainyard, env=None, replicas=2):
    """The engine on `data` to its end, reporting to `trainyard`, with its own temp folder."""
    temp = os.path.join(str(folder), "tmp")
    os.makedirs(temp)
    job = Job(folder, data, replicas=replicas, env={**trainyard.env(), "TMPDIR": temp, **(env or {})}, **TINY_RUN)
    job.codes = job.start().wait(90)
    job.temp = temp
    return job


def trained(job):
    """What each rank trained on, step by step: sample keys and loss."""
    return [[(e["epoch"], e["keys"], e["loss"]) for e in job.steps(rank)] for rank in (0, 1)]


def assert_trained_alike(job, other, why=""):
    """The same samples in the same order on each rank, and the same losses up to float noise:
    CPU kernels may sum in another order from run to run on a loaded machine (a CI run found a
    loss differing in its seventh digit)."""
    a, b = trained(job), trained(other)
    assert [[step[:2] for step in rank] for rank in a] == [[step[:2] for step in rank] for rank in b], why
    losses_a, losses_b = ([step[2] for rank in steps for step in rank] for steps in (a, b))
    assert losses_a == pytest.approx(losses_b, rel=1e-5), why


def cached_path(cache_dir, sha256):
    return cache.shard_path(cache_dir, NAMESPACE, sha256)


@pytest.fixture(scope="module")
def runs(packed, tmp_path_factory):
    """On one node cache: a first store run, a second, then a third after one cached shard was
    damaged on disk; and a run on the packed folder. {name: (job, trainyard)}."""
    folder, manifest = packed
    cache_dir = str(tmp_path_factory.mktemp("node-cache"))
    env = {"TRAINYARD_CACHE_DIR": cache_dir, "TRAINYARD_CACHE_NAMESPACE": NAMESPACE, "TRAINYARD_NODE": "node-a"}
    done = {}
    for name in ("first", "second", "damaged", "local"):
        if name == "damaged":
            path = cached_path(cache_dir, manifest["shards"][2]["sha256"])
            with open(path, "r+b") as f:
                f.seek(700)
                byte = f.read(1)
                f.seek(700)
                f.write(bytes([byte[0] ^ 0xFF]))
        trainyard = serving(packed)
        try:
            data = folder if name == "local" else "store:tiny@1"
            done[name] = (run_job(tmp_path_factory.mktemp(name), data, trainyard, env), trainyard)
        finally:
            trainyard.close()
    return done


def metric(trainyard, name):
    values = [value for _step, value in trainyard.series(name)]
    assert len(values) == 1, (name, trainyard.metrics)
    return values[0]


def test_the_nodes_second_job_fetches_no_shard_and_trains_on_what_the_folder_gives(runs, packed):
    _folder, manifest = packed
    shard_bytes = sum(s["bytes"] for s in manifest["shards"])
    for name, (job, _trainyard) in runs.items():
        assert job.codes == [0, 0], (name, job.logs())
    first, first_server = runs["first"]
    second, second_server = runs["second"]
    local, _ = runs["local"]
    assert first_server.shard_bytes_served == shard_bytes, "every shard fetched once for the node's two ranks"
    assert second_server.shard_bytes_served == 0
    indexes = {s["index"] for s in manifest["shards"]}
    assert {f for f in first_server.files_served if f in indexes} == indexes
    assert not indexes & set(second_server.files_served), "the indexes come from the node cache too"
    assert len(trained(local)[0]) == 8
    assert_trained_alike(first, local, "the same samples and losses")
    assert_trained_alike(second, local, "the same samples and losses")

    # Reported, summed over the two ranks: 8 shard opens.
    assert (metric(first_server, "data/cache_misses"), metric(first_server, "data/cache_hits")) == (4, 4)
    assert metric(first_server, "data/bytes_fetched") == shard_bytes
    assert (metric(second_server, "data/cache_misses"), metric(second_server, "data/cache_hits")) == (0, 8)
    assert metric(second_server, "data/bytes_fetched") == 0
    assert "data: store:tiny@1 through the shard cache: 8 shard opens cached, 0 fetched (0 bytes)" in second.log(0)


def test_each_replica_of_a_store_run_reports_that_its_node_caches_the_whole_version(runs, packed):
    _folder, manifest = packed
    shard_bytes = sum(s["bytes"] for s in manifest["shards"])
    report = {"node": "node-a", "name": "tiny", "version": "1", "bytes": shard_bytes}
    for name in ("first", "second", "damaged"):
        job, trainyard = runs[name]
        assert trainyard.cache_reports == [report, report], name
        assert f"data: node node-a caches all of tiny@1 ({shard_bytes} bytes)" in job.log(0)
    assert runs["local"][1].cache_reports == [], "a folder is not the node's cache"


def test_a_refused_cache_report_costs_the_run_nothing(trainyard, packed, tmp_path, capsys):
    env = {**trainyard.env(), "TRAINYARD_NODE": "node-a", "TRAINYARD_TOKEN": "not-the-token"}
    assert not remote.report_cached(env["TRAINYARD_URL"], env["TRAINYARD_TOKEN"], env, remote.DatasetRef("tiny", "1"), 5)
    assert "could not report that node node-a caches tiny@1: HTTP 401" in capsys.readouterr().out
    assert not remote.report_cached("http://127.0.0.1:9", "t", env, remote.DatasetRef("tiny", "1"), 5)
    assert trainyard.cache_reports == []
    # Without a node name (an old executor) nothing is sent.
    assert not remote.report_cached(env["TRAINYARD_URL"], trainyard.token, trainyard.env(), remote.DatasetRef("tiny", "1"), 5)


def test_a_store_run_records_the_dataset_and_the_content_hash_a_folder_run_records(runs, packed):
    folder, manifest = packed
    store = runs["first"][1].records[0]["data"]
    local = runs["local"][1].records[0]["data"]
    assert store["path"] == "store:tiny@1" and local["path"] == folder
    assert store["content_hash"] == local["content_hash"] == manifest["content_hash"]
    assert (store["shards"], store["samples"]) == (local["shards"], local["samples"]) == (4, 140)


def test_a_shard_damaged_in_the_cache_is_fetched_again_and_the_run_succeeds(runs, packed):
    _folder, manifest = packed
    job, trainyard = runs["damaged"]
    assert job.codes == [0, 0], job.logs()
    assert trainyard.shard_bytes_served == manifest["shards"][2]["bytes"], "that shard only"
    assert metric(trainyard, "data/cache_refetched") == 1
    assert (metric(trainyard, "data/cache_misses"), metric(trainyard, "data/cache_hits")) == (1, 7)
    assert_trained_alike(job, runs["local"][0])


def test_every_run_removes_its_view_of_the_dataset(runs):
    for name, (job, _trainyard) in runs.items():
        assert [n for n in os.listdir(job.temp) if n.startswith("trainyard-dataset-")] == [], name


def test_a_refused_token_and_an_unknown_version_end_the_job_with_a_clear_line(packed, tmp_path):
    trainyard = serving(packed)
    try:
        refused = Job(tmp_path / "refused", "store:tiny@1", replicas=1,
                      env={**trainyard.env(), "TRAINYARD_TOKEN": "not-the-job-token"}, **TINY_RUN).start()
        unknown = Job(tmp_path / "unknown", "store:tiny@2", replicas=1, env=trainyard.env(), **TINY_RUN).start()
        assert refused.wait(60) == [1] and unknown.wait(60) == [1], refused.logs() + unknown.logs()
    finally:
        trainyard.close()
    assert refused.last_line(0) == ("trainyard: the job token was refused for dataset tiny@1 "
                                    "(HTTP 401 for dataset.json)"), refused.logs()
    assert unknown.last_line(0).startswith("trainyard: dataset tiny@2 has no file dataset.json on the server"), \
        unknown.logs()
    assert trainyard.shard_bytes_served == 0 and refused.steps(0) == unknown.steps(0) == []


# The view, in this process.

@pytest.fixture
def trainyard(packed):
    server = serving(packed)
    yield server
    server.close()


def files(trainyard, name="tiny", delays=(0.01, 0.01)):
    env = trainyard.env()
    return remote.DatasetFiles(env["TRAINYARD_URL"], env["TRAINYARD_TOKEN"], remote.DatasetRef(name, "1"),
                               retry_delays=delays)


def test_the_view_is_the_packed_folder_with_its_shards_in_the_cache(trainyard, packed, tmp_path):
    folder, manifest = packed
    cache_dir = str(tmp_path / "cache")
    with remote.DatasetView(files(trainyard), remote.CacheSettings(cache_dir, NAMESPACE)) as view:
        names = [s["name"] for s in manifest["shards"]] + [s["index"] for s in manifest["shards"]]
        assert sorted(os.listdir(view.folder)) == sorted(names + ["dataset.json"])
        for name in names + ["dataset.json"]:
            with open(os.path.join(view.folder, name), "rb") as ours, open(os.path.join(folder, name), "rb") as packed_:
                assert ours.read() == packed_.read(), name
        for entry in manifest["shards"]:
            link = os.path.join(view.folder, entry["name"])
            assert os.readlink(link) == cached_path(os.path.abspath(cache_dir), entry["sha256"])
        from_view = shards.ShardDataset(view.folder, lambda s: s["cls"], 1, 2, seed=3, batch_size=8)
        from_folder = shards.ShardDataset(folder, lambda s: s["cls"], 1, 2, seed=3, batch_size=8)
        assert [from_view[(0, b)] for b in range(8)] == [from_folder[(0, b)] for b in range(8)]
        assert view.counts() == {"data/cache_hits": 0, "data/cache_misses": 4, "data/cache_refetched": 0,
                                 "data/bytes_fetched": sum(s["bytes"] for s in manifest["shards"])}
    assert not os.path.exists(view.folder)
    assert all(os.path.exists(cached_path(cache_dir, s["sha256"])) for s in manifest["shards"]), \
        "the node's cache outlives the view"


def test_shards_the_view_holds_are_not_evicted_until_it_is_closed(trainyard, packed, tmp_path):
    _folder, manifest = packed
    cache_dir = str(tmp_path / "cache")
    held = [cached_path(cache_dir, s["sha256"]) for s in manifest["shards"]]
    view = remote.DatasetView(files(trainyard), remote.CacheSettings(cache_dir, NAMESPACE))
    # Another job on the node, under a budget of one byte: every fill tries to evict the rest.
    other = cache.ShardCache(cache_dir, NAMESPACE, budget_bytes=1)

    def fill_another(number):
        data = bytes([number]) * 100
        sha256 = hashlib.sha256(data).hexdigest()
        other.open(sha256, len(data), lambda out: out.write(data)).close()

    try:
        fill_another(1)
        assert all(os.path.exists(path) for path in held), "in use: kept over the budget"
        assert other.stats()["over_budget"] == 1
    finally:
        view.close()
    fill_another(2)
    assert not any(os.path.exists(path) for path in held), "let go by the view: evicted"


def test_without_a_node_cache_the_view_keeps_a_private_one_and_removes_it(trainyard, packed, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    settings = remote.CacheSettings.from_env({})
    assert (settings.root, settings.budget_bytes) == (None, float("inf"))
    view = remote.DatasetView(files(trainyard), settings)
    cached = os.path.realpath(os.path.join(view.folder, "shard-000000.tar"))
    assert cached.startswith(os.path.realpath(view.folder) + os.sep)
    view.close()
    assert os.listdir(tmp_path) == []


def test_a_dataset_over_the_budget_is_not_reported_as_cached(trainyard, packed, tmp_path):
    env = {**trainyard.env(), "TRAINYARD_CACHE_DIR": str(tmp_path / "cache"), "TRAINYARD_CACHE_NAMESPACE": NAMESPACE,
           "TRAINYARD_NODE": "node-a", "TRAINYARD_CACHE_BUDGET_BYTES": "1000"}
    with remote.dataset_view(remote.DatasetRef("tiny", "1"), environ=env):
        pass
    assert trainyard.cache_reports == [], "it does not stay cached: no node would be warm for it"
    with remote.dataset_view(remote.DatasetRef("tiny", "1"), environ={**env, "TRAINYARD_CACHE_BUDGET_BYTES": ""}):
        pass
    assert [r["node"] for r in trainyard.cache_reports] == ["node-a"]


def test_a_view_that_fails_midway_leaves_nothing_and_names_the_file(trainyard, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "temp"))
    os.makedirs(tmp_path / "temp")
    shardset.write_dataset(str(tmp_path / "lost"), [5, 5])
    os.remove(tmp_path / "lost" / "shard-000001.idx.json")  # the server lost it: 404 when asked
    trainyard.serve_dataset("lost", "1", tmp_path / "lost")
    with pytest.raises(remote.DatasetError, match=r"^dataset lost@1 has no file shard-000001\.idx\.json on the "
                                                  r"server$"):
        remote.DatasetView(files(trainyard, "lost"), remote.CacheSettings(str(tmp_path / "cache"), NAMESPACE))
    assert os.listdir(tmp_path / "temp") == []


def test_a_shard_the_server_gives_wrong_twice_is_refused_naming_the_dataset(trainyard, packed, tmp_path):
    trainyard.tampered.add("shard-000002.tar")
    with pytest.raises(remote.DatasetShardCorrupt) as raised:
        remote.DatasetView(files(trainyard), remote.CacheSettings(str(tmp_path / "cache"), NAMESPACE))
    assert isinstance(raised.value, cache.ShardCorrupt)
    assert str(raised.value).startswith("dataset tiny@1: shard shard-000002.tar came from the server twice with "
                                        "the wrong content"), str(raised.value)
    sha256 = packed[1]["shards"][2]["sha256"]
    assert not os.path.exists(cached_path(str(tmp_path / "cache"), sha256)), "nothing wrong is cached"


def test_unavailable_answers_are_tried_again_then_reported(trainyard):
    trainyard.unavailable["dataset.json"] = 2
    assert json.loads(files(trainyard).read("dataset.json"))["samples"] == 140
    trainyard.unavailable["dataset.json"] = 3
    with pytest.raises(remote.DatasetError, match=r"^could not fetch dataset.json of dataset tiny@1 from "
                                                  r"http://127\.0\.0\.1:\d+: HTTP 503 .*\(3 tries\)$"):
        files(trainyard).read("dataset.json")


def test_a_store_dataset_is_named_as_the_server_names_dataset_versions():
    assert remote.store_dataset("/data/shards") is None
    assert str(remote.store_dataset("store:photos.v2@2024-01_a")) == "photos.v2@2024-01_a"
    for bad in ("store:photos", "store:@1", "store:../x@1", "store:photos@1/2", "store:a@b@c"):
        with pytest.raises(remote.DatasetError, match="store:NAME@VERSION"):
            remote.store_dataset(bad)


def test_cache_settings_from_the_environment():
    node = remote.CacheSettings.from_env({"TRAINYARD_CACHE_DIR": "/ssd/cache", "TRAINYARD_CACHE_NAMESPACE": "team-a",
                                          "TRAINYARD_CACHE_BUDGET_BYTES": "5000000000"})
    assert (node.root, node.namespace, node.budget_bytes) == ("/ssd/cache", "team-a", 5_000_000_000)
    with pytest.raises(remote.DatasetError, match="TRAINYARD_CACHE_NAMESPACE"):
        remote.CacheSettings.from_env({"TRAINYARD_CACHE_DIR": "/ssd/cache"})
    with pytest.raises(remote.DatasetError, match="not a number of bytes"):
        remote.CacheSettings.from_env({"TRAINYARD_CACHE_BUDGET_BYTES": "5Gi"})
    assert (node.tenant_budget_bytes, node.private) == (None, False)
    shared = remote.CacheSettings.from_env({"TRAINYARD_CACHE_DIR": "/ssd/cache", "TRAINYARD_CACHE_NAMESPACE": "team-a",
                                            "TRAINYARD_CACHE_TENANT_BUDGET_BYTES": "1000", "TRAINYARD_CACHE_PRIVATE": "1"})
    assert (shared.budget_bytes, shared.tenant_budget_bytes, shared.private) == (float("inf"), 1000, True)
    with pytest.raises(remote.DatasetError, match="TRAINYARD_CACHE_TENANT_BUDGET_BYTES"):
        remote.CacheSettings.from_env({"TRAINYARD_CACHE_TENANT_BUDGET_BYTES": "-1"})


def test_the_tenant_budget_reaches_the_cache_and_bounds_what_is_reported(trainyard, packed, tmp_path):
    env = {**trainyard.env(), "TRAINYARD_CACHE_DIR": str(tmp_path / "cache"), "TRAINYARD_CACHE_NAMESPACE": NAMESPACE,
           "TRAINYARD_NODE": "node-a", "TRAINYARD_CACHE_TENANT_BUDGET_BYTES": "1000"}
    with remote.dataset_view(remote.DatasetRef("tiny", "1"), environ=env) as view:
        assert view._cache.namespace_budget_bytes == 1000
    assert trainyard.cache_reports == [], "over the tenant's share: it will not stay cached"


def test_a_redirect_to_another_host_does_not_carry_the_job_token():
    request = remote.urllib.request.Request("http://trainyard:8080/x", headers={"Authorization": "Bearer t"})
    redirect = remote.TokenStaysHome()
    elsewhere = redirect.redirect_request(request, None, 302, "Found", {}, "https://bucket.example/x?sig=1")
    home = redirect.redirect_request(request, None, 302, "Found", {}, "http://trainyard:8080/y")
    assert not elsewhere.has_header("Authorization") and home.get_header("Authorization") == "Bearer t"


# The node's cache agent (Kubernetes: `trainyard cache-agent`, TRAINYARD_DATASET_URL).

def closed_port_url():
    """The URL of a port nothing listens on."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


def agent_env(trainyard, agent_url, tmp_path):
    return {**trainyard.env(), "TRAINYARD_DATASET_URL": agent_url, "TRAINYARD_NODE": "node-a", "TMPDIR": str(tmp_path)}


def test_through_the_nodes_cache_agent_every_file_comes_from_it_and_the_report_goes_to_the_server(
        trainyard, packed, tmp_path):
    agent = serving(packed)  # the agent speaks the server's protocol, with the same job token
    try:
        env = agent_env(trainyard, f"http://127.0.0.1:{agent.server.server_address[1]}", tmp_path)
        with remote.dataset_view(remote.DatasetRef("tiny", "1"), environ=env) as view:
            with open(os.path.join(view.folder, "shard-000001.tar"), "rb") as ours, \
                    open(os.path.join(packed[0], "shard-000001.tar"), "rb") as packed_:
                assert ours.read() == packed_.read()
        names = {s["name"] for s in packed[1]["shards"]} | {s["index"] for s in packed[1]["shards"]}
        assert set(agent.files_served) == names | {"dataset.json"}
        assert trainyard.files_served == {}, "nothing from the server itself"
        assert [r["node"] for r in trainyard.cache_reports] == ["node-a"], "the node's agent holds it all"
        assert agent.cache_reports == []
    finally:
        agent.close()


def test_an_agent_that_is_down_or_failing_costs_the_run_nothing_but_the_report(trainyard, packed, tmp_path, capsys):
    for agent_url, failing in [(closed_port_url(), None), (None, serving(packed))]:
        if failing is not None:
            agent_url = f"http://127.0.0.1:{failing.server.server_address[1]}"
            failing.unavailable["dataset.json"] = 1  # a 503 from the agent
        env = agent_env(trainyard, agent_url, tmp_path)
        before = sum(trainyard.files_served.values())
        with remote.dataset_view(remote.DatasetRef("tiny", "1"), environ=env):
            pass
        assert sum(trainyard.files_served.values()) - before == 1 + 2 * len(SHARDS), "all of it from the server"
        assert "the node's cache agent" in capsys.readouterr().out
        assert trainyard.cache_reports == [], "read past the agent: its node may not hold it"
        if failing is not None:
            assert failing.files_served == {}, "not asked again within AGENT_RETRY_AFTER"
            failing.close()


def test_the_agents_refusal_is_the_servers_and_ends_the_view_with_a_clear_error(trainyard, packed, tmp_path):
    agent = FakeTrainyard(token="another-token")  # refuses this job's token: 401
    try:
        env = agent_env(trainyard, f"http://127.0.0.1:{agent.server.server_address[1]}", tmp_path)
        with pytest.raises(remote.DatasetError, match="token was refused"):
            remote.dataset_view(remote.DatasetRef("tiny", "1"), environ=env)
        assert trainyard.files_served == {}, "a refusal is no reason to ask the server past the agent"
    finally:
        agent.close()
