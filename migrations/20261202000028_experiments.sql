-- Experiments (issue 40): hyperparameter searches whose trials are jobs. The searcher is a
-- deterministic state machine (crates/searcher): its state is the replay of `experiment_events`,
-- in `seq` order, and every run it decides is a job found again by its idempotency key, so a
-- crash or a leader change anywhere decides the same runs and starts none twice.
CREATE TABLE experiments (
    id               uuid PRIMARY KEY,  -- UUIDv7
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    name             text NOT NULL,
    -- The member whose rights the trials are submitted with.
    created_by       uuid NOT NULL REFERENCES users (id),
    template         text NOT NULL,
    -- The template version every trial runs, fixed at creation.
    template_version text NOT NULL,
    -- The parameters every trial shares, the searched space and the searcher's settings, as
    -- checked at creation (crates/searcher/src/spec.rs).
    params           jsonb NOT NULL,
    space            jsonb NOT NULL,
    searcher         jsonb NOT NULL,
    budget_gpu_hours double precision,
    -- What the replay says, kept for lists and pages; the events are the truth.
    state            text NOT NULL DEFAULT 'searching',
    reason           text,
    best             jsonb,
    idempotency_key  text,
    request_hash     bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    ended_at         timestamptz,
    CONSTRAINT experiments_state CHECK (state IN ('searching', 'paused', 'completed', 'failed', 'cancelled')),
    CONSTRAINT experiments_budget_positive CHECK (budget_gpu_hours IS NULL OR budget_gpu_hours > 0),
    CONSTRAINT experiments_idempotency_key_unique UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX experiments_by_tenant ON experiments (tenant_id, id DESC);
CREATE INDEX experiments_unfinished ON experiments (id) WHERE state IN ('searching', 'paused');

CREATE TRIGGER experiments_not_in_removed_tenant BEFORE INSERT ON experiments
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();

-- The searcher's input, append-only. Two writers racing for the same `seq` (two servers, a
-- request and the driver) meet the primary key; the loser reads again and decides again.
CREATE TABLE experiment_events (
    experiment_id  uuid NOT NULL REFERENCES experiments (id),
    seq            integer NOT NULL CHECK (seq >= 0),
    event          jsonb NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (experiment_id, seq)
);

CREATE FUNCTION experiment_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'experiment events are never changed or deleted';
END
$$;
CREATE TRIGGER experiment_events_append_only BEFORE UPDATE OR DELETE ON experiment_events
    FOR EACH ROW EXECUTE FUNCTION experiment_events_append_only();

-- The job of each run the searcher decided: a trial's run to a rung.
CREATE TABLE experiment_runs (
    experiment_id  uuid NOT NULL REFERENCES experiments (id),
    trial          integer NOT NULL CHECK (trial >= 0),
    rung           integer NOT NULL CHECK (rung >= 0),
    job_id         uuid NOT NULL REFERENCES jobs (id),
    PRIMARY KEY (experiment_id, trial, rung),
    CONSTRAINT experiment_runs_job_unique UNIQUE (job_id)
);
