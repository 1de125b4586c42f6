-- The run record of each attempt (issue #20): what exactly ran, to repeat or compare a run.
-- Two parts, each written once and then never changed:
--   server: written by the control plane when the attempt begins, before any replica starts
--           (template with each file's hash, parameters, spec and its hash, code, datasets,
--           executor and image, Trainyard's version);
--   engine: posted once by the job's engine with its job token (interpreter, every installed
--           package, hardware and drivers, seeds, data and shard assignment).
-- Both are JSON documents whose shape the Rust types in trainyard_core::record define.
CREATE TABLE run_records (
    job_id              uuid NOT NULL,
    attempt             integer NOT NULL,
    tenant_id           uuid NOT NULL REFERENCES tenants (id),
    server              jsonb NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT now(),
    engine              jsonb,
    engine_recorded_at  timestamptz,
    PRIMARY KEY (job_id, attempt),
    FOREIGN KEY (job_id, attempt) REFERENCES job_attempts (job_id, attempt) ON DELETE CASCADE,
    CONSTRAINT run_records_engine_time CHECK ((engine IS NULL) = (engine_recorded_at IS NULL))
);

-- Immutable: the only change a row may ever see is its engine part arriving, once.
CREATE FUNCTION run_records_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.engine IS NULL AND NEW.engine IS NOT NULL
       AND (NEW.job_id, NEW.attempt, NEW.tenant_id, NEW.server, NEW.recorded_at)
           IS NOT DISTINCT FROM (OLD.job_id, OLD.attempt, OLD.tenant_id, OLD.server, OLD.recorded_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a run record is immutable: only its engine part may be added, once'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'run_records_immutable';
END $$;
CREATE TRIGGER run_records_immutable BEFORE UPDATE ON run_records
    FOR EACH ROW EXECUTE FUNCTION run_records_immutable();
