-- This installation's identity (issue 39): a random id made once, when the database is. The
-- Kubernetes executor labels every object it makes with it, and its garbage collection deletes
-- only Jobs that carry it, so that two installations on one cluster (staging beside
-- production, a test suite beside a server) never delete each other's jobs.
CREATE TABLE installation (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    id      uuid NOT NULL DEFAULT gen_random_uuid(),
    made_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO installation DEFAULT VALUES;
