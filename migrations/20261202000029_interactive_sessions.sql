-- Interactive sessions (issue 41, first step): a notebook is an ordinary job of its tenant
-- (queued under quota, charged to the ledger, recorded like any run); this row says that the
-- job is a session, of which kind, who opened it and when it last saw activity.
--
-- The browser reaches a session through the server's proxy with a cookie of its own: a grant
-- (one use, short-lived, made for a caller's token) is exchanged for it. Only SHA-256 hashes of
-- grants and cookies are stored. A grant belongs to the token it was made for: revoking the
-- token, or the membership behind it, ends the cookie too (the foreign key cascades).
CREATE TABLE interactive_sessions (
    job_id            uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    user_id           uuid NOT NULL REFERENCES users (id),
    kind              text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- The last request through the proxy after authentication (activity, for idle stops).
    last_activity_at  timestamptz NOT NULL DEFAULT now(),
    -- When the control loop warned that the session stops unless used; cleared by activity.
    idle_warned_at    timestamptz,
    CONSTRAINT interactive_sessions_kind_valid CHECK (kind IN ('notebook', 'shell', 'tensorboard'))
);
CREATE INDEX interactive_sessions_by_tenant ON interactive_sessions (tenant_id, created_at DESC);

-- The job is the tenant's own: a session row cannot point at another tenant's job.
CREATE FUNCTION interactive_sessions_same_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE id = NEW.job_id AND tenant_id = NEW.tenant_id) THEN
        RAISE EXCEPTION 'session % is not a job of tenant %', NEW.job_id, NEW.tenant_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'interactive_sessions_job_of_tenant';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER interactive_sessions_same_tenant BEFORE INSERT OR UPDATE ON interactive_sessions
    FOR EACH ROW EXECUTE FUNCTION interactive_sessions_same_tenant();

CREATE TABLE interactive_session_grants (
    grant_hash        bytea PRIMARY KEY,
    job_id            uuid NOT NULL REFERENCES interactive_sessions (job_id) ON DELETE CASCADE,
    token_id          uuid NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    grant_expires_at  timestamptz NOT NULL,
    -- Set once, when the grant is exchanged for the browser's cookie.
    cookie_hash       bytea,
    redeemed_at       timestamptz,
    cookie_expires_at timestamptz,
    CONSTRAINT interactive_session_grants_cookie_unique UNIQUE (cookie_hash),
    CONSTRAINT interactive_session_grants_redeemed_whole CHECK (
        (cookie_hash IS NULL) = (redeemed_at IS NULL) AND (cookie_hash IS NULL) = (cookie_expires_at IS NULL))
);
CREATE INDEX interactive_session_grants_by_job ON interactive_session_grants (job_id);

-- A tenant's policy: a running session with no activity for this long is stopped (warned
-- first); NULL: never. Seconds, so that tests can use short ones.
ALTER TABLE tenants ADD COLUMN session_idle_timeout_seconds integer
    CONSTRAINT tenants_session_idle_timeout_range CHECK (session_idle_timeout_seconds BETWEEN 10 AND 2592000);
