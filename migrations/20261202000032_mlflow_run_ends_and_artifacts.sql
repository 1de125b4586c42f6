-- MLflow runs (issue 42, third step).
--
-- A job's run ends with its job: a script that never calls `mlflow.start_run()` (or dies before
-- `end_run`) leaves its run RUNNING, so the job's end sets what the client did not: FINISHED,
-- FAILED or KILLED, at the job's end. A run the client ended itself keeps what it said.
CREATE FUNCTION mlflow_job_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE mlflow_runs
    SET status = CASE NEW.state WHEN 'succeeded' THEN 'FINISHED' WHEN 'failed' THEN 'FAILED' ELSE 'KILLED' END,
        end_time = floor(extract(epoch FROM coalesce(NEW.finished_at, now())) * 1000)::bigint
    WHERE job_id = NEW.id AND status IN ('RUNNING', 'SCHEDULED');
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_mlflow_run_end AFTER UPDATE OF state ON jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION mlflow_job_run_end();

-- Runs of jobs that ended before this migration.
UPDATE mlflow_runs r
SET status = CASE j.state WHEN 'succeeded' THEN 'FINISHED' WHEN 'failed' THEN 'FAILED' ELSE 'KILLED' END,
    end_time = floor(extract(epoch FROM coalesce(j.finished_at, now())) * 1000)::bigint
FROM jobs j
WHERE r.job_id = j.id AND r.status IN ('RUNNING', 'SCHEDULED') AND j.state IN ('succeeded', 'failed', 'cancelled');

-- The artefacts of runs of their own (a laptop's, a notebook's `mlflow.log_artifact`), as
-- `artifacts` holds a job's: the bytes in the object store under the tenant's key for the run
-- (store/src/tracking.rs:Store::mlflow_artifact_record), one row per path.
CREATE TABLE mlflow_run_artifacts (
    tenant_id    uuid NOT NULL REFERENCES tenants (id),
    run_id       uuid NOT NULL REFERENCES mlflow_runs (id) ON DELETE CASCADE,
    path         text NOT NULL CONSTRAINT mlflow_run_artifacts_path_length CHECK (length(path) BETWEEN 1 AND 1024),
    size_bytes   bigint NOT NULL CONSTRAINT mlflow_run_artifacts_size CHECK (size_bytes >= 0),
    sha256       text NOT NULL CONSTRAINT mlflow_run_artifacts_sha256_format CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    uploaded_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT mlflow_run_artifacts_pkey PRIMARY KEY (tenant_id, run_id, path)
);
