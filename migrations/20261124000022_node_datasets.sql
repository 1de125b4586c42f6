-- Which dataset versions each node's shard cache holds (issue 23), as the engines report them:
-- a job whose replica on `node` holds every shard of a version it read says so with its job
-- token. Keyed by content (a cache holds content, whatever version names it) within the tenant
-- (a tenant's cache is its own: its shards live in the tenant's namespace of the cache).
-- The scheduler prefers these nodes for queued jobs reading that content; entries older than a
-- day are not trusted (a cache evicts without telling), and each job reading the data renews
-- its entry.
CREATE TABLE node_datasets (
    tenant_id    uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    content_hash text NOT NULL,
    node         text NOT NULL,
    bytes        bigint NOT NULL CHECK (bytes >= 0),
    -- The job whose engine reported it last.
    job_id       uuid NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, content_hash, node)
);
