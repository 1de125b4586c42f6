-- The audit log: every change made through the API, the dashboard or the CLI, and every refused
-- attempt at one. Written in the same transaction as the change it records; the application
-- only ever appends (the triggers below refuse UPDATE, DELETE and TRUNCATE, for every role that
-- is not the table's owner acting through ALTER TABLE ... DISABLE TRIGGER).
CREATE TABLE audit_log (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- the tenant the change concerns (NULL: the platform as a whole, e.g. creating a tenant)
    tenant_id    uuid,
    tenant       text,
    actor        text NOT NULL,                -- `user:<name>`, or `local:<command>` for admin tools
    user_id      uuid,
    credential   text,                          -- `token:<id>` or `session:<token id>`; never a secret
    action       text NOT NULL,                 -- e.g. `job.submit`, `quota.set`
    target       text NOT NULL,                 -- e.g. `job:<id>`, `tenant:<name>/quota:<gpu type>`
    outcome      text NOT NULL CONSTRAINT audit_log_outcome CHECK
                     (outcome IN ('ok', 'denied', 'invalid', 'conflict', 'error')),
    detail       text,                          -- why a refusal was refused
    source       inet                           -- the client's address, when known
);
CREATE INDEX audit_log_by_tenant ON audit_log (tenant_id, seq DESC);
CREATE INDEX audit_log_by_action ON audit_log (action, seq DESC);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only: % is refused', TG_OP
        USING ERRCODE = 'TYA01';
END
$$;
CREATE TRIGGER audit_log_no_update_or_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- The allocation ledger behind usage accounting: one row per attempt, opened in the transaction
-- that begins the attempt and closed in the one that ends it. What the attempt held (all
-- replicas together) and for how long; a row with no end is running and counts up to now.
CREATE TABLE usage_ledger (
    job_id        uuid NOT NULL,
    attempt       integer NOT NULL,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    user_id       uuid NOT NULL REFERENCES users (id),
    template      text,                          -- the template's name, when the job came from one
    gpu_type      text,                          -- the GPU type its quota was counted in
    gpus          integer NOT NULL CHECK (gpus >= 0),
    cpu_millis    bigint NOT NULL CHECK (cpu_millis >= 0),
    memory_bytes  bigint NOT NULL CHECK (memory_bytes >= 0),
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz,
    PRIMARY KEY (job_id, attempt),
    FOREIGN KEY (job_id, attempt) REFERENCES job_attempts (job_id, attempt) ON DELETE CASCADE,
    CONSTRAINT usage_ledger_range CHECK (ended_at IS NULL OR ended_at >= started_at)
);
CREATE INDEX usage_ledger_by_time ON usage_ledger (started_at, ended_at);
CREATE INDEX usage_ledger_running ON usage_ledger (tenant_id) WHERE ended_at IS NULL;

-- Attempts that began before the ledger existed, so that usage covers them too.
INSERT INTO usage_ledger (job_id, attempt, tenant_id, user_id, template, gpu_type, gpus, cpu_millis,
                          memory_bytes, started_at, ended_at)
SELECT a.job_id, a.attempt, a.tenant_id, j.created_by, j.template_name, j.flavor,
       coalesce((j.spec -> 'resources' ->> 'gpus')::integer, 0) * coalesce((j.spec ->> 'replicas')::integer, 1),
       (coalesce((j.spec -> 'resources' ->> 'cpu')::double precision, 1) * 1000)::bigint
           * coalesce((j.spec ->> 'replicas')::integer, 1),
       0, a.started_at, a.ended_at
FROM job_attempts a JOIN jobs j ON j.id = a.job_id;
