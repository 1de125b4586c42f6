//! Drained nodes: Trainyard's own flag, keyed by the node's name as the executor reports it,
//! so that it holds on the local executor and on Kubernetes alike and survives restarts
//! (`migrations/*_node_drains.sql`). The control loop reads them into each snapshot.

use chrono::{DateTime, Utc};
use trainyard_core::api::NodeDrain;
use trainyard_core::{Error, Result};

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

impl Store {
    /// Every drained node, by name.
    pub async fn node_drains(&self) -> Result<Vec<NodeDrain>> {
        // language=PostgreSQL
        let rows: Vec<(String, String, String, DateTime<Utc>)> =
            sqlx::query_as("SELECT node, reason, drained_by, drained_at FROM node_drains ORDER BY node")
                .fetch_all(&self.pool)
                .await
                .map_err(db_error)?;
        Ok(rows
            .into_iter()
            .map(|(node, reason, drained_by, drained_at)| NodeDrain {
                node,
                reason,
                drained_by,
                drained_at,
                jobs_preempted: 0,
            })
            .collect())
    }

    /// Drains `node` (draining it again replaces the reason), in one transaction with its audit
    /// entry. With `preempt`, the jobs placed on it go back to the queue as a preemption sends
    /// them: an admitted one that has not launched at once, a launched one marked for the
    /// reconciler to stop and requeue (no restart counted; `preempted_for` none, so its room is
    /// anyone's, though none is placed on this node).
    pub async fn node_drain(&self, node: &str, reason: &str, preempt: bool, audit: &Audit) -> Result<NodeDrain> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let (reason, drained_by, drained_at): (String, String, DateTime<Utc>) = sqlx::query_as(
            "INSERT INTO node_drains (node, reason, drained_by) VALUES ($1, $2, $3)
             ON CONFLICT (node) DO UPDATE SET reason = EXCLUDED.reason
             RETURNING reason, drained_by, drained_at",
        )
        .bind(node)
        .bind(reason)
        .bind(&audit.actor)
        .fetch_one(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("node_drains_node_format") => Error::invalid("node", "not a node name"),
            Some("node_drains_reason_length") => Error::invalid("reason", "at most 500 characters"),
            _ => db_error(err),
        })?;
        let jobs_preempted = if preempt {
            let why = if reason.is_empty() {
                format!("preempted: node {node} is drained")
            } else {
                format!("preempted: node {node} is drained: {reason}")
            };
            // Two updates of disjoint rows (by state), as `Store::jobs_preempt`'s.
            // language=PostgreSQL
            let moved: Vec<uuid::Uuid> = sqlx::query_scalar(
                "WITH requeued AS (
                     UPDATE jobs SET state = 'queued', reason = $2, last_actor = $3, flavor = NULL, assigned_nodes = NULL
                      WHERE state = 'admitted' AND $1 = ANY(assigned_nodes)
                     RETURNING id),
                 marked AS (
                     UPDATE jobs SET preempt_requested_at = coalesce(preempt_requested_at, now()), reason = $2,
                                     preempted_for = CASE WHEN preempt_requested_at IS NULL THEN NULL ELSE preempted_for END
                      WHERE state IN ('starting', 'running', 'restarting') AND cancel_requested_at IS NULL
                        AND $1 = ANY(assigned_nodes)
                     RETURNING id)
                 SELECT id FROM requeued UNION ALL SELECT id FROM marked",
            )
            .bind(node)
            .bind(&why)
            .bind(&audit.actor)
            .fetch_all(&mut *tx)
            .await
            .map_err(db_error)?;
            moved.len() as u64
        } else {
            0
        };
        let detail = format!(
            "reason {reason:?}, {}",
            if preempt { format!("{jobs_preempted} jobs preempted") } else { "running jobs left".into() }
        );
        audit::append(&mut *tx, audit, Outcome::Ok, Some(&detail)).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(NodeDrain { node: node.to_string(), reason, drained_by, drained_at, jobs_preempted })
    }

    /// Undrains `node`: it takes placements again. 409 when it was not drained.
    pub async fn node_undrain(&self, node: &str, audit: &Audit) -> Result<NodeDrain> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let row: Option<(String, String, DateTime<Utc>)> =
            sqlx::query_as("DELETE FROM node_drains WHERE node = $1 RETURNING reason, drained_by, drained_at")
                .bind(node)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_error)?;
        let (reason, drained_by, drained_at) =
            row.ok_or_else(|| Error::Conflict(format!("node {node} is not drained")))?;
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(NodeDrain { node: node.to_string(), reason, drained_by, drained_at, jobs_preempted: 0 })
    }
}
