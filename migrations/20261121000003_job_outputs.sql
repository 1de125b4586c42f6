-- What a job reports having produced (for example the dataset a data-pack job wrote, with its
-- content hash), by name; recorded by the job's engine with its job token.
CREATE TABLE job_outputs (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    name         text NOT NULL CONSTRAINT job_outputs_name_format CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    value        jsonb NOT NULL,
    attempt      integer NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
