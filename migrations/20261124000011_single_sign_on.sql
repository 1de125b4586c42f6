-- Single sign-on with OpenID Connect (see docs/security.md).

-- A sign-in in flight: the browser was sent to the identity provider and has not come back yet.
-- Keyed by the SHA-256 of the `state` value; taken (deleted) once, when the browser returns.
CREATE TABLE sso_logins (
    state_hash     bytea PRIMARY KEY,
    pkce_verifier  text NOT NULL,
    nonce          text NOT NULL,
    -- the tenant the person asked to sign in to, if any
    tenant         text,
    expires_at     timestamptz NOT NULL
);
CREATE INDEX sso_logins_by_expiry ON sso_logins (expires_at);

-- Who a user is at an identity provider: the issuer and its subject identifier, which is stable
-- (never the e-mail or user name, which can change or be handed to someone else).
CREATE TABLE user_identities (
    issuer           text NOT NULL,
    subject          text NOT NULL,
    user_id          uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at       timestamptz NOT NULL DEFAULT now(),
    last_sign_in_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (issuer, subject)
);
CREATE INDEX user_identities_by_user ON user_identities (user_id);

-- Memberships that the identity provider's groups granted: kept in step with the groups at every
-- sign-in. Memberships granted by hand (false) are left alone by single sign-on.
ALTER TABLE memberships ADD COLUMN granted_by_sso boolean NOT NULL DEFAULT false;

-- Tokens that single sign-on opened for one dashboard session; they end with the session.
ALTER TABLE api_tokens ADD COLUMN session_only boolean NOT NULL DEFAULT false;
