//! MLflow-compatible tracking: experiments, runs, and the params, tags and metrics logged to
//! them (migration 27). Every query takes the caller's tenant id; another tenant's experiment or
//! run answers as none does. Params are written once, tags overwrite, metrics append.

use trainyard_core::error::ObjectKind;
use trainyard_core::tracking::{Experiment, KeyValue, LogBatch, Metric, Run, RunFilter, RunInfo, RunOrder};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// The tag MLflow keeps a run's name in, beside the run's own field.
const RUN_NAME_TAG: &str = "mlflow.runName";

type ExperimentRow = (i64, String, String, i64, i64);

fn experiment_of((experiment_id, name, lifecycle_stage, creation_time, last_update_time): ExperimentRow) -> Experiment {
    Experiment { experiment_id, name, lifecycle_stage, creation_time, last_update_time }
}

type RunRow = (Uuid, i64, String, String, String, i64, Option<i64>, String);

fn run_info_of(
    (run_id, experiment_id, run_name, user_id, status, start_time, end_time, lifecycle_stage): RunRow,
) -> RunInfo {
    RunInfo { run_id, experiment_id, run_name, user_id, status, start_time, end_time, lifecycle_stage }
}

/// The columns of an [`ExperimentRow`] (a macro, so that statements stay static strings).
macro_rules! experiment_columns {
    () => {
        "experiment_id, name, lifecycle_stage, (extract(epoch FROM created_at) * 1000)::bigint, \
         (extract(epoch FROM updated_at) * 1000)::bigint"
    };
}

/// The columns of a [`RunRow`].
macro_rules! run_columns {
    () => {
        "id, experiment_id, name, user_name, status, start_time, end_time, lifecycle_stage"
    };
}

/// A new run: where it goes and what the client said about it.
#[derive(Debug, Clone)]
pub struct RunNew<'a> {
    pub experiment_id: i64,
    pub name: &'a str,
    pub user_name: &'a str,
    pub start_time: i64,
    pub tags: &'a [KeyValue],
}

impl Store {
    /// Makes an experiment of the tenant, with its audit entry; a taken name is refused.
    pub async fn mlflow_experiment_create(&self, tenant_id: Uuid, name: &str, audit: &Audit) -> Result<i64> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO mlflow_experiments (tenant_id, name) VALUES ($1, $2) RETURNING experiment_id",
        )
        .bind(tenant_id)
        .bind(name)
        .fetch_one(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("mlflow_experiments_name_unique") => {
                Error::AlreadyExists(format!("an experiment named '{name}' already exists"))
            }
            Some("mlflow_experiments_name_length") => Error::invalid("name", "1 to 500 characters"),
            _ => db_error(err),
        })?;
        audit::append(&mut *tx, &audit.clone().target(format!("mlflow-experiment:{id}")), Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(id)
    }

    pub async fn mlflow_experiment_get(&self, tenant_id: Uuid, experiment_id: i64) -> Result<Experiment> {
        // language=PostgreSQL
        let sql = concat!(
            "SELECT ",
            experiment_columns!(),
            " FROM mlflow_experiments WHERE tenant_id = $1 AND experiment_id = $2"
        );
        let row: Option<ExperimentRow> = sqlx::query_as(sql)
            .bind(tenant_id)
            .bind(experiment_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.map(experiment_of).ok_or_else(|| Error::not_found(ObjectKind::Experiment))
    }

    pub async fn mlflow_experiment_by_name(&self, tenant_id: Uuid, name: &str) -> Result<Experiment> {
        // language=PostgreSQL
        let sql =
            concat!("SELECT ", experiment_columns!(), " FROM mlflow_experiments WHERE tenant_id = $1 AND name = $2");
        let row: Option<ExperimentRow> =
            sqlx::query_as(sql).bind(tenant_id).bind(name).fetch_optional(&self.pool).await.map_err(db_error)?;
        row.map(experiment_of).ok_or_else(|| Error::not_found(ObjectKind::Experiment))
    }

    /// The tenant's active experiments by id, a page of `limit` from `offset`.
    pub async fn mlflow_experiments_search(&self, tenant_id: Uuid, limit: i64, offset: i64) -> Result<Vec<Experiment>> {
        // language=PostgreSQL
        let sql = concat!(
            "SELECT ",
            experiment_columns!(),
            " FROM mlflow_experiments WHERE tenant_id = $1 AND lifecycle_stage = 'active'
             ORDER BY experiment_id LIMIT $2 OFFSET $3"
        );
        let rows: Vec<ExperimentRow> = sqlx::query_as(sql)
            .bind(tenant_id)
            .bind(limit)
            .bind(offset)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(rows.into_iter().map(experiment_of).collect())
    }

    /// Makes a run in an experiment of the tenant, with its first tags and its audit entry, in
    /// one transaction.
    pub async fn mlflow_run_create(
        &self,
        tenant_id: Uuid,
        created_by: Uuid,
        run: &RunNew<'_>,
        audit: &Audit,
    ) -> Result<Run> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let sql = concat!(
            "INSERT INTO mlflow_runs (tenant_id, experiment_id, name, user_name, created_by, start_time)
             VALUES ($1, $2, coalesce(nullif($3, ''), 'run-' || left(md5(gen_random_uuid()::text), 8)), $4, $5, $6)
             RETURNING ",
            run_columns!()
        );
        let row: RunRow = sqlx::query_as(sql)
            .bind(tenant_id)
            .bind(run.experiment_id)
            .bind(run.name)
            .bind(run.user_name)
            .bind(created_by)
            .bind(run.start_time)
            .fetch_one(&mut *tx)
            .await
            .map_err(|err| match violated_constraint(&err) {
                Some("mlflow_runs_experiment_fkey") => Error::not_found(ObjectKind::Experiment),
                _ => db_error(err),
            })?;
        let info = run_info_of(row);
        let mut tags: Vec<KeyValue> = run.tags.iter().filter(|t| t.key != RUN_NAME_TAG).cloned().collect();
        tags.push(KeyValue { key: RUN_NAME_TAG.into(), value: info.run_name.clone() });
        tags_upsert(&mut tx, tenant_id, info.run_id, &tags).await?;
        let target = format!("mlflow-run:{}", info.run_id.simple());
        audit::append(&mut *tx, &audit.clone().target(target), Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)?;
        self.mlflow_run_get(tenant_id, info.run_id).await
    }

    /// A run of the tenant with its params, tags and the latest point of each metric.
    pub async fn mlflow_run_get(&self, tenant_id: Uuid, run_id: Uuid) -> Result<Run> {
        let (filter, order) = (RunFilter::default(), RunOrder::default());
        let mut runs = self.mlflow_runs_read(tenant_id, None, Some(run_id), &filter, &order, None, 1, 0).await?;
        runs.pop().ok_or_else(|| Error::not_found(ObjectKind::Run))
    }

    /// Sets what is given of a run's status, end time and name.
    pub async fn mlflow_run_update(
        &self,
        tenant_id: Uuid,
        run_id: Uuid,
        status: Option<&str>,
        end_time: Option<i64>,
        name: Option<&str>,
    ) -> Result<RunInfo> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let sql = concat!(
            "UPDATE mlflow_runs SET status = coalesce($3, status), end_time = coalesce($4, end_time),
                                    name = coalesce($5, name)
             WHERE id = $1 AND tenant_id = $2 RETURNING ",
            run_columns!()
        );
        let row: Option<RunRow> = sqlx::query_as(sql)
            .bind(run_id)
            .bind(tenant_id)
            .bind(status)
            .bind(end_time)
            .bind(name)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
        let info = run_info_of(row.ok_or_else(|| Error::not_found(ObjectKind::Run))?);
        if let Some(name) = name {
            tags_upsert(&mut tx, tenant_id, run_id, &[KeyValue { key: RUN_NAME_TAG.into(), value: name.into() }])
                .await?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(info)
    }

    /// Logs a batch to a run of the tenant, all or nothing: params written once (the same value
    /// again is accepted, another is refused naming the key), tags overwritten (the last of a
    /// key in the batch wins; `mlflow.runName` also renames the run), metrics appended.
    pub async fn mlflow_log(&self, tenant_id: Uuid, run_id: Uuid, batch: &LogBatch) -> Result<()> {
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let run: Option<(String, Option<Uuid>)> = sqlx::query_as(
            "SELECT lifecycle_stage, job_id FROM mlflow_runs WHERE id = $1 AND tenant_id = $2 FOR SHARE",
        )
        .bind(run_id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        let job_id = match run {
            None => return Err(Error::not_found(ObjectKind::Run)),
            Some((stage, job_id)) if stage == "active" => job_id,
            Some(_) => return Err(Error::invalid("run_id", "the run is deleted; restore it to log to it")),
        };
        if !batch.params.is_empty() {
            let keys: Vec<&str> = batch.params.iter().map(|p| p.key.as_str()).collect();
            let values: Vec<&str> = batch.params.iter().map(|p| p.value.as_str()).collect();
            // language=PostgreSQL
            sqlx::query(
                "INSERT INTO mlflow_params (run_id, tenant_id, key, value)
                 SELECT DISTINCT $1, $2, key, value FROM UNNEST($3::text[], $4::text[]) AS p(key, value)
                 ON CONFLICT ON CONSTRAINT mlflow_params_unique DO NOTHING",
            )
            .bind(run_id)
            .bind(tenant_id)
            .bind(&keys)
            .bind(&values)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
            // language=PostgreSQL
            let changed: Option<(String, String, String)> = sqlx::query_as(
                "SELECT p.key, p.value, n.value FROM mlflow_params p
                 JOIN UNNEST($2::text[], $3::text[]) AS n(key, value) ON n.key = p.key
                 WHERE p.run_id = $1 AND p.value <> n.value LIMIT 1",
            )
            .bind(run_id)
            .bind(&keys)
            .bind(&values)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?;
            if let Some((key, old, new)) = changed {
                return Err(Error::invalid(
                    "params",
                    format!(
                        "param '{key}' was logged with the value '{old}'; params are written once, so '{new}' is refused"
                    ),
                ));
            }
        }
        if !batch.tags.is_empty() {
            tags_upsert(&mut tx, tenant_id, run_id, &batch.tags).await?;
            if let Some(name) = batch.tags.iter().rev().find(|t| t.key == RUN_NAME_TAG) {
                // language=PostgreSQL
                sqlx::query("UPDATE mlflow_runs SET name = $2 WHERE id = $1")
                    .bind(run_id)
                    .bind(&name.value)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?;
            }
        }
        if !batch.metrics.is_empty() {
            let keys: Vec<&str> = batch.metrics.iter().map(|m| m.key.as_str()).collect();
            let values: Vec<f64> = batch.metrics.iter().map(|m| m.value).collect();
            let timestamps: Vec<i64> = batch.metrics.iter().map(|m| m.timestamp).collect();
            let steps: Vec<i64> = batch.metrics.iter().map(|m| m.step).collect();
            if let Some(job_id) = job_id {
                // A job's run: the job's own metrics (its latest attempt's), which its charts,
                // `yard diff` and the compare page read; the time is the client's.
                // language=PostgreSQL
                sqlx::query(
                    "INSERT INTO metrics (job_id, tenant_id, attempt, name, step, value, recorded_at)
                     SELECT $1, $2, (SELECT coalesce(max(attempt), 1) FROM job_attempts WHERE job_id = $1),
                            key, step, value, timestamptz 'epoch' + ts * interval '1 millisecond'
                     FROM UNNEST($3::text[], $4::float8[], $5::bigint[], $6::bigint[]) AS m(key, value, ts, step)",
                )
                .bind(job_id)
                .bind(tenant_id)
                .bind(&keys)
                .bind(&values)
                .bind(&timestamps)
                .bind(&steps)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                return tx.commit().await.map_err(db_error);
            }
            // language=PostgreSQL
            sqlx::query(
                "INSERT INTO mlflow_metrics (run_id, tenant_id, key, value, timestamp, step)
                 SELECT $1, $2, key, value, ts, step
                 FROM UNNEST($3::text[], $4::float8[], $5::bigint[], $6::bigint[]) AS m(key, value, ts, step)",
            )
            .bind(run_id)
            .bind(tenant_id)
            .bind(&keys)
            .bind(&values)
            .bind(&timestamps)
            .bind(&steps)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)
    }

    /// Runs of the tenant in these experiments, in this lifecycle stage (`active`, `deleted`;
    /// `None`: both), that match the filter, in this order.
    #[allow(clippy::too_many_arguments)]
    pub async fn mlflow_runs_search(
        &self,
        tenant_id: Uuid,
        experiment_ids: &[i64],
        filter: &RunFilter,
        order: &RunOrder,
        stage: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<Run>> {
        self.mlflow_runs_read(tenant_id, Some(experiment_ids), None, filter, order, stage, limit, offset).await
    }

    /// Deletes a run of the tenant (`deleted`) or restores it (`active`): a deleted run is out of
    /// searches and takes no logging until restored. Nothing of it is removed.
    pub async fn mlflow_run_stage_set(&self, tenant_id: Uuid, run_id: Uuid, stage: &str) -> Result<()> {
        // language=PostgreSQL
        let done = sqlx::query("UPDATE mlflow_runs SET lifecycle_stage = $3 WHERE id = $1 AND tenant_id = $2")
            .bind(run_id)
            .bind(tenant_id)
            .bind(stage)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        if done.rows_affected() == 0 {
            return Err(Error::not_found(ObjectKind::Run));
        }
        Ok(())
    }

    /// Removes a tag of an active run of the tenant; a tag it does not have is none to remove.
    pub async fn mlflow_tag_delete(&self, tenant_id: Uuid, run_id: Uuid, key: &str) -> Result<()> {
        // language=PostgreSQL
        let (stage, deleted): (Option<String>, bool) = sqlx::query_as(
            "WITH run AS (SELECT lifecycle_stage FROM mlflow_runs WHERE id = $1 AND tenant_id = $2),
                  gone AS (DELETE FROM mlflow_tags t USING run
                           WHERE t.run_id = $1 AND t.tenant_id = $2 AND t.key = $3 AND run.lifecycle_stage = 'active'
                           RETURNING 1)
             SELECT (SELECT lifecycle_stage FROM run), EXISTS (SELECT 1 FROM gone)",
        )
        .bind(run_id)
        .bind(tenant_id)
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(db_error)?;
        match (stage.as_deref(), deleted) {
            (None, _) => Err(Error::not_found(ObjectKind::Run)),
            (Some("active"), true) => Ok(()),
            (Some("active"), false) => Err(Error::NotFound { kind: ObjectKind::Tag }),
            (Some(_), _) => Err(Error::invalid("run_id", "the run is deleted; restore it to change its tags")),
        }
    }

    /// The params logged through MLflow to the runs of these jobs of the tenant (job, key, value),
    /// by key: a job's logged params, beside its template parameters.
    pub async fn mlflow_job_params(&self, tenant_id: Uuid, job_ids: &[Uuid]) -> Result<Vec<(Uuid, String, String)>> {
        // language=PostgreSQL
        sqlx::query_as(
            "SELECT r.job_id, p.key, p.value FROM mlflow_runs r JOIN mlflow_params p ON p.run_id = r.id
             WHERE r.tenant_id = $1 AND r.job_id = ANY($2) ORDER BY r.job_id, p.key",
        )
        .bind(tenant_id)
        .bind(job_ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    /// Whose a run of the tenant is (its job's id, for a job's run; none for a run of its own)
    /// and whether it is deleted.
    pub async fn mlflow_run_owner(&self, tenant_id: Uuid, run_id: Uuid) -> Result<(Option<Uuid>, bool)> {
        // language=PostgreSQL
        let row: Option<(Option<Uuid>, bool)> = sqlx::query_as(
            "SELECT job_id, lifecycle_stage = 'deleted' FROM mlflow_runs WHERE id = $1 AND tenant_id = $2",
        )
        .bind(run_id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(db_error)?;
        row.ok_or_else(|| Error::not_found(ObjectKind::Run))
    }

    /// Records an artefact stored for a run of its own (its bytes are in the object store),
    /// replacing one at the same path.
    pub async fn mlflow_artifact_record(
        &self,
        tenant_id: Uuid,
        run_id: Uuid,
        path: &str,
        size_bytes: u64,
        sha256: &str,
    ) -> Result<()> {
        // language=PostgreSQL
        sqlx::query(
            "INSERT INTO mlflow_run_artifacts (tenant_id, run_id, path, size_bytes, sha256) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT ON CONSTRAINT mlflow_run_artifacts_pkey
             DO UPDATE SET size_bytes = excluded.size_bytes, sha256 = excluded.sha256, uploaded_at = now()",
        )
        .bind(tenant_id)
        .bind(run_id)
        .bind(path)
        .bind(i64::try_from(size_bytes).map_err(Error::internal)?)
        .bind(sha256)
        .execute(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Every point of one metric of a run of the tenant, by step and then time.
    pub async fn mlflow_metric_history(&self, tenant_id: Uuid, run_id: Uuid, key: &str) -> Result<Vec<Metric>> {
        // language=PostgreSQL
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM mlflow_runs WHERE id = $1 AND tenant_id = $2)")
                .bind(run_id)
                .bind(tenant_id)
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)?;
        if !exists {
            return Err(Error::not_found(ObjectKind::Run));
        }
        // language=PostgreSQL
        let rows: Vec<(String, f64, i64, i64)> = sqlx::query_as(
            "SELECT key, value, timestamp, step FROM mlflow_metric_points
             WHERE run_id = $1 AND tenant_id = $2 AND key = $3 ORDER BY step, timestamp, recorded_at",
        )
        .bind(run_id)
        .bind(tenant_id)
        .bind(key)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows.into_iter().map(|(key, value, timestamp, step)| Metric { key, value, timestamp, step }).collect())
    }

    /// Runs of the tenant (one by id, or those of some experiments) matching the filter, with
    /// what was logged to them: four statements, whatever the number of runs.
    #[allow(clippy::too_many_arguments)]
    async fn mlflow_runs_read(
        &self,
        tenant_id: Uuid,
        experiment_ids: Option<&[i64]>,
        run_id: Option<Uuid>,
        filter: &RunFilter,
        order: &RunOrder,
        stage: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<Run>> {
        let metric_keys: Vec<&str> = filter.metrics.iter().map(|m| m.key.as_str()).collect();
        let metric_ops: Vec<&str> = filter.metrics.iter().map(|m| m.op).collect();
        let metric_values: Vec<f64> = filter.metrics.iter().map(|m| m.value).collect();
        let param_keys: Vec<&str> = filter.params.iter().map(|p| p.key.as_str()).collect();
        let param_values: Vec<&str> = filter.params.iter().map(|p| p.value.as_str()).collect();
        let tag_keys: Vec<&str> = filter.tags.iter().map(|p| p.key.as_str()).collect();
        let tag_values: Vec<&str> = filter.tags.iter().map(|p| p.value.as_str()).collect();
        // language=PostgreSQL
        let sql = concat!(
            "SELECT ",
            run_columns!(),
            " FROM mlflow_runs r
             WHERE r.tenant_id = $1
               AND ($2::bigint[] IS NULL OR r.experiment_id = ANY($2))
               AND ($3::uuid IS NULL OR r.id = $3)
               AND ($3::uuid IS NOT NULL OR $12::text IS NULL OR r.lifecycle_stage = $12)
               AND ($4::text IS NULL OR r.status = $4)
               AND ($5::text IS NULL OR r.name = $5)
               AND NOT EXISTS (SELECT 1 FROM UNNEST($6::text[], $7::text[]) AS f(key, value)
                               WHERE NOT EXISTS (SELECT 1 FROM mlflow_params p
                                                 WHERE p.run_id = r.id AND p.key = f.key AND p.value = f.value))
               AND NOT EXISTS (SELECT 1 FROM UNNEST($8::text[], $9::text[]) AS f(key, value)
                               WHERE NOT EXISTS (SELECT 1 FROM mlflow_tags t
                                                 WHERE t.run_id = r.id AND t.key = f.key AND t.value = f.value))
               AND NOT EXISTS (SELECT 1 FROM UNNEST($13::text[], $14::text[], $15::float8[]) AS f(key, op, value)
                               WHERE NOT EXISTS (
                                   SELECT 1 FROM (SELECT p.value FROM mlflow_metric_points p
                                                  WHERE p.run_id = r.id AND p.key = f.key
                                                  ORDER BY p.step DESC, p.timestamp DESC, p.recorded_at DESC
                                                  LIMIT 1) latest
                                   WHERE CASE f.op WHEN '=' THEN latest.value = f.value
                                                   WHEN '!=' THEN latest.value <> f.value
                                                   WHEN '<' THEN latest.value < f.value
                                                   WHEN '<=' THEN latest.value <= f.value
                                                   WHEN '>' THEN latest.value > f.value
                                                   WHEN '>=' THEN latest.value >= f.value END))
             ORDER BY
               CASE WHEN $18 THEN CASE $16 WHEN 'start_time' THEN r.start_time::float8
                                           WHEN 'end_time' THEN r.end_time::float8
                                           WHEN 'metric' THEN (SELECT p.value FROM mlflow_metric_points p
                                                               WHERE p.run_id = r.id AND p.key = $17
                                                               ORDER BY p.step DESC, p.timestamp DESC,
                                                                        p.recorded_at DESC LIMIT 1) END END
                 ASC NULLS LAST,
               CASE WHEN NOT $18 THEN CASE $16 WHEN 'start_time' THEN r.start_time::float8
                                               WHEN 'end_time' THEN r.end_time::float8
                                               WHEN 'metric' THEN (SELECT p.value FROM mlflow_metric_points p
                                                                   WHERE p.run_id = r.id AND p.key = $17
                                                                   ORDER BY p.step DESC, p.timestamp DESC,
                                                                            p.recorded_at DESC LIMIT 1) END END
                 DESC NULLS LAST,
               CASE WHEN $18 AND $16 = 'run_name' THEN r.name END ASC,
               CASE WHEN NOT $18 AND $16 = 'run_name' THEN r.name END DESC,
               r.start_time DESC, r.id
             LIMIT $10 OFFSET $11"
        );
        let rows: Vec<RunRow> = sqlx::query_as(sql)
            .bind(tenant_id)
            .bind(experiment_ids)
            .bind(run_id)
            .bind(filter.status.as_deref())
            .bind(filter.run_name.as_deref())
            .bind(&param_keys)
            .bind(&param_values)
            .bind(&tag_keys)
            .bind(&tag_values)
            .bind(limit)
            .bind(offset)
            .bind(stage)
            .bind(&metric_keys)
            .bind(&metric_ops)
            .bind(&metric_values)
            .bind(order.by)
            .bind(order.metric.as_deref())
            .bind(order.ascending)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        let ids: Vec<Uuid> = rows.iter().map(|row| row.0).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // language=PostgreSQL
        let params: Vec<(Uuid, String, String)> = sqlx::query_as(
            "SELECT run_id, key, value FROM mlflow_params WHERE run_id = ANY($1) AND tenant_id = $2 ORDER BY key",
        )
        .bind(&ids)
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        // language=PostgreSQL
        let tags: Vec<(Uuid, String, String)> = sqlx::query_as(
            "SELECT run_id, key, value FROM mlflow_tags WHERE run_id = ANY($1) AND tenant_id = $2 ORDER BY key",
        )
        .bind(&ids)
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        // MLflow's run data holds each metric's latest point: the highest step, then the latest time.
        // language=PostgreSQL
        let metrics: Vec<(Uuid, String, f64, i64, i64)> = sqlx::query_as(
            "SELECT DISTINCT ON (run_id, key) run_id, key, value, timestamp, step FROM mlflow_metric_points
             WHERE run_id = ANY($1) AND tenant_id = $2
             ORDER BY run_id, key, step DESC, timestamp DESC, recorded_at DESC",
        )
        .bind(&ids)
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let info = run_info_of(row);
                let id = info.run_id;
                let pairs = |list: &[(Uuid, String, String)]| {
                    list.iter()
                        .filter(|(run, ..)| *run == id)
                        .map(|(_, key, value)| KeyValue { key: key.clone(), value: value.clone() })
                        .collect()
                };
                Run {
                    params: pairs(&params),
                    tags: pairs(&tags),
                    metrics: metrics
                        .iter()
                        .filter(|(run, ..)| *run == id)
                        .map(|(_, key, value, timestamp, step)| Metric {
                            key: key.clone(),
                            value: *value,
                            timestamp: *timestamp,
                            step: *step,
                        })
                        .collect(),
                    info,
                }
            })
            .collect())
    }
}

/// Sets tags of a run, the last of a key in `tags` winning.
async fn tags_upsert(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant_id: Uuid,
    run_id: Uuid,
    tags: &[KeyValue],
) -> Result<()> {
    let mut last: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for tag in tags {
        last.insert(&tag.key, &tag.value);
    }
    let keys: Vec<&str> = last.keys().copied().collect();
    let values: Vec<&str> = last.values().copied().collect();
    // language=PostgreSQL
    sqlx::query(
        "INSERT INTO mlflow_tags (run_id, tenant_id, key, value)
         SELECT $1, $2, key, value FROM UNNEST($3::text[], $4::text[]) AS t(key, value)
         ON CONFLICT ON CONSTRAINT mlflow_tags_unique DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(run_id)
    .bind(tenant_id)
    .bind(&keys)
    .bind(&values)
    .execute(&mut **tx)
    .await
    .map_err(db_error)?;
    Ok(())
}
