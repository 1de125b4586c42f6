-- Browser sessions of the dashboard. A session is opened with an API token and stands for that
-- token: it is checked against the token on every request (revoked or expired token, changed
-- role), so it never grants more than the token. Only the SHA-256 of the cookie is kept.
CREATE TABLE web_sessions (
    secret_hash  bytea PRIMARY KEY,
    token_id     uuid NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    -- the synchronizer token every form post of this session must carry
    csrf         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX web_sessions_by_token ON web_sessions (token_id);
CREATE INDEX web_sessions_by_expiry ON web_sessions (expires_at);
