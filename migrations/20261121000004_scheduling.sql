-- Scheduling: quotas per tenant and GPU type with cohorts (borrowing and lending), fair-share
-- weights, preemption, and where the scheduler placed each admitted job.

ALTER TABLE tenants
    ADD COLUMN cohort text CONSTRAINT tenants_cohort_format CHECK (cohort ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    ADD COLUMN weight double precision NOT NULL DEFAULT 1 CONSTRAINT tenants_weight_positive CHECK (weight > 0 AND weight <= 1000),
    ADD COLUMN preempt_lower_priority boolean NOT NULL DEFAULT false;

CREATE TABLE quotas (
    tenant_id        uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    flavor           text NOT NULL CONSTRAINT quotas_flavor_format CHECK (flavor ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    nominal          bigint NOT NULL CONSTRAINT quotas_nominal_range CHECK (nominal BETWEEN 0 AND 1000000),
    borrowing_limit  bigint CONSTRAINT quotas_borrowing_range CHECK (borrowing_limit BETWEEN 0 AND 1000000),
    lending_limit    bigint CONSTRAINT quotas_lending_range CHECK (lending_limit BETWEEN 0 AND 1000000),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, flavor)
);

ALTER TABLE jobs
    ADD COLUMN flavor text,                     -- the GPU type its quota is counted in, once admitted
    ADD COLUMN assigned_nodes text[],           -- the node of each replica, once admitted
    ADD COLUMN expected_runtime_seconds integer, -- for start-time estimates
    ADD COLUMN preempt_requested_at timestamptz;

-- A preempted job goes back to the queue (and resumes from its checkpoint when relaunched).
INSERT INTO job_state_transitions (from_state, to_state) VALUES
    ('starting', 'queued'), ('running', 'queued'), ('restarting', 'queued');

-- The scheduler reads the head of every tenant's queue.
CREATE INDEX jobs_queued_by_tenant ON jobs (tenant_id, priority DESC, id) WHERE state = 'queued';
