-- Log archiving as a job of its own: an attempt's end is recorded at once, and its replicas'
-- logs are copied to the object store in the background, retried with backoff while the store
-- is away, so that an unreachable object store never holds up the control loop.

ALTER TABLE job_attempts
    ADD COLUMN logs_archived_at timestamptz,          -- every replica's log is in the object store
    ADD COLUMN logs_archive_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN logs_archive_next_at timestamptz;      -- not retried before this, after a failure

-- Attempts that ended before this migration were archived as they ended (or tried once).
UPDATE job_attempts SET logs_archived_at = ended_at WHERE ended_at IS NOT NULL;

-- The archiver's working set: ended attempts whose logs are not archived yet.
CREATE INDEX job_attempts_unarchived ON job_attempts (ended_at)
    WHERE ended_at IS NOT NULL AND logs_archived_at IS NULL;
