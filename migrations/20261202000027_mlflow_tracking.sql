-- MLflow-compatible tracking (issue 42, first step): experiments, runs, params, tags and metrics
-- as MLflow's tracking REST API writes them, per tenant. A run here is a run of its own (a
-- laptop, a notebook); runs tied to a job's run record come later (docs/tracking.md).
--
-- Experiment ids are per tenant: every tenant has MLflow's "Default" experiment with id 0 (the
-- id an unconfigured client logs into), made with the tenant; others take ids from one sequence.
CREATE SEQUENCE mlflow_experiment_ids START WITH 1;

CREATE TABLE mlflow_experiments (
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    experiment_id  bigint NOT NULL DEFAULT nextval('mlflow_experiment_ids'),
    name           text NOT NULL,
    lifecycle_stage text NOT NULL DEFAULT 'active',
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT mlflow_experiments_pkey PRIMARY KEY (tenant_id, experiment_id),
    CONSTRAINT mlflow_experiments_name_unique UNIQUE (tenant_id, name),
    CONSTRAINT mlflow_experiments_name_length CHECK (length(name) BETWEEN 1 AND 500),
    CONSTRAINT mlflow_experiments_lifecycle CHECK (lifecycle_stage IN ('active', 'deleted'))
);

CREATE TABLE mlflow_runs (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id      uuid NOT NULL,
    experiment_id  bigint NOT NULL,
    name           text NOT NULL,
    -- The user the client says it runs as (MLflow's user_id), as sent.
    user_name      text NOT NULL DEFAULT '',
    -- The Trainyard user whose token created the run.
    created_by     uuid NOT NULL REFERENCES users (id),
    status         text NOT NULL DEFAULT 'RUNNING',
    start_time     bigint NOT NULL,
    end_time       bigint,
    lifecycle_stage text NOT NULL DEFAULT 'active',
    CONSTRAINT mlflow_runs_experiment_fkey FOREIGN KEY (tenant_id, experiment_id)
        REFERENCES mlflow_experiments (tenant_id, experiment_id),
    CONSTRAINT mlflow_runs_status CHECK (status IN ('RUNNING', 'SCHEDULED', 'FINISHED', 'FAILED', 'KILLED')),
    CONSTRAINT mlflow_runs_lifecycle CHECK (lifecycle_stage IN ('active', 'deleted'))
);
CREATE INDEX mlflow_runs_by_experiment ON mlflow_runs (tenant_id, experiment_id, start_time DESC);

-- Params are written once: the key is unique per run, and a second write with another value is
-- refused (store/src/tracking.rs:Store::mlflow_log).
CREATE TABLE mlflow_params (
    run_id     uuid NOT NULL REFERENCES mlflow_runs (id) ON DELETE CASCADE,
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    key        text NOT NULL,
    value      text NOT NULL,
    CONSTRAINT mlflow_params_unique PRIMARY KEY (run_id, key)
);

-- Tags overwrite: one value per run and key.
CREATE TABLE mlflow_tags (
    run_id     uuid NOT NULL REFERENCES mlflow_runs (id) ON DELETE CASCADE,
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    key        text NOT NULL,
    value      text NOT NULL,
    CONSTRAINT mlflow_tags_unique PRIMARY KEY (run_id, key)
);

-- Metrics append: every point is kept (timestamp in milliseconds, as MLflow sends it).
CREATE TABLE mlflow_metrics (
    run_id     uuid NOT NULL REFERENCES mlflow_runs (id) ON DELETE CASCADE,
    tenant_id  uuid NOT NULL REFERENCES tenants (id),
    key        text NOT NULL,
    value      double precision NOT NULL,
    timestamp  bigint NOT NULL,
    step       bigint NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX mlflow_metrics_by_series ON mlflow_metrics (run_id, key, step, timestamp);

-- Every tenant has the Default experiment, id 0: those there now, and each new one.
INSERT INTO mlflow_experiments (tenant_id, experiment_id, name) SELECT id, 0, 'Default' FROM tenants;

CREATE FUNCTION mlflow_default_experiment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mlflow_experiments (tenant_id, experiment_id, name) VALUES (NEW.id, 0, 'Default');
    RETURN NEW;
END
$$;
CREATE TRIGGER tenants_mlflow_default_experiment AFTER INSERT ON tenants
    FOR EACH ROW EXECUTE FUNCTION mlflow_default_experiment();

-- A tenant being removed takes no new experiment or run.
CREATE TRIGGER mlflow_runs_not_in_removed_tenant BEFORE INSERT ON mlflow_runs
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
CREATE TRIGGER mlflow_experiments_not_in_removed_tenant BEFORE INSERT ON mlflow_experiments
    FOR EACH ROW EXECUTE FUNCTION tenant_takes_nothing_new();
