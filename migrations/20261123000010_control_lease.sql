-- Leadership of the control loops as a lease with a fencing epoch, replacing the session-level
-- advisory lock (which a leader loses silently when its database session drops, while its
-- process keeps acting). One row: the leader renews `expires_at`; a standby takes the lease
-- once it expired, and every takeover increments `epoch`. Every write of the control loops
-- calls control_fence(epoch it holds): a deposed leader's write fails in the database even
-- before the deposed leader knows it lost.

CREATE TABLE control_lease (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    holder      uuid NOT NULL,
    epoch       bigint NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- True when `held` is the current epoch and its lease has not expired; otherwise raises
-- SQLSTATE TYF01 ("fenced"), so that the statement (and its transaction) writes nothing.
CREATE FUNCTION control_fence(held bigint) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM control_lease WHERE epoch = held AND expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'fenced: epoch % does not lead the control loops', held USING ERRCODE = 'TYF01';
    END IF;
    RETURN true;
END $$;
