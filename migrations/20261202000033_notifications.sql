-- Notifications (issue 43): subscriptions to a tenant's job events, delivered as signed webhooks
-- from an outbox. The outbox row of a job event is written by a trigger on job_events, so in the
-- same transaction as the change of state that caused it: an event is never lost to a crash
-- between the change and its notice, and never announced for a change that rolled back.
-- No signing secret is stored: the server derives each subscription's from its signing key.

CREATE TABLE notification_subscriptions (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    -- who made it: a 'user' subscription hears of this user's jobs only
    user_id       uuid NOT NULL,
    scope         text NOT NULL CONSTRAINT notification_subscriptions_scope_valid CHECK (scope IN ('user', 'tenant')),
    url           text NOT NULL CONSTRAINT notification_subscriptions_url_length CHECK (length(url) BETWEEN 8 AND 2048),
    format        text NOT NULL CONSTRAINT notification_subscriptions_format_valid CHECK (format IN ('standard', 'slack')),
    events        text[] NOT NULL CONSTRAINT notification_subscriptions_events_valid CHECK (
                      cardinality(events) > 0
                      AND events <@ ARRAY['ended', 'succeeded', 'failed', 'preempted', 'waiting', 'idle']::text[]),
    -- 'waiting': the notice comes once a job has been queued this long
    wait_seconds  integer CONSTRAINT notification_subscriptions_wait_range CHECK (wait_seconds BETWEEN 1 AND 2592000),
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT notification_subscriptions_wait_given CHECK (('waiting' = ANY (events)) = (wait_seconds IS NOT NULL)),
    -- a member removed takes their subscriptions with them
    FOREIGN KEY (tenant_id, user_id) REFERENCES memberships (tenant_id, user_id) ON DELETE CASCADE
);
CREATE INDEX notification_subscriptions_by_tenant ON notification_subscriptions (tenant_id, created_at);

-- One notice to one subscriber; delivered at least once (retried until a 2xx or given up).
CREATE TABLE notification_outbox (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),  -- the webhook-id receivers dedupe by
    subscription_id  uuid NOT NULL REFERENCES notification_subscriptions (id) ON DELETE CASCADE,
    tenant_id        uuid NOT NULL,
    kind             text NOT NULL,  -- job.succeeded, job.failed, job.cancelled, job.preempted, job.waiting, session.idle
    job_id           uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    event_seq        bigint NOT NULL,
    payload          jsonb NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    delivered_at     timestamptz,
    abandoned_at     timestamptz,
    -- one notice per subscription and event (the waiting sweep runs each second)
    CONSTRAINT notification_outbox_once UNIQUE (subscription_id, job_id, kind, event_seq)
);
CREATE INDEX notification_outbox_due ON notification_outbox (next_attempt_at)
    WHERE delivered_at IS NULL AND abandoned_at IS NULL;

-- Every try of a delivery, as its subscriber sees it.
CREATE TABLE notification_attempts (
    outbox_id    uuid NOT NULL REFERENCES notification_outbox (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    duration_ms  integer NOT NULL,
    status_code  integer,
    error        text,
    PRIMARY KEY (outbox_id, attempt)
);

-- A job event's notices, one per matching subscription, in the event's own transaction.
CREATE FUNCTION notifications_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text;
    wanted text[];
    job record;
BEGIN
    IF NEW.to_state IN ('succeeded', 'failed', 'cancelled') AND NEW.from_state IS DISTINCT FROM NEW.to_state THEN
        kind := 'job.' || NEW.to_state;
        wanted := CASE NEW.to_state WHEN 'cancelled' THEN ARRAY['ended'] ELSE ARRAY['ended', NEW.to_state] END;
    ELSIF NEW.to_state = 'queued' AND NEW.from_state IN ('starting', 'running', 'restarting') THEN
        kind := 'job.preempted';
        wanted := ARRAY['preempted'];
    ELSIF NEW.actor = 'control:idle' AND NEW.reason LIKE 'idle:%' THEN
        kind := 'session.idle';
        wanted := ARRAY['idle'];
    ELSE
        RETURN NULL;
    END IF;
    SELECT j.name, j.created_by, n.name AS tenant INTO job
    FROM jobs j JOIN tenants n ON n.id = j.tenant_id WHERE j.id = NEW.job_id;
    INSERT INTO notification_outbox (subscription_id, tenant_id, kind, job_id, event_seq, payload)
    SELECT s.id, NEW.tenant_id, kind, NEW.job_id, NEW.seq,
           jsonb_build_object('tenant', job.tenant, 'job_id', NEW.job_id, 'job_name', job.name,
                              'state', NEW.to_state, 'from_state', NEW.from_state, 'reason', NEW.reason,
                              'actor', NEW.actor, 'at', NEW.at)
    FROM notification_subscriptions s
    WHERE s.tenant_id = NEW.tenant_id AND (s.scope = 'tenant' OR s.user_id = job.created_by)
      AND s.events && wanted
    ON CONFLICT ON CONSTRAINT notification_outbox_once DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER notifications_enqueue AFTER INSERT ON job_events
    FOR EACH ROW EXECUTE FUNCTION notifications_enqueue();
