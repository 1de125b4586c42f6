-- MLflow runs tied to jobs (issue 42, second step). A job's MLflow run has the job's id as its
-- own, is made with the job's first attempt (store/src/reconcile.rs:Store::attempts_open, in the
-- same statement) and is the one run the job's token may log to (MLFLOW_RUN_ID in its replicas).
-- What it logs is the job's: metrics go to the job's `metrics` (one store, one chart), params are
-- the job's logged params (beside, not among, its template parameters).
ALTER TABLE mlflow_runs ADD COLUMN job_id uuid;
ALTER TABLE mlflow_runs
    ADD CONSTRAINT mlflow_runs_job_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE,
    ADD CONSTRAINT mlflow_runs_job_unique UNIQUE (job_id),
    ADD CONSTRAINT mlflow_runs_job_is_the_run CHECK (job_id IS NULL OR job_id = id);

-- A job that launches was admitted before its tenant's removal began, and its run must not fail
-- the statement that opens its attempt (and every launch opened beside it): only runs of their
-- own are refused in a tenant being removed.
DROP TRIGGER mlflow_runs_not_in_removed_tenant ON mlflow_runs;
CREATE TRIGGER mlflow_runs_not_in_removed_tenant BEFORE INSERT ON mlflow_runs
    FOR EACH ROW WHEN (NEW.job_id IS NULL) EXECUTE FUNCTION tenant_takes_nothing_new();

-- Every metric point of every MLflow run as MLflow reads them: a run of its own keeps its points
-- in mlflow_metrics; a job's run reads the job's metrics (what it logged through MLflow and what
-- its engine reported), their time in milliseconds as MLflow gives it.
CREATE VIEW mlflow_metric_points AS
    SELECT run_id, tenant_id, key, value, timestamp, step, recorded_at FROM mlflow_metrics
    UNION ALL
    SELECT r.id, m.tenant_id, m.name, m.value, floor(extract(epoch FROM m.recorded_at) * 1000)::bigint, m.step,
           m.recorded_at
    FROM metrics m JOIN mlflow_runs r ON r.job_id = m.job_id AND r.tenant_id = m.tenant_id;
