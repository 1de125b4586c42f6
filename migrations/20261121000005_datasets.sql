-- The dataset registry: named, versioned datasets per tenant. A version never changes.
CREATE TABLE datasets (
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    name          text NOT NULL CONSTRAINT datasets_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    version       text NOT NULL CONSTRAINT datasets_version_format CHECK (version ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    uri           text NOT NULL,
    format        text NOT NULL,
    size_bytes    bigint,
    samples       bigint,
    content_hash  text NOT NULL,
    source_job    uuid REFERENCES jobs (id) ON DELETE SET NULL,
    created_by    uuid NOT NULL REFERENCES users (id),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name, version)
);

CREATE FUNCTION datasets_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a registered dataset version is immutable; register a new version'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'datasets_immutable';
END $$;
CREATE TRIGGER datasets_immutable BEFORE UPDATE ON datasets
    FOR EACH ROW EXECUTE FUNCTION datasets_immutable();

-- The exact dataset versions a job used: [{param, name, version, uri, content_hash}].
ALTER TABLE jobs ADD COLUMN datasets jsonb;
