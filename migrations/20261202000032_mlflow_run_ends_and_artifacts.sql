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

-- Experiment tags (MLflow's set-experiment-tag): one value per experiment and key.
CREATE TABLE mlflow_experiment_tags (
    tenant_id      uuid NOT NULL,
    experiment_id  bigint NOT NULL,
    key            text NOT NULL,
    value          text NOT NULL,
    CONSTRAINT mlflow_experiment_tags_pkey PRIMARY KEY (tenant_id, experiment_id, key),
    CONSTRAINT mlflow_experiment_tags_experiment_fkey FOREIGN KEY (tenant_id, experiment_id)
        REFERENCES mlflow_experiments (tenant_id, experiment_id) ON DELETE CASCADE
);

-- A deleted experiment takes no new run (MLflow's rule), whatever the order of the requests. A
-- job's run goes into the Default experiment, 0, which is never deleted: the launch statement
-- (store/src/reconcile.rs:Store::attempts_open) takes no lock for it.
CREATE FUNCTION mlflow_run_in_active_experiment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM mlflow_experiments
               WHERE tenant_id = NEW.tenant_id AND experiment_id = NEW.experiment_id
                 AND lifecycle_stage = 'deleted' FOR SHARE) THEN
        RAISE EXCEPTION 'the experiment % is deleted', NEW.experiment_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'mlflow_runs_experiment_active';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER mlflow_runs_in_active_experiment BEFORE INSERT ON mlflow_runs
    FOR EACH ROW WHEN (NEW.job_id IS NULL) EXECUTE FUNCTION mlflow_run_in_active_experiment();
