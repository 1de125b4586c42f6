"""Datasets on Trainyard's object store: `--data store:NAME@VERSION` (issue 23). The engine reads
a registered dataset version through the node-local shard cache (cache.py) and gives
`shards.ShardDataset` a folder it reads unchanged, as if the dataset had been packed there.

The server's contract. A dataset version's files are served at
`GET {TRAINYARD_URL}/api/v1/datasets/{NAME}/{VERSION}/files/{FILE}` with the job's token
(`Authorization: Bearer {TRAINYARD_TOKEN}`); FILE is `dataset.json` (the manifest) or a shard or
index name the manifest gives. 200 with the bytes; 404 when the dataset, the version or the file
is unknown; 401 or 403 when the token is refused. Connection errors and 5xx answers are tried
again after RETRY_DELAYS; the rest fail at once with a `DatasetError` naming dataset and file.

The view (`DatasetView`), a private temporary folder per process, removed by `close`:
- `dataset.json`: the manifest's bytes as served, so the run records the content hash a run on
  the packed folder records.
- each index the manifest names: copied into the folder from the node cache, where the first
  run on the node keeps it (`ShardCache.index`, by the manifest's content hash and the index's
  name: a registered version cannot change).
- each shard: a symbolic link to the shard's file in the cache, where it is filled from the
  server the first time the node needs it. A link copies nothing and follows the cache's one
  name for the content; a hard link would keep an evicted shard's bytes on disk without the
  cache counting them, and cannot reach the cache from another file system.

Held open. The view keeps every shard's cache file open, with the cache's shared lock, until
`close`: no shard the job reads can be evicted under it. For now that is the whole dataset for
the whole run, so a dataset larger than the cache budget keeps the cache over budget (cache.py
counts it) rather than fail. One file descriptor per shard: the soft limit on open files is
raised when the shards need it.

The cache, from the environment (`CacheSettings.from_env`):
- TRAINYARD_CACHE_DIR: the node's cache root, shared by every job and rank on the node. Unset:
  a cache inside the view, private to the process and removed with it (every run fetches
  everything).
- TRAINYARD_CACHE_NAMESPACE: the tenant's id, the cache's namespace; required with
  TRAINYARD_CACHE_DIR.
- TRAINYARD_CACHE_BUDGET_BYTES: the node's cache budget in bytes. Unset: no budget, the cache
  grows until its disk is full.
- TRAINYARD_CACHE_TENANT_BUDGET_BYTES: this tenant's share of the node's cache in bytes (its
  own least recently used shards not in use go first). Unset: no bound of its own.
- TRAINYARD_CACHE_PRIVATE: "1" when the executor keeps each tenant's namespace its own (a Unix
  user per tenant): a shard found whole by an earlier job is then not hashed again.
- TRAINYARD_DATASET_URL: the node's cache agent (Kubernetes: `trainyard cache-agent`, one per
  node, reached through a node-local Service). Files are read from it instead of the server, with
  the same paths and token; it keeps the node's copies and asks the server whether the job may
  read each file. Connection errors and 5xx from it send the reads to the server for
  AGENT_RETRY_AFTER seconds: a cache's failure never fails the run. The pod's own cache is then
  the view's private one (or TRAINYARD_CACHE_DIR's).

Ranks. Every rank on a node makes its own view over the same cache; two ranks filling one shard
take turns on its lock and the second finds it cached. Ranks start filling at different shards
(`local_rank` of `local_world` through the list) so that a node's first job fills in parallel.

Warm nodes. Once a view holds every shard, each replica's first process tells the server that
its node's cache holds the version (`POST {TRAINYARD_URL}/api/v1/jobs/{TRAINYARD_JOB_ID}/cached-datasets`
with `{"node": TRAINYARD_NODE, "name", "version", "bytes"}`), and the scheduler prefers this node
for the tenant's next jobs reading it. Only with a node cache (TRAINYARD_CACHE_DIR, or the agent
when every file came through it) and a node name (TRAINYARD_NODE); one try: a report that fails
costs a preference, never the run. Replicas sharing a node report the same thing; the server
keeps one entry.
"""
import http.client
import io
import json
import math
import os
import re
import resource
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import cache

STORE_PREFIX = "store:"
# The server's rule for a dataset's name and version (trainyard_core::names::DatasetRef).
DATASET_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Seconds before each new try of a request that met a connection error or a 5xx: five tries over
# 7.5 s, long enough for a server restart to pass.
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)
# Seconds one socket operation may wait (not a whole shard's download).
SOCKET_TIMEOUT = 60
# Seconds to connect to the node's cache agent (node-local: a healthy one answers at once), and
# before asking it again after it failed.
AGENT_CONNECT_TIMEOUT = 5
AGENT_RETRY_AFTER = 300.0
STREAM_CHUNK = 1 << 20
# Open files a process needs besides the shards: libraries, sockets, ShardDataset's own.
OTHER_OPEN_FILES = 1024
MANIFEST = "dataset.json"


class DatasetError(Exception):
    """A store dataset cannot be read, in one line the user can act on (train.py prints it)."""


class DatasetShardCorrupt(cache.ShardCorrupt, DatasetError):
    """A shard the server gave twice with bytes that do not match the manifest: cache.py's error
    with the dataset and the shard's name in its message."""

    def __init__(self, dataset, shard_name, corrupt):
        DatasetError.__init__(self, f"dataset {dataset}: shard {shard_name} came from the server twice with "
                                    f"the wrong content (sha256 {corrupt.actual_sha256}, {corrupt.actual_size} "
                                    f"bytes; the manifest says {corrupt.sha256}, {corrupt.size} bytes)")
        self.sha256, self.actual_sha256 = corrupt.sha256, corrupt.actual_sha256
        self.size, self.actual_size = corrupt.size, corrupt.actual_size


class Unavailable(Exception):
    """A request that may succeed if tried again: the connection failed or the server answered 5xx."""


class AgentUnavailable(Unavailable):
    """The node's cache agent could not be reached or answered 5xx: the server is asked instead."""


class DatasetRef:
    """A registered dataset version, `NAME@VERSION`."""

    def __init__(self, name, version):
        self.name, self.version = name, version

    def __str__(self):
        return f"{self.name}@{self.version}"


def store_dataset(data):
    """The dataset `--data` names when it is `store:NAME@VERSION`; None for a folder. Raises
    DatasetError for a `store:` that names no dataset version."""
    if not data.startswith(STORE_PREFIX):
        return None
    name, at, version = data[len(STORE_PREFIX):].partition("@")
    if not (at and DATASET_PART.fullmatch(name) and DATASET_PART.fullmatch(version)):
        raise DatasetError(f"--data {data!r} names no dataset version: write store:NAME@VERSION, NAME and VERSION "
                           f"1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return DatasetRef(name, version)


class DatasetFiles:
    """The files of one dataset version on the server, read with the job's token; through the
    node's cache agent when there is one (`agent_url`), from the server itself while the agent
    cannot be reached (it is a cache: its failure never fails the run)."""

    def __init__(self, base_url, token, dataset, retry_delays=RETRY_DELAYS, agent_url=None):
        self.base_url, self.dataset, self.retry_delays = base_url.rstrip("/"), dataset, retry_delays
        self.agent_url = agent_url.rstrip("/") if agent_url else None
        # True once a file came from the server instead of the agent: the node's cache may then
        # lack it.
        self.bypassed_agent = False
        self._agent_down_until = 0.0
        self._token = token
        self._opener = urllib.request.build_opener(TokenStaysHome)
        self._agent_opener = urllib.request.build_opener(TokenStaysHome, QuickConnectHandler)

    def _agent_now(self):
        return self.agent_url is not None and time.monotonic() >= self._agent_down_until

    def url(self, file, base=None):
        parts = (self.dataset.name, self.dataset.version, file)
        name, version, file = (urllib.parse.quote(part, safe="") for part in parts)
        return f"{base or self.base_url}/api/v1/datasets/{name}/{version}/files/{file}"

    def read(self, file):
        """The bytes of `file`, tried again on connection errors and 5xx."""
        def read_once():
            out = io.BytesIO()
            self.copy(file, out)
            return out.getvalue()
        return self.with_retries(file, read_once)

    def copy(self, file, out):
        """Writes the body of `file` to the binary file `out`, in one try: Unavailable when the
        connection fails before the end."""
        with self._open(file) as response:
            while True:
                try:
                    chunk = response.read(STREAM_CHUNK)
                except (OSError, http.client.HTTPException) as err:
                    raise Unavailable(f"the download broke off: {err!r}") from err
                if not chunk:
                    return
                out.write(chunk)

    def with_retries(self, file, action):
        """`action()`, tried again after each of `retry_delays` while it raises Unavailable. The
        cache agent failing is no try: the server is asked at once, and the agent again only
        after AGENT_RETRY_AFTER seconds."""
        delays = [*self.retry_delays, None]
        while True:
            try:
                return action()
            except AgentUnavailable as err:
                self._agent_down_until = time.monotonic() + AGENT_RETRY_AFTER
                print(f"data: the node's cache agent ({self.agent_url}) failed: {err}; reading {self.dataset} from "
                      f"the server for {AGENT_RETRY_AFTER:.0f} s", flush=True)
                continue
            except Unavailable as err:
                delay = delays.pop(0)
                if delay is None:
                    raise DatasetError(f"could not fetch {file} of dataset {self.dataset} from {self.base_url}: "
                                       f"{err} ({len(self.retry_delays) + 1} tries)") from err
                time.sleep(delay)

    def _open(self, file):
        through_agent = self._agent_now()
        if not through_agent:
            self.bypassed_agent = self.bypassed_agent or self.agent_url is not None
        base = self.agent_url if through_agent else self.base_url
        request = urllib.request.Request(self.url(file, base), headers={"Authorization": f"Bearer {self._token}"})
        opener = self._agent_opener if through_agent else self._opener
        try:
            return opener.open(request, timeout=SOCKET_TIMEOUT)
        except urllib.error.HTTPError as err:
            err.close()
            if through_agent and err.code >= 500:
                raise AgentUnavailable(f"HTTP {err.code} {err.reason}") from None
            if err.code in (401, 403):
                raise DatasetError(f"the job token was refused for dataset {self.dataset} "
                                   f"(HTTP {err.code} for {file})") from None
            if err.code == 404:
                unknown = " (is the version registered, and its files uploaded?)" if file == MANIFEST else ""
                raise DatasetError(f"dataset {self.dataset} has no file {file} on the server{unknown}") from None
            if err.code >= 500:
                raise Unavailable(f"HTTP {err.code} {err.reason}") from None
            raise DatasetError(f"the server refused {file} of dataset {self.dataset}: "
                               f"HTTP {err.code} {err.reason}") from None
        except (OSError, http.client.HTTPException) as err:  # URLError is an OSError
            if through_agent:
                raise AgentUnavailable(f"{getattr(err, 'reason', err)}") from err
            raise Unavailable(f"{getattr(err, 'reason', err)}") from err


class QuickConnect(http.client.HTTPConnection):
    """A connection that gives up connecting after AGENT_CONNECT_TIMEOUT seconds (a node whose
    agent is gone may drop the packets), then waits as long as any request for the answer (a
    fill on a cold node takes the agent a while before its first byte)."""

    def connect(self):
        timeout, self.timeout = self.timeout, AGENT_CONNECT_TIMEOUT
        try:
            super().connect()
        finally:
            self.timeout = timeout
        self.sock.settimeout(timeout)


class QuickConnectHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(QuickConnect, req)


class TokenStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows a redirect without the job token when it leads to another host (a presigned
    object-store URL, say): the token is for Trainyard only."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl)[:2] != urllib.parse.urlsplit(req.full_url)[:2]:
            new.remove_header("Authorization")
        return new


def manifest_shards(dataset, raw):
    """The shards of the manifest `raw` (dataset.json's bytes) as (name, index name or None,
    sha256, bytes), checked: their names become file names in the view."""
    try:
        entries = json.loads(raw)["shards"]
        shards = [(e["name"], e.get("index"), e["sha256"], e["bytes"]) for e in entries]
    except (ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"dataset {dataset}: {MANIFEST} from the server is not a shard manifest: {err!r}") from None
    names = set()
    for name, index, sha256, size in shards:
        for file in (name, index) if index is not None else (name,):
            if not isinstance(file, str) or file in ("", ".", "..", MANIFEST) or "/" in file or "\0" in file:
                raise DatasetError(f"dataset {dataset}: the manifest names a file {file!r}, not a plain file name")
            if file in names:
                raise DatasetError(f"dataset {dataset}: the manifest names the file {file} twice")
            names.add(file)
        if not (isinstance(sha256, str) and cache.SHA256.fullmatch(sha256)) or not isinstance(size, int):
            raise DatasetError(f"dataset {dataset}: shard {name} has no sha256 (64 hex digits) and size in bytes")
    return shards


class CacheSettings:
    """Where the view caches shards: `root` (None: a cache private to the view), the tenant's
    `namespace`, the node's `budget_bytes` (math.inf: none)."""

    def __init__(self, root, namespace, budget_bytes=math.inf, private=False, tenant_budget_bytes=None):
        self.root, self.namespace, self.budget_bytes = root, namespace, budget_bytes
        # This tenant's share of the node's cache (None: no bound of its own).
        self.tenant_budget_bytes = tenant_budget_bytes
        # The namespace is the tenant's alone (TRAINYARD_CACHE_PRIVATE=1): verification records
        # may be trusted (cache.py, "Verification").
        self.private = private

    @classmethod
    def from_env(cls, environ=os.environ):
        """The settings TRAINYARD_CACHE_DIR, TRAINYARD_CACHE_NAMESPACE,
        TRAINYARD_CACHE_BUDGET_BYTES and TRAINYARD_CACHE_PRIVATE give (the module's rules)."""
        root = environ.get("TRAINYARD_CACHE_DIR") or None
        namespace = environ.get("TRAINYARD_CACHE_NAMESPACE") or None
        if root is not None and namespace is None:
            raise DatasetError("TRAINYARD_CACHE_DIR is set but TRAINYARD_CACHE_NAMESPACE (the tenant's id) is not")
        budgets = []
        for name in ("TRAINYARD_CACHE_BUDGET_BYTES", "TRAINYARD_CACHE_TENANT_BUDGET_BYTES"):
            budget = environ.get(name, "").strip()
            if budget and not budget.isdigit():
                raise DatasetError(f"{name}={budget!r} is not a number of bytes")
            budgets.append(int(budget) if budget else None)
        private = environ.get("TRAINYARD_CACHE_PRIVATE") == "1"
        node_budget = math.inf if budgets[0] is None else budgets[0]
        return cls(root, namespace or "job", node_budget, private, budgets[1])


class DatasetView:
    """A folder `shards.ShardDataset` reads (`folder`) holding the store dataset of `files`, its
    shards in the cache `settings` name and held open until `close` (the module's rules). Counts
    what the cache did (`counts`)."""

    def __init__(self, files, settings, local_rank=0, local_world=1):
        self.dataset = files.dataset
        self.folder = tempfile.mkdtemp(prefix="trainyard-dataset-")
        self._handles = []
        # Bytes of the shards it holds: all of the dataset's once built.
        self.shard_bytes = 0
        try:
            self._cache = self._make_cache(settings)
            raw = files.read(MANIFEST)
            shards = manifest_shards(self.dataset, raw)
            allow_open_files(len(shards), self.dataset)
            with open(os.path.join(self.folder, MANIFEST), "wb") as f:
                f.write(raw)
            content = _content_hex(raw)
            first = len(shards) * local_rank // max(1, local_world)
            for name, index, sha256, size in shards[first:] + shards[:first]:
                self._handles.append(self._open_shard(files, name, sha256, size))
                self.shard_bytes += size
                os.symlink(cache.shard_path(self._cache.root, self._cache.namespace, sha256),
                           os.path.join(self.folder, name))
                if index is not None:
                    with open(os.path.join(self.folder, index), "wb") as f:
                        f.write(self._index(files, content, index))
        except BaseException:
            self.close()
            raise

    def _make_cache(self, settings):
        root, private = settings.root, settings.private
        if root is None:
            root, private = os.path.join(self.folder, "cache"), True
        try:
            return cache.ShardCache(os.path.abspath(root), settings.namespace, settings.budget_bytes,
                                    settings.tenant_budget_bytes, trust_records=private)
        except (ValueError, OSError) as err:
            raise DatasetError(f"dataset {self.dataset}: cannot use the shard cache at {root}: {err}") from None

    def _index(self, files, content, index):
        """The bytes of `index`: from the node cache when the manifest gives its content hash."""
        if content is None:
            return files.read(index)
        try:
            return self._cache.index(content, index, lambda: files.read(index))
        except (ValueError, OSError) as err:
            raise DatasetError(f"dataset {self.dataset}: cannot cache index {index} in {self._cache.root}: "
                               f"{err}") from None

    def _open_shard(self, files, name, sha256, size):
        """The shard's cache file, open and held, fetched from the server if the cache lacks it
        (or holds it damaged)."""
        def open_once():
            return self._cache.open(sha256, size, lambda out: files.copy(name, out))
        try:
            return files.with_retries(name, open_once)
        except cache.ShardCorrupt as err:
            raise DatasetShardCorrupt(self.dataset, name, err) from None
        except OSError as err:  # the cache's disk: full, or not writable
            raise DatasetError(f"dataset {self.dataset}: cannot cache shard {name} in {self._cache.root}: "
                               f"{err}") from None

    def counts(self):
        """What the cache did for this view, as metrics: `data/cache_hits` (shards found cached),
        `data/cache_misses` (shards fetched: absent, or damaged and fetched again, the latter
        also counted as `data/cache_refetched`) and `data/bytes_fetched` (shard bytes read from
        the server)."""
        stats = self._cache.stats()
        return {"data/cache_hits": stats["hits"], "data/cache_misses": stats["misses"] + stats["refetched"],
                "data/cache_refetched": stats["refetched"], "data/bytes_fetched": stats["bytes_fetched"]}

    def close(self):
        """Lets the shards go (the cache may evict them again) and removes the folder (and a
        cache private to it). Safe to call twice."""
        for handle in self._handles:
            handle.close()
        self._handles = []
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def _content_hex(raw):
    """The hex digits of the manifest's content hash (`sha256:<hex>`), or None."""
    try:
        content = json.loads(raw).get("content_hash", "")
    except (ValueError, AttributeError):
        return None
    hex_digits = content[len("sha256:"):] if isinstance(content, str) and content.startswith("sha256:") else ""
    return hex_digits if cache.SHA256.fullmatch(hex_digits) else None


def allow_open_files(shards, dataset):
    """Raises this process's soft limit on open files so that it can hold `shards` open besides
    what it needs otherwise; DatasetError when the hard limit does not allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = shards + OTHER_OPEN_FILES
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise DatasetError(f"dataset {dataset} has {shards} shards, held open for the run: that needs {needed} "
                           f"open files, over this process's limit of {hard} (ulimit -n)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def dataset_view(dataset, local_rank=0, local_world=1, environ=os.environ):
    """The view of the store dataset `dataset` (a DatasetRef) for this process, from the server
    and cache its environment names (TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_CACHE_*)."""
    url, token = environ.get("TRAINYARD_URL"), environ.get("TRAINYARD_TOKEN")
    if not (url and token):
        raise DatasetError(f"dataset {dataset} is read from Trainyard, which needs TRAINYARD_URL and "
                           f"TRAINYARD_TOKEN (Trainyard sets them for its jobs)")
    settings = CacheSettings.from_env(environ)
    files = DatasetFiles(url, token, dataset, agent_url=environ.get("TRAINYARD_DATASET_URL") or None)
    view = DatasetView(files, settings, local_rank, local_world)
    # A dataset larger than the budget does not stay cached after the run: no report of it. Nor
    # one read past the agent: the node's cache may lack some of it.
    budget = min(settings.budget_bytes, settings.tenant_budget_bytes or math.inf)
    node_cache = settings.root is not None or (files.agent_url is not None and not files.bypassed_agent)
    if local_rank == 0 and node_cache and view.shard_bytes <= budget:
        report_cached(url, token, environ, dataset, view.shard_bytes)
    return view


def report_cached(url, token, environ, dataset, shard_bytes):
    """Tells the server that this node's cache holds every shard of `dataset` (the module's
    rules). True when the server took it; a failure is printed and returns False."""
    node, job = environ.get("TRAINYARD_NODE"), environ.get("TRAINYARD_JOB_ID")
    if not (node and job):
        return False
    body = json.dumps({"node": node, "name": dataset.name, "version": dataset.version, "bytes": shard_bytes})
    request = urllib.request.Request(
        f"{url.rstrip('/')}/api/v1/jobs/{urllib.parse.quote(job, safe='')}/cached-datasets", data=body.encode(),
        method="POST", headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.build_opener(TokenStaysHome).open(request, timeout=10):
            pass
    except urllib.error.HTTPError as err:
        err.close()
        print(f"data: could not report that node {node} caches {dataset}: HTTP {err.code} {err.reason}", flush=True)
        return False
    except (OSError, http.client.HTTPException) as err:
        print(f"data: could not report that node {node} caches {dataset}: {err}", flush=True)
        return False
    print(f"data: node {node} caches all of {dataset} ({shard_bytes} bytes); the scheduler prefers it for jobs "
          f"reading it", flush=True)
    return True

