-- Built-in template versions never vanish: every version a server has offered is kept here by
-- its digest (manifest and files as delivered), so that a job from an older Trainyard's
-- built-in runs again with exactly those files after an upgrade.
CREATE TABLE builtin_template_versions (
    digest      text PRIMARY KEY,
    name        text NOT NULL,
    version     text NOT NULL,
    manifest    text NOT NULL,
    files       jsonb NOT NULL,           -- {path: base64 content}
    first_seen  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX builtin_template_versions_by_name ON builtin_template_versions (name, version);
CREATE TRIGGER builtin_template_versions_immutable BEFORE UPDATE ON builtin_template_versions
    FOR EACH ROW EXECUTE FUNCTION templates_immutable();

-- A rerun links to the job it reproduces, with the overrides it was asked for (none: an
-- exact rerun).
ALTER TABLE jobs
    ADD COLUMN rerun_of uuid REFERENCES jobs (id),
    ADD COLUMN rerun_overrides jsonb;
CREATE INDEX jobs_by_rerun_of ON jobs (rerun_of) WHERE rerun_of IS NOT NULL;
