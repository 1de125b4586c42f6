//! Experiment tracking through MLflow's API (issue 42): experiments and runs of the caller's
//! tenant, read by its viewers and written by its members (`Action::ReadRuns`,
//! `Action::LogRuns`), with MLflow's rules ([`trainyard_core::tracking`]). Pages are offsets,
//! handed to the client as opaque tokens. Making an experiment or a run is audited (`mlflow.*`, refusals
//! too), run to its end even if the client goes; what is logged to a run is data, like an
//! engine's metrics, and is not. A job's replicas call with the job's token
//! (`MLFLOW_TRACKING_TOKEN`), which reaches the job's own run (`MLFLOW_RUN_ID`) and nothing else.

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::{ObjectKind, Problems};
use trainyard_core::tracking::{
    Experiment, ExperimentFilter, ExperimentOrder, KeyValue, LogBatch, MAX_SEARCH_RESULTS, Metric, Run, RunFilter,
    RunInfo, RunOrder, RunStatus,
};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::metrics::JobCaller;
use trainyard_store::tracking::RunNew;
use uuid::Uuid;

use trainyard_storage::keys;

use super::App;
use crate::storage::{Uploader, artifact_path, storage_error};

/// Who calls MLflow's API: a user with an API token, or a job's replica of a rank: rank 0 with
/// the job's token, another rank with its own replica token
/// ([`crate::storage::Storage::replica_token`]).
pub enum Tracker {
    User(Caller),
    Job(JobCaller, u32),
}

impl Tracker {
    /// Whether what the caller writes is dropped: a job's ranks but 0 log into its run as if
    /// they were kept (MLflow's answers, so unmodified code runs on every rank), and rank 0's
    /// writes alone are kept, so that each step is logged once (docs/tracking.md, "Ranks").
    fn writes_dropped(&self) -> bool {
        matches!(self, Tracker::Job(_, rank) if *rank > 0)
    }

    /// The user, for what only users do (making and finding experiments and runs), authorized
    /// for `action`.
    fn user(&self, action: Action) -> Result<&Caller> {
        let caller = self.user_unchecked()?;
        caller.authorize(action)?;
        Ok(caller)
    }

    /// The user, whose role the operation checks itself (audited operations audit refusals).
    fn user_unchecked(&self) -> Result<&Caller> {
        match self {
            Tracker::User(caller) => Ok(caller),
            Tracker::Job(..) => Err(Error::Forbidden(
                "a job token logs only to its job's own run (MLFLOW_RUN_ID); use an API token for the rest".into(),
            )),
        }
    }

    /// The tenant whose run `run_id` the caller may read or write: a user's by role, a job's
    /// only its own run (its id is the job's); another run is none to it.
    fn run_tenant(&self, action: Action, run_id: Uuid) -> Result<Uuid> {
        match self {
            Tracker::User(caller) => {
                caller.authorize(action)?;
                Ok(caller.tenant_id)
            }
            Tracker::Job(job, _) if job.job_id == run_id => Ok(job.tenant_id),
            Tracker::Job(..) => Err(Error::not_found(ObjectKind::Run)),
        }
    }
}

/// MLflow's `view_type` / `run_view_type` as a lifecycle stage (`None`: both).
fn view_stage(view: Option<&str>) -> Result<Option<&'static str>> {
    match view.unwrap_or("ACTIVE_ONLY") {
        "ACTIVE_ONLY" => Ok(Some("active")),
        "DELETED_ONLY" => Ok(Some("deleted")),
        "ALL" => Ok(None),
        other => Err(Error::invalid("view_type", format!("'{other}' is not one of ACTIVE_ONLY, DELETED_ONLY, ALL"))),
    }
}

/// MLflow's rules for an experiment tag: a key as a run's, a value up to 5,000 characters.
fn experiment_tag_check(problems: &mut Problems, key: &str, value: &str) {
    problems.check(trainyard_core::tracking::key_check("key", key));
    if value.chars().count() > MAX_EXPERIMENT_TAG_VALUE_CHARS {
        problems.add("value", format!("at most {MAX_EXPERIMENT_TAG_VALUE_CHARS} characters"));
    }
}

/// MLflow's limit on an experiment tag's value.
const MAX_EXPERIMENT_TAG_VALUE_CHARS: usize = 5000;

/// A page of results and the token of the next, if there is one.
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_page_token: Option<String>,
}

/// Where a page starts (the token is the offset) and how long it is.
fn page_bounds(max_results: Option<i64>, page_token: Option<&str>, default: i64) -> Result<(i64, i64)> {
    let limit = max_results.unwrap_or(default);
    if !(1..=MAX_SEARCH_RESULTS).contains(&limit) {
        return Err(Error::invalid("max_results", format!("between 1 and {MAX_SEARCH_RESULTS}")));
    }
    let offset = match page_token.filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => token
            .parse::<i64>()
            .ok()
            .filter(|o| *o >= 0)
            .ok_or_else(|| Error::invalid("page_token", "not a token this server handed out"))?,
    };
    Ok((limit, offset))
}

fn page_of<T>(items: Vec<T>, limit: i64, offset: i64) -> Page<T> {
    let next_page_token = (items.len() as i64 == limit).then(|| (offset + limit).to_string());
    Page { items, next_page_token }
}

/// A search of experiments as MLflow's client asks it.
pub struct ExperimentsSearch<'a> {
    pub filter: &'a str,
    pub order_by: &'a [String],
    /// MLflow's `view_type`: `ACTIVE_ONLY` (the default), `DELETED_ONLY`, `ALL`.
    pub view: Option<&'a str>,
    pub max_results: Option<i64>,
    pub page_token: Option<&'a str>,
}

/// A search of runs as MLflow's client asks it.
pub struct RunsSearch<'a> {
    pub experiment_ids: &'a [i64],
    pub filter: &'a str,
    pub order_by: &'a [String],
    /// MLflow's `run_view_type`: `ACTIVE_ONLY` (the default), `DELETED_ONLY`, `ALL`.
    pub view: Option<&'a str>,
    pub max_results: Option<i64>,
    pub page_token: Option<&'a str>,
}

/// A run created by a client: where, under what name, and its first tags.
pub struct RunCreate {
    pub experiment_id: i64,
    pub run_name: Option<String>,
    pub user_id: Option<String>,
    pub start_time: Option<i64>,
    pub tags: Vec<KeyValue>,
}

impl App {
    /// The replica a job's token (rank 0) or a replica token (another rank) stands for, while
    /// its job runs; a replica token whose proof is not this server's is refused (and counted
    /// against the client, as every failed authentication).
    pub async fn mlflow_job_authenticate(&self, token: &str, client: Option<std::net::IpAddr>) -> Result<Tracker> {
        match self.storage.replica_token_parts(token) {
            None => Ok(Tracker::Job(self.job_token_authenticate(token, client).await?, 0)),
            Some(Ok((job_token, rank))) => {
                Ok(Tracker::Job(self.job_token_authenticate(job_token, client).await?, rank))
            }
            Some(Err(())) => {
                let refused = async { Err(Error::Unauthenticated("the replica token is not valid".into())) };
                self.throttled(token, client, refused).await
            }
        }
    }

    pub async fn mlflow_experiment_create(&self, tracker: &Tracker, name: &str, tags: Vec<KeyValue>) -> Result<i64> {
        let (caller, name) = (tracker.user_unchecked()?.clone(), name.to_string());
        self.uncancelled(move |app| async move {
            let audit = Audit::by(&caller, "mlflow.experiment.create", format!("mlflow-experiment:{name}"));
            app.audited(&audit, app.mlflow_experiment_create_checked(&caller, &name, &tags, &audit)).await
        })
        .await
    }

    async fn mlflow_experiment_create_checked(
        &self,
        caller: &Caller,
        name: &str,
        tags: &[KeyValue],
        audit: &Audit,
    ) -> Result<i64> {
        caller.authorize(Action::LogRuns)?;
        let mut problems = Problems::default();
        if name.trim().is_empty() {
            problems.add("name", "an experiment needs a name");
        }
        for tag in tags {
            experiment_tag_check(&mut problems, &tag.key, &tag.value);
        }
        problems.into_result()?;
        self.store.mlflow_experiment_create(caller.tenant_id, name, tags, audit).await
    }

    /// Deletes an experiment (`deleted`: and its runs, out of searches) or restores it (and
    /// them), as MLflow does; the Default experiment, `0`, stays. Audited.
    pub async fn mlflow_experiment_delete(&self, tracker: &Tracker, experiment_id: i64, deleted: bool) -> Result<()> {
        let caller = tracker.user_unchecked()?.clone();
        self.uncancelled(move |app| async move {
            let action = if deleted { "mlflow.experiment.delete" } else { "mlflow.experiment.restore" };
            let audit = Audit::by(&caller, action, format!("mlflow-experiment:{experiment_id}"));
            let change = async {
                caller.authorize(Action::LogRuns)?;
                if experiment_id == 0 {
                    return Err(Error::invalid("experiment_id", "the Default experiment (0) cannot be deleted"));
                }
                app.store.mlflow_experiment_stage_set(caller.tenant_id, experiment_id, deleted, &audit).await
            };
            app.audited(&audit, change).await
        })
        .await
    }

    /// Renames an active experiment (MLflow's `experiments/update`). Audited.
    pub async fn mlflow_experiment_rename(&self, tracker: &Tracker, experiment_id: i64, name: &str) -> Result<()> {
        let (caller, name) = (tracker.user_unchecked()?.clone(), name.to_string());
        self.uncancelled(move |app| async move {
            let audit = Audit::by(&caller, "mlflow.experiment.rename", format!("mlflow-experiment:{experiment_id}"));
            let change = async {
                caller.authorize(Action::LogRuns)?;
                if name.trim().is_empty() {
                    return Err(Error::invalid("new_name", "an experiment needs a name"));
                }
                app.store.mlflow_experiment_rename(caller.tenant_id, experiment_id, &name, &audit).await
            };
            app.audited(&audit, change).await
        })
        .await
    }

    /// Sets a tag of an experiment (`Some` value; it overwrites) or deletes it (`None`).
    pub async fn mlflow_experiment_tag_set(
        &self,
        tracker: &Tracker,
        experiment_id: i64,
        key: &str,
        value: Option<&str>,
    ) -> Result<()> {
        let caller = tracker.user(Action::LogRuns)?;
        let mut problems = Problems::default();
        experiment_tag_check(&mut problems, key, value.unwrap_or_default());
        problems.into_result()?;
        self.store.mlflow_experiment_tag_set(caller.tenant_id, experiment_id, key, value).await
    }

    pub async fn mlflow_experiment_get(&self, tracker: &Tracker, experiment_id: i64) -> Result<Experiment> {
        let caller = tracker.user(Action::ReadRuns)?;
        self.store.mlflow_experiment_get(caller.tenant_id, experiment_id).await
    }

    pub async fn mlflow_experiment_by_name(&self, tracker: &Tracker, name: &str) -> Result<Experiment> {
        let caller = tracker.user(Action::ReadRuns)?;
        self.store.mlflow_experiment_by_name(caller.tenant_id, name).await
    }

    pub async fn mlflow_experiments_search(
        &self,
        tracker: &Tracker,
        search: ExperimentsSearch<'_>,
    ) -> Result<Page<Experiment>> {
        let caller = tracker.user(Action::ReadRuns)?;
        let parsed = (
            ExperimentFilter::parse(search.filter),
            ExperimentOrder::parse(search.order_by),
            view_stage(search.view),
            page_bounds(search.max_results, search.page_token, 1000),
        );
        let (filter, order, stage, (limit, offset)) = match parsed {
            (Ok(filter), Ok(order), Ok(stage), Ok(bounds)) => (filter, order, stage, bounds),
            (filter, order, stage, bounds) => {
                // Every bad part named at once.
                let mut problems = Problems::default();
                for err in [filter.err(), order.err(), stage.err(), bounds.err()].into_iter().flatten() {
                    problems.check(Err(err));
                }
                problems.into_result()?;
                return Err(Error::internal("an experiment search was refused without a reason"));
            }
        };
        let experiments =
            self.store.mlflow_experiments_search(caller.tenant_id, stage, &filter, &order, limit, offset).await?;
        Ok(page_of(experiments, limit, offset))
    }

    pub async fn mlflow_run_create(&self, tracker: &Tracker, run: RunCreate) -> Result<Run> {
        let caller = tracker.user_unchecked()?.clone();
        self.uncancelled(move |app| async move {
            let audit = Audit::by(&caller, "mlflow.run.create", format!("mlflow-experiment:{}", run.experiment_id));
            app.audited(&audit, app.mlflow_run_create_checked(&caller, run, &audit)).await
        })
        .await
    }

    async fn mlflow_run_create_checked(&self, caller: &Caller, run: RunCreate, audit: &Audit) -> Result<Run> {
        caller.authorize(Action::LogRuns)?;
        LogBatch { tags: run.tags.clone(), ..Default::default() }.validate()?;
        let start_time = run.start_time.unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
        let user_name = run.user_id.unwrap_or_else(|| caller.user.clone());
        let new = RunNew {
            experiment_id: run.experiment_id,
            name: run.run_name.as_deref().unwrap_or_default(),
            user_name: &user_name,
            start_time,
            tags: &run.tags,
        };
        self.store.mlflow_run_create(caller.tenant_id, caller.user_id, &new, audit).await
    }

    pub async fn mlflow_run_get(&self, tracker: &Tracker, run_id: Uuid) -> Result<Run> {
        let tenant_id = tracker.run_tenant(Action::ReadRuns, run_id)?;
        self.store.mlflow_run_get(tenant_id, run_id).await
    }

    /// Sets a run's status, end time or name (what is given).
    pub async fn mlflow_run_update(
        &self,
        tracker: &Tracker,
        run_id: Uuid,
        status: Option<&str>,
        end_time: Option<i64>,
        run_name: Option<&str>,
    ) -> Result<RunInfo> {
        let tenant_id = tracker.run_tenant(Action::LogRuns, run_id)?;
        if tracker.writes_dropped() {
            return Ok(self.store.mlflow_run_get(tenant_id, run_id).await?.info);
        }
        let status = status
            .map(|s| {
                RunStatus::parse(s).ok_or_else(|| {
                    Error::invalid(
                        "status",
                        format!("'{s}' is not one of RUNNING, SCHEDULED, FINISHED, FAILED, KILLED"),
                    )
                })
            })
            .transpose()?;
        let run_name = run_name.filter(|n| !n.is_empty());
        self.store.mlflow_run_update(tenant_id, run_id, status.map(RunStatus::as_str), end_time, run_name).await
    }

    /// Logs metrics, params and tags to a run, all or nothing, within MLflow's limits.
    pub async fn mlflow_log(&self, tracker: &Tracker, run_id: Uuid, batch: LogBatch) -> Result<()> {
        let tenant_id = tracker.run_tenant(Action::LogRuns, run_id)?;
        batch.validate()?;
        if tracker.writes_dropped() {
            return Ok(());
        }
        self.store.mlflow_log(tenant_id, run_id, &batch).await
    }

    /// Runs of these experiments matching the filter (the subset [`RunFilter`] serves).
    pub async fn mlflow_runs_search(&self, tracker: &Tracker, search: RunsSearch<'_>) -> Result<Page<Run>> {
        let caller = tracker.user(Action::ReadRuns)?;
        let filter = RunFilter::parse(search.filter)?;
        let order = RunOrder::parse(search.order_by)?;
        let stage = view_stage(search.view)?;
        let (limit, offset) = page_bounds(search.max_results, search.page_token, 1000)?;
        let runs = self
            .store
            .mlflow_runs_search(caller.tenant_id, search.experiment_ids, &filter, &order, stage, limit, offset)
            .await?;
        Ok(page_of(runs, limit, offset))
    }

    /// The params a job's code logged through MLflow to its run, by key (its job page shows
    /// them beside its template parameters).
    pub async fn job_logged_params(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<(String, String)>> {
        caller.authorize(Action::ReadJobs)?;
        let params = self.store.mlflow_job_params(caller.tenant_id, &[job_id]).await?;
        Ok(params.into_iter().map(|(_, key, value)| (key, value)).collect())
    }

    /// Deletes a run (`deleted`: out of searches, no logging) or restores it; nothing is removed.
    pub async fn mlflow_run_delete(&self, tracker: &Tracker, run_id: Uuid, deleted: bool) -> Result<()> {
        let tenant_id = tracker.run_tenant(Action::LogRuns, run_id)?;
        if tracker.writes_dropped() {
            return Ok(());
        }
        self.store.mlflow_run_stage_set(tenant_id, run_id, if deleted { "deleted" } else { "active" }).await
    }

    pub async fn mlflow_tag_delete(&self, tracker: &Tracker, run_id: Uuid, key: &str) -> Result<()> {
        let tenant_id = tracker.run_tenant(Action::LogRuns, run_id)?;
        if tracker.writes_dropped() {
            return Ok(());
        }
        self.store.mlflow_tag_delete(tenant_id, run_id, key).await
    }

    /// A metric's points by step then time: all of them, or a page when `max_results` is given
    /// (its token is the next page's).
    pub async fn mlflow_metric_history(
        &self,
        tracker: &Tracker,
        run_id: Uuid,
        key: &str,
        max_results: Option<i64>,
        page_token: Option<&str>,
    ) -> Result<Page<Metric>> {
        let tenant_id = tracker.run_tenant(Action::ReadRuns, run_id)?;
        if max_results.is_none() && page_token.is_none_or(str::is_empty) {
            let items = self.store.mlflow_metric_history(tenant_id, run_id, key, None).await?;
            return Ok(Page { items, next_page_token: None });
        }
        let (limit, offset) = page_bounds(max_results, page_token, MAX_SEARCH_RESULTS)?;
        let items = self.store.mlflow_metric_history(tenant_id, run_id, key, Some((limit, offset))).await?;
        Ok(page_of(items, limit, offset))
    }
}

/// An entry of an artefact folder as MLflow lists it: a name under the folder, whether it is a
/// folder itself, and a file's size.
pub struct ArtifactEntry {
    pub path: String,
    pub is_dir: bool,
    pub size: Option<u64>,
}

/// A downloaded artefact: its size and its bytes, streamed.
pub type ArtifactBody = (u64, BoxStream<'static, std::result::Result<Bytes, std::io::Error>>);

/// A run's artefacts: its artefact root is `mlflow-artifacts:/<run id>`. A job's run's are the
/// job's artefacts (`/api/v1/jobs/{id}/artifacts`, the job page's downloads), one store for both;
/// a run of its own (a laptop's, a notebook's) keeps its own, under the same tenant key for its
/// id, within the same limits.
impl App {
    /// The tenant of the run `run_id` when the caller may do `action` to it, and its job's id
    /// for a job's run (none for a run of its own).
    async fn mlflow_artifacts_run(
        &self,
        tracker: &Tracker,
        action: Action,
        run_id: Uuid,
    ) -> Result<(Uuid, Option<Uuid>, bool)> {
        let tenant_id = tracker.run_tenant(action, run_id)?;
        let (job_id, deleted) = self.store.mlflow_run_owner(tenant_id, run_id).await?;
        Ok((tenant_id, job_id, deleted))
    }

    /// Logged models are not kept yet: the caller may search them (and finds none).
    pub fn mlflow_logged_models_search(&self, tracker: &Tracker) -> Result<()> {
        tracker.user(Action::ReadRuns).map(|_| ())
    }

    /// Stores an artefact a client logs to a run (`mlflow.log_artifact`) at `path` (under the
    /// run's root). A job's run's is the job's artefact, checked, limited and recorded as every
    /// artefact upload is ([`App::artifact_upload`]); a run of its own's is checked and limited
    /// the same way (path, size, no file where a folder is) and recorded for the run.
    pub async fn mlflow_artifact_put<S, E>(&self, tracker: Tracker, run_id: Uuid, path: &str, body: S) -> Result<u64>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let (tenant_id, job_id, deleted) = self.mlflow_artifacts_run(&tracker, Action::LogRuns, run_id).await?;
        if deleted {
            return Err(Error::invalid("run_id", "the run is deleted; restore it to log to it"));
        }
        if tracker.writes_dropped() {
            artifact_path(path)?;
            let mut body = body;
            let mut size = 0u64;
            while let Some(chunk) = body.next().await {
                size += chunk.map_err(|e| Error::invalid("body", format!("the upload broke off: {e}")))?.len() as u64;
            }
            return Ok(size);
        }
        if job_id.is_some() {
            let uploader = match tracker {
                Tracker::User(caller) => Uploader::User(caller),
                Tracker::Job(job, _) => Uploader::Job(job),
            };
            return Ok(self.artifact_upload(uploader, run_id, path, body).await?.size_bytes);
        }
        let path = artifact_path(path)?;
        let key = keys::artifact_key(tenant_id, run_id, &path);
        self.artifact_name_free(tenant_id, run_id, &path, &key).await?;
        let uploaded =
            self.storage.objects.upload(&key, body, self.storage.max_artifact_bytes).await.map_err(storage_error)?;
        self.store.mlflow_artifact_record(tenant_id, run_id, path.as_str(), uploaded.size, &uploaded.sha256).await?;
        Ok(uploaded.size)
    }

    /// One artefact of a run, streamed.
    pub async fn mlflow_artifact_get(&self, tracker: &Tracker, run_id: Uuid, path: &str) -> Result<ArtifactBody> {
        let (tenant_id, _, _) = self.mlflow_artifacts_run(tracker, Action::ReadRuns, run_id).await?;
        let path = artifact_path(path)?;
        let (size, stream) = self
            .storage
            .objects
            .download(&keys::artifact_key(tenant_id, run_id, &path))
            .await
            .map_err(storage_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Artifact))?;
        Ok((size, stream.map_err(std::io::Error::other).boxed()))
    }

    /// What is directly under the folder `dir` of a run's artefacts (`""`: its root), by name;
    /// nothing for a file or a missing folder.
    pub async fn mlflow_artifacts_list(
        &self,
        tracker: &Tracker,
        run_id: Uuid,
        dir: &str,
    ) -> Result<Vec<ArtifactEntry>> {
        let (tenant_id, _, _) = self.mlflow_artifacts_run(tracker, Action::ReadRuns, run_id).await?;
        let dir = dir.trim_matches('/');
        if !dir.is_empty() {
            artifact_path(dir)?;
        }
        let objects =
            self.storage.objects.list(&keys::artifacts_prefix(tenant_id, run_id)).await.map_err(storage_error)?;
        let mut entries: std::collections::BTreeMap<String, ArtifactEntry> = std::collections::BTreeMap::new();
        for object in objects {
            let Some(path) = keys::artifact_path_of(tenant_id, run_id, &object.key) else { continue };
            let rest = if dir.is_empty() {
                path.as_str()
            } else {
                match path.strip_prefix(dir).and_then(|r| r.strip_prefix('/')) {
                    Some(rest) => rest,
                    None => continue,
                }
            };
            let entry = match rest.split_once('/') {
                Some((folder, _)) => ArtifactEntry { path: folder.to_string(), is_dir: true, size: None },
                None => ArtifactEntry { path: rest.to_string(), is_dir: false, size: Some(object.size) },
            };
            entries.entry(entry.path.clone()).or_insert(entry);
        }
        Ok(entries.into_values().collect())
    }
}
