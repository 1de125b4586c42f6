-- `started_at` for every job that started, however short (issue 43): a job whose replicas ended
-- before a reconciler pass saw them running went from `starting` straight to its end and was
-- shown "Started -" and no elapsed time. Leaving `starting` for anything but `running` now takes
-- the start of the job's first attempt that was launched (it has a placement); a launch that
-- started nothing leaves it unset. Otherwise the same function as in the foundation migration.
CREATE OR REPLACE FUNCTION jobs_guard_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'a new job must start queued, not %', NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_state_transition';
        END IF;
        NEW.event_seq := 1;
        RETURN NEW;
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        IF NOT EXISTS (SELECT 1 FROM job_state_transitions
                       WHERE from_state = OLD.state AND to_state = NEW.state) THEN
            RAISE EXCEPTION 'illegal job state transition % -> %', OLD.state, NEW.state
                USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_state_transition';
        END IF;
        NEW.event_seq := OLD.event_seq + 1;
        NEW.updated_at := now();
        IF NEW.state = 'admitted' THEN NEW.admitted_at := now(); END IF;
        IF NEW.state = 'running' AND OLD.started_at IS NULL THEN NEW.started_at := now(); END IF;
        -- A job that ended (or failed over to its next attempt) before any pass saw it running
        -- still started: when its first launched attempt did.
        IF OLD.state = 'starting' AND NEW.state <> 'running' AND NEW.started_at IS NULL THEN
            NEW.started_at := (SELECT min(a.started_at) FROM job_attempts a
                               WHERE a.job_id = NEW.id AND a.placement IS NOT NULL);
        END IF;
        IF NEW.state IN ('succeeded', 'failed', 'cancelled') THEN NEW.finished_at := now(); END IF;
    END IF;
    RETURN NEW;
END $$;
