-- Job chains and arrays (issue 43), Slurm's --dependency=afterok/afterany/afternotok and
-- --array=FIRST-LAST%MAX. A chained job is queued but not admitted until its dependencies are
-- met; one whose dependency can never be met is cancelled with the reason. An array's jobs
-- share `array_id` (its first job's id); at most `array_limit` of them are admitted at once.
-- Both are enforced by the leader before the admission cycle (store/src/chains.rs).

CREATE TABLE job_dependencies (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id   uuid NOT NULL,
    depends_on  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    kind        text NOT NULL CONSTRAINT job_dependencies_kind_valid CHECK (kind IN ('ok', 'any', 'failed')),
    PRIMARY KEY (job_id, depends_on, kind)
);
CREATE INDEX job_dependencies_on ON job_dependencies (depends_on);

-- A job depends only on jobs of its own tenant.
CREATE FUNCTION job_dependencies_same_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE id = NEW.depends_on AND tenant_id = NEW.tenant_id)
       OR NOT EXISTS (SELECT 1 FROM jobs WHERE id = NEW.job_id AND tenant_id = NEW.tenant_id) THEN
        RAISE EXCEPTION 'job % depends on %, which is not a job of its tenant', NEW.job_id, NEW.depends_on
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'job_dependencies_same_tenant';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER job_dependencies_same_tenant BEFORE INSERT OR UPDATE ON job_dependencies
    FOR EACH ROW EXECUTE FUNCTION job_dependencies_same_tenant();

ALTER TABLE jobs
    ADD COLUMN array_id     uuid,
    ADD COLUMN array_index  integer,
    ADD COLUMN array_limit  integer CONSTRAINT jobs_array_limit_range CHECK (array_limit >= 1),
    ADD CONSTRAINT jobs_array_whole CHECK ((array_id IS NULL) = (array_index IS NULL));
CREATE INDEX jobs_by_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
-- The leader reads the unfinished arrays with a limit each pass: never a scan of every job.
CREATE INDEX jobs_unfinished_arrays ON jobs (array_id)
    WHERE array_limit IS NOT NULL AND state IN ('queued', 'admitted', 'starting', 'running', 'restarting');
