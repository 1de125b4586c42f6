-- Foundation: tenants, users, memberships, API tokens, jobs with a guarded state machine,
-- job attempts and job events. Every tenant-owned row carries tenant_id.

CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenants_name_unique UNIQUE (name),
    CONSTRAINT tenants_name_format CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$')
);

CREATE TABLE users (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    platform_admin  boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT users_name_unique UNIQUE (name),
    CONSTRAINT users_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$')
);

CREATE TABLE memberships (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id     uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role        text NOT NULL CONSTRAINT memberships_role_valid CHECK (role IN ('viewer', 'member', 'admin')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id)
);

-- A token acts for one user in one tenant, with that user's current role there. Only the
-- SHA-256 of the secret is stored: tokens are 256-bit random, so a slow hash adds nothing.
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    user_id       uuid NOT NULL,
    name          text NOT NULL CONSTRAINT api_tokens_name_length CHECK (length(name) BETWEEN 1 AND 64),
    token_hash    bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz,
    last_used_at  timestamptz,
    revoked_at    timestamptz,
    CONSTRAINT api_tokens_hash_unique UNIQUE (token_hash),
    FOREIGN KEY (tenant_id, user_id) REFERENCES memberships (tenant_id, user_id) ON DELETE CASCADE
);
CREATE INDEX api_tokens_by_user ON api_tokens (tenant_id, user_id);

-- The legal moves of the job state machine; mirrors trainyard_core::job::JobState::TRANSITIONS
-- (a test checks that they agree). The trigger below refuses any other change of state.
CREATE TABLE job_state_transitions (
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO job_state_transitions (from_state, to_state) VALUES
    ('queued', 'admitted'), ('queued', 'cancelled'),
    ('admitted', 'starting'), ('admitted', 'queued'), ('admitted', 'cancelled'),
    ('starting', 'running'), ('starting', 'succeeded'), ('starting', 'failed'),
    ('starting', 'restarting'), ('starting', 'cancelled'),
    ('running', 'succeeded'), ('running', 'failed'), ('running', 'restarting'), ('running', 'cancelled'),
    ('restarting', 'starting'), ('restarting', 'failed'), ('restarting', 'cancelled');

CREATE TABLE jobs (
    id                   uuid PRIMARY KEY,  -- UUIDv7: ordering by id is ordering by submit time
    tenant_id            uuid NOT NULL REFERENCES tenants (id),
    name                 text NOT NULL,
    spec                 jsonb NOT NULL,
    priority             integer NOT NULL DEFAULT 0,
    max_restarts         integer NOT NULL DEFAULT 0 CONSTRAINT jobs_max_restarts_range CHECK (max_restarts >= 0),
    restart_count        integer NOT NULL DEFAULT 0,
    state                text NOT NULL DEFAULT 'queued',
    reason               text,
    -- who or what made the last change of state; copied into job_events by the trigger
    last_actor           text NOT NULL,
    event_seq            bigint NOT NULL DEFAULT 0,
    idempotency_key      text,
    request_hash         bytea,
    created_by           uuid NOT NULL REFERENCES users (id),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    admitted_at          timestamptz,
    started_at           timestamptz,
    finished_at          timestamptz,
    cancel_requested_at  timestamptz,
    CONSTRAINT jobs_idempotency_key_unique UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT jobs_restart_count_range CHECK (restart_count BETWEEN 0 AND max_restarts),
    CONSTRAINT jobs_state_valid CHECK (state IN
        ('queued', 'admitted', 'starting', 'running', 'restarting', 'succeeded', 'failed', 'cancelled'))
);
CREATE INDEX jobs_by_tenant ON jobs (tenant_id, id DESC);
CREATE INDEX jobs_by_tenant_state ON jobs (tenant_id, state, id DESC);
CREATE INDEX jobs_by_tenant_name ON jobs (tenant_id, name, id DESC);
-- the reconciler's working set: jobs that are not finished
CREATE INDEX jobs_unfinished ON jobs (state, priority DESC, id)
    WHERE state IN ('queued', 'admitted', 'starting', 'running', 'restarting');

CREATE TABLE job_attempts (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    attempt     integer NOT NULL CHECK (attempt >= 1),
    placement   jsonb,
    exit_codes  integer[] NOT NULL DEFAULT '{}',
    reason      text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE job_events (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    seq         bigint NOT NULL,
    from_state  text,
    to_state    text NOT NULL,
    actor       text NOT NULL,
    reason      text,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- Guards every change of a job's state and keeps its bookkeeping: a new job starts queued;
-- a change of state must be listed in job_state_transitions; timestamps follow the state.
CREATE FUNCTION jobs_guard_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'a new job must start queued, not %', NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_state_transition';
        END IF;
        NEW.event_seq := 1;
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NOT EXISTS (SELECT 1 FROM job_state_transitions
                       WHERE from_state = OLD.state AND to_state = NEW.state) THEN
            RAISE EXCEPTION 'illegal job state transition % -> %', OLD.state, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_state_transition';
        END IF;
        NEW.event_seq := OLD.event_seq + 1;
        NEW.updated_at := now();
        IF NEW.state = 'admitted' THEN NEW.admitted_at := now(); END IF;
        IF NEW.state = 'running' AND OLD.started_at IS NULL THEN NEW.started_at := now(); END IF;
        IF NEW.state IN ('succeeded', 'failed', 'cancelled') THEN NEW.finished_at := now(); END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_guard_state BEFORE INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_guard_state();

-- Every state a job enters is recorded, whoever wrote it.
CREATE FUNCTION jobs_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
        VALUES (NEW.id, NEW.tenant_id, NEW.event_seq, NULL, NEW.state, NEW.last_actor, NEW.reason);
    ELSIF NEW.state IS DISTINCT FROM OLD.state THEN
        INSERT INTO job_events (job_id, tenant_id, seq, from_state, to_state, actor, reason)
        VALUES (NEW.id, NEW.tenant_id, NEW.event_seq, OLD.state, NEW.state, NEW.last_actor, NEW.reason);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_record_event AFTER INSERT OR UPDATE OF state ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_record_event();
