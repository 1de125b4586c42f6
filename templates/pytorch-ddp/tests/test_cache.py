"""The node-local shard cache: a second job reads nothing from the store, damaged or wrong bytes
are never served, a failed fill leaves nothing behind, budgets evict the least recently used
shards but never one in use, tenants never share files, and two processes filling one shard
fetch it once."""
import hashlib
import multiprocessing
import os
import stat
import time

import pytest

import cache
from cache import ShardCache, ShardCorrupt

MB = 1_000_000


class Store:
    """The object store as a `fetch` factory: counts the fetches and the bytes they give."""

    def __init__(self):
        self.fetches = 0
        self.bytes_given = 0

    def fetcher(self, data):
        def fetch(out):
            self.fetches += 1
            self.bytes_given += len(data)
            out.write(data)
        return fetch


def shard(seed, size=1000):
    """Distinct bytes for shard number `seed`, and their sha256."""
    data = bytes([seed % 256]) * size
    return data, hashlib.sha256(data).hexdigest()


def open_and_read(cache_, data, sha256, store):
    with cache_.open(sha256, len(data), store.fetcher(data)) as file:
        return file.read()


def test_a_second_open_fetches_nothing_in_this_process_or_the_next(tmp_path):
    data, sha256 = shard(1, 10_000)
    store = Store()
    first = ShardCache(tmp_path, "team-a", 100 * MB)
    assert open_and_read(first, data, sha256, store) == data
    assert store.bytes_given == 10_000
    assert open_and_read(first, data, sha256, store) == data
    # The next job on the node: a new process, a new instance.
    second = ShardCache(tmp_path, "team-a", 100 * MB)
    assert open_and_read(second, data, sha256, store) == data
    assert store.bytes_given == 10_000, "the store was read only once"
    assert first.stats()["misses"] == 1 and first.stats()["hits"] == 1
    assert first.stats()["bytes_fetched"] == 10_000
    assert second.stats() == {"hits": 1, "misses": 0, "bytes_fetched": 0, "refetched": 0, "evicted": 0,
                              "over_budget": 0}
    assert os.path.isfile(tmp_path / "team-a" / sha256[:2] / sha256)


def test_a_damaged_cached_file_is_detected_by_the_next_process_and_fetched_again(tmp_path):
    data, sha256 = shard(2, 10_000)
    store = Store()
    first = ShardCache(tmp_path, "team-a", 100 * MB)
    open_and_read(first, data, sha256, store)
    path = tmp_path / "team-a" / sha256[:2] / sha256
    damaged = bytearray(path.read_bytes())
    damaged[5000] ^= 0xFF
    path.write_bytes(bytes(damaged))

    second = ShardCache(tmp_path, "team-a", 100 * MB)
    assert open_and_read(second, data, sha256, store) == data
    assert store.fetches == 2
    assert second.stats()["refetched"] == 1
    assert path.read_bytes() == data
    # An instance hashes a shard once: the first one checked it before the damage and trusts it.
    assert first.stats()["hits"] == 0
    open_and_read(first, data, sha256, store)
    assert store.fetches == 2 and first.stats()["hits"] == 1


def test_the_next_process_trusts_a_shard_found_whole_without_reading_it_again(tmp_path, monkeypatch):
    data, sha256 = shard(5, 10_000)
    store = Store()
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB), data, sha256, store)
    path = tmp_path / "team-a" / sha256[:2] / sha256
    assert (tmp_path / "team-a" / sha256[:2] / f"{sha256}.lock").read_bytes().startswith(b"verified ")
    hashed = []
    real = cache._has_content
    monkeypatch.setattr(cache, "_has_content", lambda *a: hashed.append(a) or real(*a))
    second = ShardCache(tmp_path, "team-a", 100 * MB)
    assert open_and_read(second, data, sha256, store) == data
    assert hashed == [] and second.stats()["hits"] == 1, "filled and checked once: not hashed again"
    # Opens move the access time (least recently used), never the modification time it vouches for.
    before = path.stat().st_mtime_ns
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB), data, sha256, store)
    assert path.stat().st_mtime_ns == before and hashed == []

    # Written since (same size, same bytes even): hashed again, found whole, vouched for anew.
    path.write_bytes(data)
    third = ShardCache(tmp_path, "team-a", 100 * MB)
    assert open_and_read(third, data, sha256, store) == data
    assert len(hashed) == 1 and third.stats()["hits"] == 1 and store.fetches == 1
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB), data, sha256, store)
    assert len(hashed) == 1, "the new record vouches for it"
    # A torn or missing record: hashed again, never trusted.
    (tmp_path / "team-a" / sha256[:2] / f"{sha256}.lock").write_bytes(b"verif")
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB), data, sha256, store)
    assert len(hashed) == 2 and store.fetches == 1
    # Where tenants share a Unix user (anyone could write a record) a record spares nothing.
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB, trust_records=False), data, sha256, store)
    assert len(hashed) == 3


def test_a_fetch_giving_the_wrong_bytes_is_retried_once_then_refused(tmp_path):
    data, sha256 = shard(3)
    wrong = b"not the shard"
    store = Store()
    cache_ = ShardCache(tmp_path, "team-a", 100 * MB)
    with pytest.raises(ShardCorrupt) as refused:
        cache_.open(sha256, len(data), store.fetcher(wrong))
    assert store.fetches == 2
    message = str(refused.value)
    assert sha256 in message and hashlib.sha256(wrong).hexdigest() in message
    assert isinstance(refused.value, ValueError)
    folder = tmp_path / "team-a" / sha256[:2]
    assert sorted(os.listdir(folder)) == [f"{sha256}.lock"], "no shard and no temporary file left"


def test_a_fetch_failing_half_way_leaves_nothing_under_the_shards_name(tmp_path):
    data, sha256 = shard(4, 10_000)
    cache_ = ShardCache(tmp_path, "team-a", 100 * MB)
    seen_temporary = []

    def fails_half_way(out):
        out.write(data[:5000])
        folder = tmp_path / "team-a" / sha256[:2]
        seen_temporary.extend(n for n in os.listdir(folder) if n.startswith(".fill-"))
        raise ConnectionError("store went away")

    with pytest.raises(ConnectionError):
        cache_.open(sha256, len(data), fails_half_way)
    assert len(seen_temporary) == 1, "the bytes went to a temporary file"
    folder = tmp_path / "team-a" / sha256[:2]
    assert sorted(os.listdir(folder)) == [f"{sha256}.lock"]
    # The next open fetches it whole.
    assert open_and_read(cache_, data, sha256, Store()) == data


def test_over_budget_the_least_recently_used_shards_go(tmp_path):
    shards = [shard(i, MB) for i in range(5)]
    store = Store()
    cache_ = ShardCache(tmp_path, "team-a", 3 * MB)
    for data, sha256 in shards[:3]:
        open_and_read(cache_, data, sha256, store)
    open_and_read(cache_, *shards[0], store)  # used again: now more recent than 1 and 2
    for data, sha256 in shards[3:]:
        open_and_read(cache_, data, sha256, store)
    held = cache.inventory(tmp_path)["team-a"]
    assert sum(held.values()) <= 3 * MB
    assert set(held) == {shards[0][1], shards[3][1], shards[4][1]}
    assert cache_.stats()["evicted"] == 2 and cache_.stats()["over_budget"] == 0


def test_a_root_the_replica_cannot_list_still_keeps_its_own_namespace_within_budget(tmp_path, monkeypatch):
    """The local executor makes the cache root 0711 (its names are the tenants' ids): a replica
    enters its own namespace but cannot list the root. Its budget still counts and evicts there."""
    shards = [shard(20 + i, MB) for i in range(4)]
    store = Store()
    cache_ = ShardCache(tmp_path, "team-a", 2 * MB)
    listdir = os.listdir

    def unlistable_root(folder):
        if os.fspath(folder) == os.fspath(tmp_path):
            raise PermissionError(13, "Permission denied", os.fspath(folder))
        return listdir(folder)

    monkeypatch.setattr(cache.os, "listdir", unlistable_root)
    for data, sha256 in shards:
        open_and_read(cache_, data, sha256, store)
    assert cache_.stats()["evicted"] == 2
    monkeypatch.setattr(cache.os, "listdir", listdir)
    assert set(cache.inventory(tmp_path)["team-a"]) == {shards[2][1], shards[3][1]}


def test_a_shard_held_open_is_not_evicted_until_it_is_closed(tmp_path):
    (a, sha_a), (b, sha_b), (c, sha_c) = shard(10, MB), shard(11, MB), shard(12, MB)
    store = Store()
    cache_ = ShardCache(tmp_path, "team-a", 1_500_000)
    file_a = cache_.open(sha_a, MB, store.fetcher(a))
    file_b = cache_.open(sha_b, MB, store.fetcher(b))
    assert set(cache.inventory(tmp_path)["team-a"]) == {sha_a, sha_b}, "both in use: kept over budget"
    assert cache_.stats()["over_budget"] == 1 and cache_.stats()["evicted"] == 0
    assert file_a.read() == a

    file_a.close()
    file_c = cache_.open(sha_c, MB, store.fetcher(c))
    assert set(cache.inventory(tmp_path)["team-a"]) == {sha_b, sha_c}
    assert cache_.stats()["evicted"] == 1
    assert cache_.stats()["over_budget"] == 2, "b and c are in use: still over"
    assert file_b.read() == b and file_c.read() == c
    file_b.close()
    file_c.close()


def test_a_shard_another_job_holds_open_from_the_cache_is_not_evicted(tmp_path):
    (a, sha_a), (b, sha_b), (c, sha_c) = shard(13, MB), shard(14, MB), shard(15, MB)
    store = Store()
    open_and_read(ShardCache(tmp_path, "team-a", 2 * MB), a, sha_a, store)
    reader = ShardCache(tmp_path, "team-a", 2 * MB)
    held_a = reader.open(sha_a, MB, store.fetcher(a))  # a hit, kept open (the epoch's shard)
    filler = ShardCache(tmp_path, "team-a", 2 * MB)
    open_and_read(filler, b, sha_b, store)
    open_and_read(filler, c, sha_c, store)
    assert set(cache.inventory(tmp_path)["team-a"]) == {sha_a, sha_c}, "a is the oldest, but in use: b goes"
    assert held_a.read() == a
    held_a.close()


def test_the_node_budget_evicts_other_tenants_shards_and_a_tenant_budget_only_its_own(tmp_path):
    (x, sha_x), (y, sha_y), (z, sha_z) = shard(20, MB), shard(21, MB), shard(22, MB)
    store = Store()
    team_b = ShardCache(tmp_path, "team-b", 2 * MB)
    open_and_read(team_b, x, sha_x, store)
    team_a = ShardCache(tmp_path, "team-a", 2 * MB)
    open_and_read(team_a, y, sha_y, store)
    open_and_read(team_a, z, sha_z, store)
    assert cache.inventory(tmp_path) == {"team-a": {sha_y: MB, sha_z: MB}}, "the budget is the node's"

    capped = ShardCache(tmp_path, "team-c", 100 * MB, namespace_budget_bytes=MB)
    open_and_read(capped, x, sha_x, store)
    open_and_read(capped, y, sha_y, store)
    held = cache.inventory(tmp_path)
    assert held["team-c"] == {sha_y: MB}
    assert held["team-a"] == {sha_y: MB, sha_z: MB}, "another tenant's shards are not its budget's"


def test_tenants_never_share_cached_files(tmp_path):
    data, sha256 = shard(30)
    store = Store()
    open_and_read(ShardCache(tmp_path, "team-a", 100 * MB), data, sha256, store)
    open_and_read(ShardCache(tmp_path, "team-b", 100 * MB), data, sha256, store)
    assert store.fetches == 2, "team-b does not read team-a's copy"
    for namespace in ("team-a", "team-b"):
        assert (tmp_path / namespace / sha256[:2] / sha256).read_bytes() == data
        assert stat.S_IMODE(os.stat(tmp_path / namespace).st_mode) == 0o700
    assert cache.inventory(tmp_path) == {"team-a": {sha256: 1000}, "team-b": {sha256: 1000}}


@pytest.mark.parametrize("namespace", ["../x", "A", "", "-x", "a/b", "a" * 64, ".."])
def test_a_namespace_that_is_not_a_tenant_name_is_refused(tmp_path, namespace):
    with pytest.raises(ValueError):
        ShardCache(tmp_path, namespace, MB)
    assert os.listdir(tmp_path) == []


def test_a_sha256_that_is_not_hex_is_refused(tmp_path):
    cache_ = ShardCache(tmp_path, "team-a", MB)
    for bad in ("../../etc/passwd", "AB" * 32, "ab" * 31):
        with pytest.raises(ValueError):
            cache_.open(bad, 1, Store().fetcher(b"x"))


def _fill_in_a_process(root, sha256, data, fetch_log, start):
    """A job's process: waits for the other, then opens the shard with a slow fetch that logs
    itself. Exits 0 when it read the right bytes."""
    def slow_fetch(out):
        with open(fetch_log, "a") as log:
            log.write("fetch\n")
        out.write(data[:len(data) // 2])
        time.sleep(0.5)
        out.write(data[len(data) // 2:])

    cache_ = ShardCache(root, "team-a", 100 * MB)
    start.wait()
    with cache_.open(sha256, len(data), slow_fetch) as file:
        os._exit(0 if file.read() == data else 1)


def test_two_processes_filling_one_shard_fetch_it_once(tmp_path):
    data, sha256 = shard(40, 100_000)
    fetch_log = tmp_path / "fetches.log"
    context = multiprocessing.get_context("fork")
    start = context.Barrier(2)
    processes = [context.Process(target=_fill_in_a_process, args=(tmp_path / "cache", sha256, data, fetch_log, start))
                 for _ in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=10)
    assert [p.exitcode for p in processes] == [0, 0], "both read the whole shard"
    assert fetch_log.read_text() == "fetch\n", "the second waited and found it cached"


def test_a_stale_fill_is_removed_and_others_fills_and_locks_are_left(tmp_path):
    data, sha256 = shard(50)
    cache_ = ShardCache(tmp_path, "team-a", 100 * MB)
    folder = tmp_path / "team-a" / sha256[:2]
    folder.mkdir()
    stale, running, lock = folder / ".fill-crashed", folder / ".fill-running", folder / f"{'ef' * 32}.lock"
    for path in (stale, running, lock):
        path.write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    os.utime(lock, (two_hours_ago, two_hours_ago))
    open_and_read(cache_, data, sha256, Store())
    assert not stale.exists()
    assert running.exists() and lock.exists()


def test_a_datasets_indexes_are_fetched_once_per_node_and_named_safely(tmp_path):
    content = hashlib.sha256(b"a manifest").hexdigest()
    fetched = []

    def fetch():
        fetched.append(1)
        return b'{"offsets": []}'

    assert ShardCache(tmp_path, "team-a", MB).index(content, "data-000000.idx.json", fetch) == b'{"offsets": []}'
    assert ShardCache(tmp_path, "team-a", MB).index(content, "data-000000.idx.json", fetch) == b'{"offsets": []}'
    assert len(fetched) == 1, "the next process reads it from the node"
    kept = tmp_path / "team-a" / "indexes" / content / "data-000000.idx.json"
    kept.write_bytes(b'{"offs')  # torn
    assert ShardCache(tmp_path, "team-a", MB).index(content, "data-000000.idx.json", fetch) == b'{"offsets": []}'
    assert len(fetched) == 2 and kept.read_bytes() == b'{"offsets": []}', "a torn index is fetched again"
    ShardCache(tmp_path, "team-b", MB).index(content, "data-000000.idx.json", fetch)
    assert len(fetched) == 3, "tenants never share cached files"
    assert cache.inventory(tmp_path) == {}, "indexes are not shards"
    for name in ("../x", "", "a/b", ".."):
        with pytest.raises(ValueError):
            ShardCache(tmp_path, "team-a", MB).index(content, name, fetch)
    with pytest.raises(ValueError):
        ShardCache(tmp_path, "team-a", MB).index("../" + content[3:], "i.json", fetch)


def test_indexes_count_against_the_budget_and_the_least_recently_used_goes_first(tmp_path):
    content = hashlib.sha256(b"a manifest").hexdigest()
    index = b'{"offsets": "' + b"7" * 600_000 + b'"}'
    fetched = []

    def fetch():
        fetched.append(1)
        return index

    store = Store()
    (s1, sha1), (s2, sha2), (s3, sha3) = shard(1, MB), shard(2, MB), shard(3, MB)
    cache_ = ShardCache(tmp_path, "team-a", 2_500_000)
    cache_.index(content, "data.idx.json", fetch)
    open_and_read(cache_, s1, sha1, store)
    time.sleep(0.01)
    cache_.index(content, "data.idx.json", fetch)  # used again: now more recent than shard 1
    open_and_read(cache_, s2, sha2, store)  # 2.6 MB: shard 1 goes, not the index used since
    kept = tmp_path / "team-a" / "indexes" / content / "data.idx.json"
    assert kept.exists() and set(cache.inventory(tmp_path)["team-a"]) == {sha2}
    assert len(fetched) == 1
    open_and_read(cache_, s3, sha3, store)  # 2.6 MB again: the index is the oldest now
    assert not kept.exists(), "an index is evicted like a shard"
    assert set(cache.inventory(tmp_path)["team-a"]) == {sha2, sha3}
    assert cache_.stats()["evicted"] == 2
    assert ShardCache(tmp_path, "team-a", 2_500_000).index(content, "data.idx.json", fetch) == index
    assert len(fetched) == 2, "an evicted index is fetched again"
    total = sum(f.stat().st_size for f in (tmp_path / "team-a").rglob("*") if f.is_file())
    assert total <= 2_500_000 + 1_000, "the index's fill kept the budget too (lock files are empty)"
