-- Drained nodes (issue 43, "an admin's first week"): Trainyard's own flag, keyed by the node's
-- name as the executor reports it (the local machine, a Kubernetes node), so that a drain holds
-- on either executor and survives restarts. A drained node takes no new placements; its running
-- jobs stay unless the drain asked to preempt them (then they go back to the queue).
CREATE TABLE node_drains (
    node        text PRIMARY KEY CONSTRAINT node_drains_node_format CHECK (node ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$'),
    reason      text NOT NULL DEFAULT '' CONSTRAINT node_drains_reason_length CHECK (char_length(reason) <= 500),
    drained_by  text NOT NULL,
    drained_at  timestamptz NOT NULL DEFAULT now()
);
