-- Task templates uploaded by tenants, the template a job came from, job-scoped tokens for
-- engines, and the metrics they report.

CREATE TABLE templates (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    name         text NOT NULL,
    version      text NOT NULL,
    -- sha256 over the canonical manifest and the delivered files (trainyard_templates::Template::digest_of)
    digest       text NOT NULL,
    description  text NOT NULL,
    manifest     text NOT NULL,  -- template.yaml as uploaded
    created_by   uuid NOT NULL REFERENCES users (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name, version)
);

CREATE TABLE template_files (
    tenant_id  uuid NOT NULL,
    name       text NOT NULL,
    version    text NOT NULL,
    path       text NOT NULL,
    content    bytea NOT NULL,
    PRIMARY KEY (tenant_id, name, version, path),
    FOREIGN KEY (tenant_id, name, version) REFERENCES templates (tenant_id, name, version)
);

-- A published version never changes: no code path, and no hand in psql, can edit it.
CREATE FUNCTION templates_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a published template version is immutable; publish a new version'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'templates_immutable';
END $$;
CREATE TRIGGER templates_immutable BEFORE UPDATE ON templates
    FOR EACH ROW EXECUTE FUNCTION templates_immutable();
CREATE TRIGGER template_files_immutable BEFORE UPDATE ON template_files
    FOR EACH ROW EXECUTE FUNCTION templates_immutable();

ALTER TABLE jobs
    ADD COLUMN template_name text,
    ADD COLUMN template_version text,
    ADD COLUMN template_digest text,
    ADD COLUMN params jsonb;  -- the parameters as the user gave them
CREATE INDEX jobs_by_tenant_template ON jobs (tenant_id, template_name, id DESC) WHERE template_name IS NOT NULL;

-- A token handed to one attempt of a job, for its engine to report metrics. Only the hash is
-- kept; the rows go when the attempt ends.
CREATE TABLE job_tokens (
    token_hash  bytea PRIMARY KEY,
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    attempt     integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_tokens_by_job ON job_tokens (job_id);

CREATE TABLE metrics (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    attempt      integer NOT NULL,
    name         text NOT NULL,
    step         bigint NOT NULL,
    value        double precision NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX metrics_by_series ON metrics (job_id, name, step);
