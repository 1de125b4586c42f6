-- Storage: per-tenant retention and storage quota, artefact records, named volumes, the key that
-- signs local download URLs, and what retention has already removed.

-- Days after a job's end that its archived logs and its artefacts are kept; NULL keeps them
-- forever. The storage quota bounds the sum of the tenant's volume sizes; NULL is no limit.
ALTER TABLE tenants
    ADD COLUMN log_retention_days integer
        CONSTRAINT tenants_log_retention_positive CHECK (log_retention_days > 0),
    ADD COLUMN artifact_retention_days integer
        CONSTRAINT tenants_artifact_retention_positive CHECK (artifact_retention_days > 0),
    ADD COLUMN storage_quota_bytes bigint
        CONSTRAINT tenants_storage_quota_nonnegative CHECK (storage_quota_bytes >= 0);

-- When retention removed a finished job's logs and artefacts (set once, never cleared).
ALTER TABLE jobs
    ADD COLUMN logs_expired_at timestamptz,
    ADD COLUMN artifacts_expired_at timestamptz;
-- The retention sweep's working set: finished jobs whose storage is not yet swept.
CREATE INDEX jobs_retention_pending ON jobs (finished_at)
    WHERE finished_at IS NOT NULL AND (logs_expired_at IS NULL OR artifacts_expired_at IS NULL);

-- What was uploaded through the API, with the SHA-256 the server computed while receiving it.
-- The object store holds the bytes; this holds what the store cannot (the hash, the uploader).
CREATE TABLE artifacts (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    path         text NOT NULL CONSTRAINT artifacts_path_length CHECK (length(path) BETWEEN 1 AND 1024),
    size_bytes   bigint NOT NULL CHECK (size_bytes >= 0),
    sha256       text NOT NULL CONSTRAINT artifacts_sha256_format CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    uploaded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, job_id, path)
);

-- Named volumes per tenant. `path` is where the local executor keeps it (a PVC name on
-- Kubernetes later).
CREATE TABLE volumes (
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    name           text NOT NULL CONSTRAINT volumes_name_format CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    size_bytes     bigint NOT NULL CONSTRAINT volumes_size_positive CHECK (size_bytes > 0),
    access_mode    text NOT NULL CONSTRAINT volumes_access_mode_valid
                       CHECK (access_mode IN ('ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany')),
    storage_class  text NOT NULL CONSTRAINT volumes_storage_class_format
                       CHECK (storage_class ~ '^[a-z0-9][a-z0-9.-]{0,62}$'),
    path           text NOT NULL,
    created_by     uuid NOT NULL REFERENCES users (id),
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- Secrets all server replicas share, made once by whichever starts first.
CREATE TABLE server_secrets (
    name        text PRIMARY KEY,
    value       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
