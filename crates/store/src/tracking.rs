//! MLflow-compatible tracking: experiments, runs, and the params, tags and metrics logged to
//! them (migration 27). Every query takes the caller's tenant id; another tenant's experiment or
//! run answers as none does. Params are written once, tags overwrite, metrics append.

use trainyard_core::error::ObjectKind;
use trainyard_core::tracking::{
    Experiment, ExperimentFilter, ExperimentOrder, FilterClause, KeyValue, LogBatch, Metric, OrderBy, Run, RunField,
    RunFilter, RunInfo, RunOrder,
};
use trainyard_core::{Error, Result};
use uuid::Uuid;

use crate::audit::{self, Audit, Outcome};
use crate::{Store, db_error, violated_constraint};

/// The tag MLflow keeps a run's name in, beside the run's own field.
const RUN_NAME_TAG: &str = "mlflow.runName";

type ExperimentRow = (i64, String, String, i64, i64);

fn experiment_of((experiment_id, name, lifecycle_stage, creation_time, last_update_time): ExperimentRow) -> Experiment {
    Experiment { experiment_id, name, lifecycle_stage, creation_time, last_update_time, tags: Vec::new() }
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

/// The start of a subquery of the latest point of a metric of the run `r` (its key bound next,
/// then ` ORDER BY ... LIMIT 1)`).
const LATEST_METRIC_OF_RUN: &str = "(SELECT p.value FROM mlflow_metric_points p WHERE p.run_id = r.id AND p.key = ";

/// The column of a run a filter compares (the id as the wire has it: 32 hex digits).
fn run_field_sql(field: RunField) -> &'static str {
    match field {
        RunField::Status => "r.status",
        RunField::Name => "r.name",
        RunField::Id => "replace(r.id::text, '-', '')",
        RunField::User => "r.user_name",
    }
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
    pub async fn mlflow_experiment_create(
        &self,
        tenant_id: Uuid,
        name: &str,
        tags: &[KeyValue],
        audit: &Audit,
    ) -> Result<i64> {
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
        for tag in tags {
            experiment_tag_upsert(&mut *tx, tenant_id, id, tag).await?;
        }
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
        let experiment = row.map(experiment_of).ok_or_else(|| Error::not_found(ObjectKind::Experiment))?;
        Ok(self.experiments_tagged(tenant_id, vec![experiment]).await?.remove(0))
    }

    pub async fn mlflow_experiment_by_name(&self, tenant_id: Uuid, name: &str) -> Result<Experiment> {
        // language=PostgreSQL
        let sql =
            concat!("SELECT ", experiment_columns!(), " FROM mlflow_experiments WHERE tenant_id = $1 AND name = $2");
        let row: Option<ExperimentRow> =
            sqlx::query_as(sql).bind(tenant_id).bind(name).fetch_optional(&self.pool).await.map_err(db_error)?;
        let experiment = row.map(experiment_of).ok_or_else(|| Error::not_found(ObjectKind::Experiment))?;
        Ok(self.experiments_tagged(tenant_id, vec![experiment]).await?.remove(0))
    }

    /// The experiments with their tags (one statement for all).
    async fn experiments_tagged(&self, tenant_id: Uuid, mut experiments: Vec<Experiment>) -> Result<Vec<Experiment>> {
        let ids: Vec<i64> = experiments.iter().map(|e| e.experiment_id).collect();
        // language=PostgreSQL
        let tags: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT experiment_id, key, value FROM mlflow_experiment_tags
             WHERE tenant_id = $1 AND experiment_id = ANY($2) ORDER BY key",
        )
        .bind(tenant_id)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        for (id, key, value) in tags {
            if let Some(experiment) = experiments.iter_mut().find(|e| e.experiment_id == id) {
                experiment.tags.push(KeyValue { key, value });
            }
        }
        Ok(experiments)
    }

    /// Deletes an experiment of the tenant and its active runs (`deleted`), or restores it and
    /// its deleted runs, as MLflow's store does; with its audit entry.
    pub async fn mlflow_experiment_stage_set(
        &self,
        tenant_id: Uuid,
        experiment_id: i64,
        deleted: bool,
        audit: &Audit,
    ) -> Result<()> {
        let (from, to) = if deleted { ("active", "deleted") } else { ("deleted", "active") };
        let mut tx = self.begin().await?;
        // language=PostgreSQL
        let found: Option<i64> = sqlx::query_scalar(
            "WITH experiment AS (
                 UPDATE mlflow_experiments SET lifecycle_stage = $4, updated_at = now()
                 WHERE tenant_id = $1 AND experiment_id = $2 RETURNING experiment_id),
             runs AS (
                 UPDATE mlflow_runs r SET lifecycle_stage = $4
                 FROM experiment e WHERE r.tenant_id = $1 AND r.experiment_id = e.experiment_id
                   AND r.lifecycle_stage = $3)
             SELECT experiment_id FROM experiment",
        )
        .bind(tenant_id)
        .bind(experiment_id)
        .bind(from)
        .bind(to)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
        if found.is_none() {
            return Err(Error::not_found(ObjectKind::Experiment));
        }
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)
    }

    /// Renames an active experiment of the tenant; a taken name is refused. With its audit entry.
    pub async fn mlflow_experiment_rename(
        &self,
        tenant_id: Uuid,
        experiment_id: i64,
        name: &str,
        audit: &Audit,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        experiment_active_locked(&mut tx, tenant_id, experiment_id, Lock::Update, "rename it").await?;
        // language=PostgreSQL
        sqlx::query(
            "UPDATE mlflow_experiments SET name = $3, updated_at = now() WHERE tenant_id = $1 AND experiment_id = $2",
        )
        .bind(tenant_id)
        .bind(experiment_id)
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(|err| match violated_constraint(&err) {
            Some("mlflow_experiments_name_unique") => {
                Error::AlreadyExists(format!("an experiment named '{name}' already exists"))
            }
            Some("mlflow_experiments_name_length") => Error::invalid("new_name", "1 to 500 characters"),
            _ => db_error(err),
        })?;
        audit::append(&mut *tx, audit, Outcome::Ok, None).await?;
        tx.commit().await.map_err(db_error)
    }

    /// Sets a tag of an active experiment of the tenant (`Some` value) or removes it (`None`;
    /// a tag it lacks is not found).
    pub async fn mlflow_experiment_tag_set(
        &self,
        tenant_id: Uuid,
        experiment_id: i64,
        key: &str,
        value: Option<&str>,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        experiment_active_locked(&mut tx, tenant_id, experiment_id, Lock::Share, "change its tags").await?;
        match value {
            Some(value) => {
                let tag = KeyValue { key: key.to_string(), value: value.to_string() };
                experiment_tag_upsert(&mut *tx, tenant_id, experiment_id, &tag).await?;
            }
            None => {
                // language=PostgreSQL
                let removed = sqlx::query(
                    "DELETE FROM mlflow_experiment_tags WHERE tenant_id = $1 AND experiment_id = $2 AND key = $3",
                )
                .bind(tenant_id)
                .bind(experiment_id)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                if removed.rows_affected() == 0 {
                    return Err(Error::not_found(ObjectKind::Tag));
                }
            }
        }
        tx.commit().await.map_err(db_error)
    }

    /// The tenant's experiments in a lifecycle stage (`None`: both) that match the filter, in
    /// this order then by id, a page of `limit` from `offset`.
    pub async fn mlflow_experiments_search(
        &self,
        tenant_id: Uuid,
        stage: Option<&str>,
        filter: &ExperimentFilter,
        order: &ExperimentOrder,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<Experiment>> {
        // Built from the parsed filter and order: values bound, SQL text from a fixed set.
        let mut query = sqlx::QueryBuilder::<sqlx::Postgres>::new(concat!(
            "SELECT ",
            experiment_columns!(),
            " FROM mlflow_experiments e WHERE e.tenant_id = "
        ));
        query.push_bind(tenant_id);
        if let Some(stage) = stage {
            query.push(" AND e.lifecycle_stage = ").push_bind(stage);
        }
        for (tag, op, value) in &filter.clauses {
            match tag {
                None => query.push(format_args!(" AND e.name {} ", op.sql())).push_bind(value.as_str()),
                Some(key) => query
                    .push(" AND EXISTS (SELECT 1 FROM mlflow_experiment_tags t WHERE t.tenant_id = e.tenant_id")
                    .push(" AND t.experiment_id = e.experiment_id AND t.key = ")
                    .push_bind(key.as_str())
                    .push(format_args!(" AND t.value {} ", op.sql()))
                    .push_bind(value.as_str())
                    .push(")"),
            };
        }
        query.push(" ORDER BY ");
        for (column, ascending) in &order.keys {
            query.push(format_args!("e.{column} {}, ", if *ascending { "ASC" } else { "DESC" }));
        }
        query.push("e.experiment_id LIMIT ").push_bind(limit).push(" OFFSET ").push_bind(offset);
        let rows: Vec<ExperimentRow> = query.build_query_as().fetch_all(&self.pool).await.map_err(db_error)?;
        self.experiments_tagged(tenant_id, rows.into_iter().map(experiment_of).collect()).await
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
                Some("mlflow_runs_experiment_active") => {
                    Error::invalid("experiment_id", "the experiment is deleted; restore it to make runs in it")
                }
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
    /// A page of `limit` points from `offset` when asked (`page`), else all.
    pub async fn mlflow_metric_history(
        &self,
        tenant_id: Uuid,
        run_id: Uuid,
        key: &str,
        page: Option<(i64, i64)>,
    ) -> Result<Vec<Metric>> {
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
             WHERE run_id = $1 AND tenant_id = $2 AND key = $3 ORDER BY step, timestamp, recorded_at
             LIMIT $4 OFFSET $5",
        )
        .bind(run_id)
        .bind(tenant_id)
        .bind(key)
        .bind(page.map(|(limit, _)| limit))
        .bind(page.map_or(0, |(_, offset)| offset))
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
        // Built from the parsed filter and order: every value is bound, and what is pushed as SQL
        // text is this file's own (column names, operators from a fixed set).
        let mut query = sqlx::QueryBuilder::<sqlx::Postgres>::new(concat!(
            "SELECT ",
            run_columns!(),
            " FROM mlflow_runs r WHERE r.tenant_id = "
        ));
        query.push_bind(tenant_id);
        if let Some(experiment_ids) = experiment_ids {
            query.push(" AND r.experiment_id = ANY(").push_bind(experiment_ids).push(")");
        }
        match (run_id, stage) {
            (Some(run_id), _) => {
                query.push(" AND r.id = ").push_bind(run_id);
            }
            (None, Some(stage)) => {
                query.push(" AND r.lifecycle_stage = ").push_bind(stage);
            }
            (None, None) => {}
        }
        for clause in &filter.clauses {
            query.push(" AND ");
            match clause {
                FilterClause::Param { key, op, value } | FilterClause::Tag { key, op, value } => {
                    let table =
                        if matches!(clause, FilterClause::Param { .. }) { "mlflow_params" } else { "mlflow_tags" };
                    query.push(format_args!("EXISTS (SELECT 1 FROM {table} x WHERE x.run_id = r.id AND x.key = "));
                    query.push_bind(key.as_str()).push(format_args!(" AND x.value {} ", op.sql()));
                    query.push_bind(value.as_str()).push(")");
                }
                FilterClause::Attribute { field, op, value } => {
                    query.push(format_args!("{} {} ", run_field_sql(*field), op.sql())).push_bind(value.as_str());
                }
                FilterClause::AttributeIn { field, values, negated } => {
                    let test = if *negated { "<> ALL(" } else { "= ANY(" };
                    query.push(format_args!("{} {test}", run_field_sql(*field))).push_bind(values.as_slice()).push(")");
                }
                FilterClause::Time { end, op, value } => {
                    let column = if *end { "r.end_time" } else { "r.start_time" };
                    let op = if *op == "!=" { "<>" } else { op };
                    query.push(format_args!("{column} {op} ")).push_bind(*value);
                }
                FilterClause::Metric(metric) => {
                    query.push(LATEST_METRIC_OF_RUN).push_bind(metric.key.as_str());
                    let op = if metric.op == "!=" { "<>" } else { metric.op };
                    query.push(format_args!(
                        " ORDER BY p.step DESC, p.timestamp DESC, p.recorded_at DESC LIMIT 1) {op} "
                    ));
                    query.push_bind(metric.value);
                }
            }
        }
        query.push(" ORDER BY ");
        for key in &order.keys {
            let direction = if key.ascending { "ASC" } else { "DESC" };
            match &key.by {
                OrderBy::StartTime => query.push("r.start_time"),
                OrderBy::EndTime => query.push("r.end_time"),
                OrderBy::RunName => query.push("r.name"),
                OrderBy::Status => query.push("r.status"),
                OrderBy::Metric(metric) => query
                    .push(LATEST_METRIC_OF_RUN)
                    .push_bind(metric.as_str())
                    .push(" ORDER BY p.step DESC, p.timestamp DESC, p.recorded_at DESC LIMIT 1)"),
                OrderBy::Param(param) => {
                    query.push("(SELECT x.value FROM mlflow_params x WHERE x.run_id = r.id AND x.key = ");
                    query.push_bind(param.as_str()).push(")")
                }
                OrderBy::Tag(tag) => {
                    query.push("(SELECT x.value FROM mlflow_tags x WHERE x.run_id = r.id AND x.key = ");
                    query.push_bind(tag.as_str()).push(")")
                }
            };
            // Runs without the value come last either way, as MLflow orders them.
            query.push(format_args!(" {direction} NULLS LAST, "));
        }
        query.push("r.start_time DESC, r.id LIMIT ").push_bind(limit).push(" OFFSET ").push_bind(offset);
        let rows: Vec<RunRow> = query.build_query_as().fetch_all(&self.pool).await.map_err(db_error)?;
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

async fn experiment_tag_upsert<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    tenant_id: Uuid,
    experiment_id: i64,
    tag: &KeyValue,
) -> Result<()> {
    // language=PostgreSQL
    sqlx::query(
        "INSERT INTO mlflow_experiment_tags (tenant_id, experiment_id, key, value) VALUES ($1, $2, $3, $4)
         ON CONFLICT ON CONSTRAINT mlflow_experiment_tags_pkey DO UPDATE SET value = excluded.value",
    )
    .bind(tenant_id)
    .bind(experiment_id)
    .bind(&tag.key)
    .bind(&tag.value)
    .execute(executor)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// How [`experiment_active_locked`] holds the experiment's row.
enum Lock {
    Update,
    Share,
}

/// Locks a tenant's experiment row in `tx` and checks it is active: not found, or "deleted;
/// restore it to `to_do`", otherwise.
async fn experiment_active_locked(
    tx: &mut sqlx::PgConnection,
    tenant_id: Uuid,
    experiment_id: i64,
    lock: Lock,
    to_do: &str,
) -> Result<()> {
    let statement = match lock {
        // language=PostgreSQL
        Lock::Update => {
            "SELECT lifecycle_stage FROM mlflow_experiments WHERE tenant_id = $1 AND experiment_id = $2 FOR UPDATE"
        }
        // language=PostgreSQL
        Lock::Share => {
            "SELECT lifecycle_stage FROM mlflow_experiments WHERE tenant_id = $1 AND experiment_id = $2 FOR SHARE"
        }
    };
    let stage: Option<String> = sqlx::query_scalar(statement)
        .bind(tenant_id)
        .bind(experiment_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_error)?;
    match stage.as_deref() {
        None => Err(Error::not_found(ObjectKind::Experiment)),
        Some("active") => Ok(()),
        Some(_) => Err(Error::invalid("experiment_id", format!("the experiment is deleted; restore it to {to_do}"))),
    }
}
