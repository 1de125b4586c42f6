-- Content pushed to the object store (`yard datasets push`), known to the database from its
-- manifest on (issue 23): its shards' bytes count against the tenant's storage quota with its
-- volumes, and content on which no version was registered within a day of its last upload is
-- removed by the retention sweep (a push that never finished). Registering a version on it
-- needs the row (it locks it), so a push being removed cannot be registered at that moment.
CREATE TABLE dataset_pushes (
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    store_prefix text NOT NULL
        CONSTRAINT dataset_pushes_prefix_in_tenant
            CHECK (store_prefix ~ ('^tenants/' || tenant_id::text || '/datasets/content/[0-9a-f]{64}$')),
    bytes bigint NOT NULL CHECK (bytes >= 0),
    pushed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, store_prefix)
);

-- Content registered before this table: pushed and kept.
INSERT INTO dataset_pushes (tenant_id, store_prefix, bytes, pushed_at)
SELECT tenant_id, store_prefix, coalesce(max(size_bytes), 0), min(created_at)
FROM datasets WHERE store_prefix IS NOT NULL
GROUP BY tenant_id, store_prefix;

-- A removed tenant's objects (logs, artefacts, code, datasets) are removed from the object
-- store after its record is (the retention sweep); set once they are gone.
ALTER TABLE tenants ADD COLUMN objects_removed_at timestamptz;
CREATE INDEX tenants_objects_to_remove ON tenants (id) WHERE removed_at IS NOT NULL AND objects_removed_at IS NULL;
