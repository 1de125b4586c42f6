"""The node-local shard cache: every job on a node reads a dataset's shards through one cache
folder on local SSD, so the first job on a dataset fetches its shards from the object store and
the next job on the same dataset reads 0 bytes from it (issue 23). This module is the cache only;
where the bytes come from is the `fetch` callable passed to `ShardCache.open`.

Layout. A shard is stored by content, under its hex SHA-256 (the dataset manifest's):
`<root>/<namespace>/<sha[:2]>/<sha>`, with an empty `<sha>.lock` beside it (the fill lock, kept)
and, while a fill runs, a `.fill-*` temporary file. `namespace` is the tenant's id. Tenants
never share cached files, even for the same shard: one tenant cannot read another's data through
the cache, nor plant a file another tenant would trust. The namespace folder is made with mode
0o700 and must belong to the process's user: jobs of different tenants run as different Unix
users on the local executor, so file permissions enforce the separation.

Fills are atomic. The bytes go to a temporary file in the shard's folder, hashed as they are
written, fsynced, checked against the expected SHA-256 and size, and only then renamed into
place: a crash or an exception mid-fill never leaves a partial file under the final name. A
fetch that gives the wrong bytes is tried once more, then `ShardCorrupt`. Concurrent fills of
one shard on the node take turns on an exclusive `flock` of its lock file: the second finds the
shard cached when its turn comes.

Verification. A cached file can rot or be damaged on disk. A shard is hashed when it is filled
and whenever it may have changed since: its lock file records the file it vouches for (inode,
size and modification time, `verified <ino> <size> <mtime_ns>`) when a fill or a check found
the right bytes, and an open that finds the file as recorded trusts it without reading it.
Records are trusted only where the namespace is the tenant's alone (`trust_records`: the
executor says so, TRAINYARD_CACHE_PRIVATE=1; where tenants share a Unix user, one could forge
another's record, so every process hashes as before). Anything else (a file written since, a
record missing or torn) is hashed again under the lock;
a mismatch deletes it and fetches it again (`refetched`). Re-hashing every cached shard in every
new process made a warm job's start read its whole dataset once more (docs/PERFORMANCE.md,
"Datasets from the object store"). What this does not see is damage that keeps the file's
modification time (bit rot on the disk itself); the file system's own checksums, where it has
them, do. Later opens by the same instance trust what it checked.

In use, never evicted. A file `open` returns holds a shared `flock` for as long as the caller
keeps it open; eviction takes an exclusive non-blocking `flock` and skips a shard it cannot
lock. The engine (remote.py) keeps every shard of its dataset open for the whole run, so none is
evicted under it.

Budgets. After each fill, if the cached shards under `<root>` (all namespaces: the budget is the
node's) take more than `budget_bytes`, the least recently used shards (by access time, which
every open sets; the modification time is left as the fill wrote it) that are not in use are deleted until the cache is within budget. An optional
`namespace_budget_bytes` bounds one tenant's share the same way, evicting only its own shards.
When everything left is in use the cache stays over budget and counts `over_budget`. A process
sees (and evicts) only the namespaces its user can read: with one Unix user per tenant, a
tenant's process holds the node budget by its own shards only, and the node-wide budget is
enforced in full by a process that can read every namespace: on the local executor the server,
after each attempt ends, with this module's rules (crates/executor/src/local/cache_sweep.rs).
Eviction leaves other fills'
`.lock` and `.fill-*` files alone, except `.fill-*` files untouched for an hour (a crashed
fill's leftovers: a running fill writes to its file, which moves its mtime).

Indexes. A dataset's index files are kept beside its shards, by the dataset's content hash
(`<namespace>/indexes/<content hash>/<name>`, see `ShardCache.index`). They count against the
same budgets and are evicted by the same least-recently-used rule; an index is read whole when
used, never held, so evicting one costs at most its fetch again.
"""
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import stat
import tempfile
import time

NAMESPACE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# A `.fill-*` file untouched this long belongs to a fill that crashed.
STALE_FILL_SECONDS = 3600
FILL_PREFIX = ".fill-"
# The folder of a namespace that holds dataset indexes (shards are in folders named by two hex
# digits, so it cannot be mistaken for one).
INDEXES = "indexes"
READ_CHUNK = 1 << 20


class ShardCorrupt(ValueError):
    """A shard's bytes do not match the SHA-256 (or size) the manifest gives, fetched twice."""

    def __init__(self, namespace, sha256, actual_sha256, size, actual_size):
        super().__init__(f"shard {sha256} (namespace {namespace}) fetched twice with the wrong content: "
                         f"expected sha256 {sha256} and {size} bytes, got sha256 {actual_sha256} and "
                         f"{actual_size} bytes")
        self.sha256, self.actual_sha256 = sha256, actual_sha256
        self.size, self.actual_size = size, actual_size


def check_namespace(namespace):
    """Refuses a namespace that is not a tenant name: it becomes a folder name, so nothing that
    could climb out of the cache ("..", "/") or differ only by case."""
    if not isinstance(namespace, str) or not NAMESPACE.fullmatch(namespace):
        raise ValueError(f"cache namespace {namespace!r} is not a tenant name ([a-z0-9][a-z0-9-]{{0,62}})")


def check_sha256(sha256):
    """Refuses anything but 64 lowercase hex digits: the shard's file name is made from it."""
    if not isinstance(sha256, str) or not SHA256.fullmatch(sha256):
        raise ValueError(f"shard sha256 {sha256!r} is not 64 lowercase hex digits")


def shard_path(root, namespace, sha256):
    """Where a shard is cached: `<root>/<namespace>/<sha[:2]>/<sha>`."""
    return os.path.join(root, namespace, sha256[:2], sha256)


def lock_path(path):
    """The fill lock of the shard cached at `path`."""
    return path + ".lock"


def cached_files(root, known=()):
    """What the cache under `root` holds, in the namespaces this process can read, `known`
    namespaces among them where `root` cannot be listed (the local executor lets no replica list
    it: its names are the tenants'): (entries, stale_fills). Entries are the cached shards and indexes, each as (used_ns, size,
    namespace, sha256, path): used_ns the last use (the file's access time), sha256 the shard's
    (None for an index). stale_fills are the paths of `.fill-*` files untouched for
    STALE_FILL_SECONDS."""
    entries, stale_fills = [], []
    stale_before = time.time_ns() - STALE_FILL_SECONDS * 1_000_000_000

    def look_in(folder, namespace, kind_of):
        for name in _listdir(folder):
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue  # evicted or renamed meanwhile
            if not stat.S_ISREG(info.st_mode):
                continue
            if name.startswith(FILL_PREFIX):
                if info.st_mtime_ns < stale_before:
                    stale_fills.append(path)
            elif (kind := kind_of(name)) is not False:
                entries.append((info.st_atime_ns, info.st_size, namespace, kind, path))

    for namespace in sorted(set(_listdir(root)) | set(known)):
        if not NAMESPACE.fullmatch(namespace):
            continue
        for prefix in _listdir(os.path.join(root, namespace)):
            folder = os.path.join(root, namespace, prefix)
            if prefix == INDEXES:
                for content in _listdir(folder):
                    if SHA256.fullmatch(content):
                        look_in(os.path.join(folder, content), namespace, _index_kind)
            else:
                look_in(folder, namespace, lambda name, prefix=prefix: _shard_kind(name, prefix))
    return entries, stale_fills


def _shard_kind(name, prefix):
    """A shard's file name is its sha256, in the folder of its first two digits; the lock and
    anything else is not an entry (False)."""
    return name if SHA256.fullmatch(name) and name[:2] == prefix else False


def _index_kind(name):
    """Every plain file in an index folder is an index (None: no shard sha256)."""
    return None


def inventory(root):
    """{namespace: {sha256: size}}: the shards the node's cache holds (those this process can
    see), for reporting to the scheduler. Namespaces holding no shard are left out."""
    held = {}
    for _used, size, namespace, sha256, _path in cached_files(root)[0]:
        if sha256 is not None:  # an index is no shard
            held.setdefault(namespace, {})[sha256] = size
    return held


class ShardCache:
    """One tenant's view of the node's shard cache under `root` (the module's rules). Make one per
    process: it remembers which shards it has verified. `budget_bytes` bounds the whole cache,
    `namespace_budget_bytes` (None: no bound) this tenant's part."""

    def __init__(self, root, namespace, budget_bytes, namespace_budget_bytes=None, trust_records=True):
        check_namespace(namespace)
        self.root, self.namespace = os.fspath(root), namespace
        self.budget_bytes, self.namespace_budget_bytes = budget_bytes, namespace_budget_bytes
        # Only where no other tenant can write this namespace (the executor says so) may a
        # verification record spare a hash: otherwise anyone could write one.
        self.trust_records = trust_records
        self._verified = set()
        self._stats = {"hits": 0, "misses": 0, "bytes_fetched": 0, "refetched": 0, "evicted": 0, "over_budget": 0}
        os.makedirs(self.root, exist_ok=True)
        _make_private_folder(os.path.join(self.root, namespace))

    def stats(self):
        """This instance's counts: hits (opens served from the cache), misses (opens that fetched),
        bytes_fetched, refetched (cached files found damaged and fetched again), evicted (shards it
        deleted for the budgets), over_budget (fills after which the cache stayed over a budget
        because the rest was in use)."""
        return dict(self._stats)

    def open(self, sha256, size, fetch):
        """The shard `sha256` of `size` bytes as a binary file open for reading, fetched first if
        the cache does not hold it: `fetch(out)` writes the shard's bytes to the binary file
        `out`. The shard is not evicted while the returned file is open. Raises `ShardCorrupt`
        when two fetches give the wrong bytes; an exception from `fetch` leaves nothing behind."""
        check_sha256(sha256)
        path = shard_path(self.root, self.namespace, sha256)
        file = _open_held(path)
        if file is not None:
            if sha256 in self._verified or (self.trust_records and _vouched_for(path, file.fileno(), size)):
                _touch(file.fileno())
                self._verified.add(sha256)
                self._stats["hits"] += 1
                return file
            file.close()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # Under the shard's lock: another process may be filling it, or may be about to replace
        # a file this one finds damaged.
        with _locked(lock_path(path)) as lock_fd:
            file = _open_held(path)
            if file is not None and _has_content(file.fileno(), sha256, size):
                _vouch(lock_fd, file.fileno())
                _touch(file.fileno())
                self._verified.add(sha256)
                self._stats["hits"] += 1
                return file
            if file is not None:
                file.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._stats["refetched"] += 1
            else:
                self._stats["misses"] += 1
            file = self._fill(path, sha256, size, fetch)
            _vouch(lock_fd, file.fileno())
        self._verified.add(sha256)
        try:
            self._enforce_budgets()
        except BaseException:
            file.close()
            raise
        return file

    def index(self, content_sha256, name, fetch):
        """The bytes of index file `name` of the dataset whose manifest has the content hash
        `content_sha256` (hex), from `<namespace>/indexes/<content hash>/<name>`, or `fetch()`ed
        and kept there (written to a temporary file, then renamed). A registered dataset version
        cannot change, its indexes included, so its content hash and the index's name identify
        them. Indexes count against the budgets and are evicted like shards (the module's
        "Indexes")."""
        check_sha256(content_sha256)
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"index name {name!r} is not a plain file name")
        folder = os.path.join(self.root, self.namespace, "indexes", content_sha256)
        path = os.path.join(folder, name)
        with contextlib.suppress(FileNotFoundError):
            with open(path, "rb") as cached:
                data = cached.read()
                if _is_json(data):
                    _touch(cached.fileno())  # used now: the last to be evicted
                    return data
            # Torn or damaged (an index is JSON): fetched again below, replacing it.
        data = fetch()
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=FILL_PREFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
            _fsync_folder(folder)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        self._enforce_budgets()
        return data

    def _fill(self, path, sha256, size, fetch):
        """Fetches the shard into place (the caller holds its lock) and returns it open and held;
        a second fetch when the first gives the wrong bytes."""
        for _attempt in range(2):
            file, actual_sha256, actual_size = self._fetch_once(path, sha256, size, fetch)
            if file is not None:
                return file
        raise ShardCorrupt(self.namespace, sha256, actual_sha256, size, actual_size)

    def _fetch_once(self, path, sha256, size, fetch):
        """One fetch into a temporary file beside `path`, renamed to `path` if its bytes are the
        shard's: (the file open and held, or None, and the fetched bytes' sha256 and size). The
        temporary file is gone whatever happens."""
        folder = os.path.dirname(path)
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=FILL_PREFIX)
        try:
            with os.fdopen(fd, "wb") as out:
                writer = _HashingWriter(out)
                try:
                    fetch(writer)
                finally:
                    self._stats["bytes_fetched"] += writer.size  # read from the store, kept or not
                out.flush()
                os.fsync(out.fileno())
            actual_sha256 = writer.hash.hexdigest()
            if actual_sha256 != sha256 or writer.size != size:
                return None, actual_sha256, writer.size
            # Opened, held and stamped before the rename: from the moment it has its name it is
            # in use, so the budget pass that follows cannot evict it.
            file = open(temporary, "rb")
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_SH)
                _touch(file.fileno())
                os.replace(temporary, path)
                _fsync_folder(folder)
            except BaseException:
                file.close()
                raise
            return file, actual_sha256, writer.size
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def _enforce_budgets(self):
        """Evicts the least recently used shards not in use until this tenant's part and the
        whole cache are within their budgets, and removes stale fills. Counts `over_budget` when
        what is left over budget is all in use."""
        shards, stale_fills = cached_files(self.root, known=(self.namespace,))
        for stale in stale_fills:
            with contextlib.suppress(FileNotFoundError, PermissionError):
                os.unlink(stale)
        shards.sort()  # least recently used first
        evicted = set()
        over = False
        if self.namespace_budget_bytes is not None:
            own = [s for s in shards if s[2] == self.namespace]
            over |= self._evict_to(own, self.namespace_budget_bytes, evicted)
        remaining = [s for s in shards if s[4] not in evicted]
        over |= self._evict_to(remaining, self.budget_bytes, evicted)
        if over:
            self._stats["over_budget"] += 1

    def _evict_to(self, shards, budget, evicted):
        """Evicts from `shards` (oldest first) until their total is within `budget`, adding the
        paths no longer cached to `evicted`; True if still over budget."""
        total = sum(s[1] for s in shards)
        for _used, size, _namespace, _sha256, path in shards:
            if total <= budget:
                break
            outcome = _evict(path)
            if outcome != "kept":
                total -= size
                evicted.add(path)
            if outcome == "evicted":
                self._stats["evicted"] += 1
        return total > budget


class _HashingWriter(io.RawIOBase):
    """What `fetch` writes to: passes the bytes on to the file and hashes and counts them."""

    def __init__(self, out):
        super().__init__()
        self._out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self):
        return True

    def write(self, data):
        view = memoryview(data).cast("B")
        self._out.write(view)
        self.hash.update(view)
        self.size += len(view)
        return len(view)


def _evict(path):
    """Deletes the shard cached at `path` unless it is in use (a reader holds it) or being
    filled or checked (its lock is held): "evicted", "gone" (no longer there) or "kept"."""
    with contextlib.ExitStack() as stack:
        try:
            lock_fd = os.open(lock_path(path), os.O_RDONLY)
            stack.callback(os.close, lock_fd)
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except FileNotFoundError:
            pass  # no fill ever ran beside it; the shard's own lock below is enough
        except BlockingIOError:
            return "kept"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return "gone"
        stack.callback(os.close, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "kept"
        if not _is_named(fd, path):
            return "kept"  # replaced since it was listed: that file is someone's new fill
        os.unlink(path)
        return "evicted"


def _open_held(path):
    """The file cached at `path`, open for reading and held with a shared lock, or None when
    there is none. An eviction may delete the file while this waits for the lock, so the name is
    checked to still point at the file opened."""
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_SH)
        if _is_named(file.fileno(), path):
            return file
    except BaseException:
        file.close()
        raise
    file.close()
    return None


def _is_named(fd, path):
    """Whether `path` names the file open as `fd`."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _has_content(fd, sha256, size):
    """Whether the file open as `fd` holds `size` bytes hashing to `sha256`. Reads with pread:
    the file's position stays at its start for the caller."""
    if os.fstat(fd).st_size != size:
        return False
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, READ_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest() == sha256


def _touch(fd):
    """Marks the file open as `fd` as used now, for least-recently-used eviction: its access
    time, set from the clock in nanoseconds rather than left to the file system, whose
    timestamps can be a few milliseconds coarse (opens in quick succession still keep their
    order). The modification time stays the fill's: the verification record names it."""
    now = time.time_ns()
    os.utime(fd, ns=(now, os.fstat(fd).st_mtime_ns))


def _identity(fd):
    """What the verification record says of the file open as `fd`."""
    info = os.fstat(fd)
    return f"verified {info.st_ino} {info.st_size} {info.st_mtime_ns}\n".encode()


def _vouch(lock_fd, fd):
    """Records in the shard's lock file (open as `lock_fd`, held exclusively) that the file open
    as `fd` has been found to hold the right bytes."""
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, _identity(fd), 0)


def _vouched_for(path, fd, size):
    """Whether the lock file beside `path` vouches for the file open as `fd` (of `size` bytes) as
    it is now. A record being rewritten reads as torn, not as a match."""
    try:
        with open(lock_path(path), "rb") as lock:
            record = lock.read(128)
    except OSError:
        return False
    return os.fstat(fd).st_size == size and record == _identity(fd)


@contextlib.contextmanager
def _locked(path):
    """Holds an exclusive flock on the lock file `path` (made if absent, and kept: deleting a
    lock file another process is waiting on would let two fills run at once)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _make_private_folder(path):
    """Makes the namespace folder `path` with mode 0o700, or checks the one there is a folder of
    this process's user (setting its mode to 0o700). One made by another user is refused: that
    user could read or plant files in it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"cache namespace {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"cache namespace {path} belongs to user {info.st_uid}, not to this process's user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _is_json(data):
    """Whether `data` parses as JSON (what every index is)."""
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _fsync_folder(folder):
    """Makes a rename in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _listdir(folder):
    """The names in `folder`; none when it is gone or this process's user may not read it
    (another tenant's namespace)."""
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
