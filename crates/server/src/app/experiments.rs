//! Experiments: hyperparameter searches whose trials are jobs of a template, under the tenant's
//! quota like any job. The searcher (`trainyard_searcher`) is a state machine over the events in
//! Postgres; [`App::experiments_advance`] (a background task, every second) turns what the
//! trials' jobs did into events, then makes every run the searcher decided exist as a job,
//! found again by its idempotency key. So a crash between any two statements decides the same
//! runs after it and submits none twice. See `docs/experiments.md`.

use std::collections::BTreeMap;

use trainyard_core::api::TemplateRun;
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::Problems;
use trainyard_core::experiments::{
    BestTrial, Experiment, ExperimentAsk, ExperimentAsked, ExperimentCreate, ExperimentDetail, ExperimentPreview,
    ExperimentState, ExperimentTell, Trial, TrialRun, TrialStatus,
};
use trainyard_core::job::JobState;
use trainyard_core::{Error, Result};
use trainyard_searcher::{Dimension, Event, Method, Outcome, Search, SearcherSpec, Space};
use trainyard_store::audit::Audit;
use trainyard_store::experiments::{ExperimentNew, ExperimentRow, ExperimentRunJob, ExperimentStanding};
use trainyard_templates::{Manifest, ParamKind};
use uuid::Uuid;

use super::App;
use super::templates::{RunMode, TemplateRunOutcome};

/// The template parameters a search sets itself: the training length of every trial, and, for
/// successive halving, where a run pauses and which checkpoints it resumes (pytorch-ddp has
/// them; a team's template that wants to be searched declares them too).
pub const LENGTH_PARAM: &str = "max_steps";
pub const PAUSE_PARAM: &str = "stop_at_step";
pub const CHECKPOINT_KEY_PARAM: &str = "checkpoint_key";

/// The most experiments a list shows.
const LIST_LIMIT: i64 = 200;

impl App {
    pub async fn experiment_create(&self, caller: &Caller, create: ExperimentCreate) -> Result<Experiment> {
        let audit = Audit::by(caller, "experiment.create", format!("experiment:{}", create.name));
        self.audited(&audit, async {
            caller.authorize(Action::WriteJobs)?;
            let version = self.experiment_check(caller, &create).await?;
            let request_hash = {
                use sha2::{Digest, Sha256};
                Sha256::digest(serde_json::to_vec(&create).map_err(Error::internal)?).to_vec()
            };
            let row = self
                .store
                .experiment_create(
                    &ExperimentNew {
                        tenant_id: caller.tenant_id,
                        name: &create.name,
                        created_by: caller.user_id,
                        template: &create.template,
                        template_version: &version,
                        params: to_json(&create.params)?,
                        space: to_json(&create.space)?,
                        searcher: to_json(&create.searcher)?,
                        budget_gpu_hours: create.budget_gpu_hours,
                        spare: create.spare,
                        idempotency_key: create.idempotency_key.as_deref(),
                        request_hash,
                    },
                    &audit,
                )
                .await?;
            self.experiments_wake.notify_one();
            experiment_of(&row)
        })
        .await
    }

    /// The rung ladder and the most a search costs, from the same checks a create makes; nothing
    /// is stored.
    pub async fn experiment_preview(&self, caller: &Caller, create: ExperimentCreate) -> Result<ExperimentPreview> {
        caller.authorize(Action::WriteJobs)?;
        self.experiment_check(caller, &create).await?;
        let ladder = trainyard_searcher::ladder(&create.searcher, &create.space);
        let (template, _) =
            self.templates.resolve(caller.tenant_id, &create.template, create.version.as_deref()).await?;
        let gpus_per_trial = gpus_of(&template.manifest, &create.params);
        let seconds_per_step = self.store.template_seconds_per_step(caller.tenant_id, &create.template).await?;
        // The most trials side by side: the searcher's limit, and the GPUs the trials could use
        // now: on spare room, those idle now; else the tenant's quotas' nominal plus borrowing
        // limit (the cluster's when it has none).
        let share = if create.spare {
            Some(self.gpus_idle_now().await?)
        } else {
            self.gpus_within_reach(caller.tenant_id).await?
        };
        let concurrent_trials = match (gpus_per_trial, share) {
            (0, _) | (_, None) => create.searcher.max_concurrent_trials,
            (per, Some(gpus)) => create.searcher.max_concurrent_trials.min((gpus / per as u64).max(1) as u32),
        };
        let mut notes = vec![format!(
            "typically {} training steps; at most {} when later trials keep beating earlier ones (asynchronous promotions stand); {} trials side by side",
            ladder.steps, ladder.steps_at_most, concurrent_trials
        )];
        let gpu_hours_at_most = if gpus_per_trial == 0 {
            Some(0.0)
        } else {
            seconds_per_step.map(|s| s * ladder.steps_at_most as f64 * gpus_per_trial as f64 / 3600.0)
        };
        // Each rung's runs side by side, rung after rung (a rung's runs wait for the rung below).
        let wall_seconds_at_most = seconds_per_step.map(|s| {
            let mut before = 0;
            ladder.rungs.iter().fold(0.0, |total, rung| {
                let waves = rung.trials_at_most.div_ceil(concurrent_trials.max(1) as u64);
                let seconds = waves as f64 * (rung.length - before) as f64 * s;
                before = rung.length;
                total + seconds
            })
        });
        match seconds_per_step {
            Some(s) => notes.push(format!("{s:.3} s a step, from your latest finished {} job", create.template)),
            None => notes.push(format!(
                "no finished {} job of your tenant reported steps yet: run one trial first for time and GPU-hour figures",
                create.template
            )),
        }
        if gpus_per_trial == 0 {
            notes.push("trials take no GPU: GPU-hours are 0".into());
        } else if create.spare {
            notes.push(format!(
                "trials run on spare room: {} GPUs idle now; a trial stops (and resumes later) when a job with quota needs its GPUs, so the wall time can grow",
                share.unwrap_or(0)
            ));
        }
        Ok(ExperimentPreview {
            ladder,
            gpus_per_trial,
            seconds_per_step,
            gpu_hours_at_most,
            wall_seconds_at_most,
            concurrent_trials,
            notes,
        })
    }

    pub async fn experiments_list(&self, caller: &Caller) -> Result<Vec<Experiment>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.experiments_list(caller.tenant_id, LIST_LIMIT).await?.iter().map(experiment_of).collect()
    }

    /// The experiment with every trial's runs, from the replay of its events.
    pub async fn experiment_show(&self, caller: &Caller, id: Uuid) -> Result<ExperimentDetail> {
        caller.authorize(Action::ReadJobs)?;
        let row = self.store.experiment_get(caller.tenant_id, id).await?;
        let (search, events) = self.experiment_replay(&row).await?;
        let jobs = self.store.experiment_run_jobs(id).await?;
        let gpu_hours = self.store.experiment_gpu_hours(id).await?;
        let experiment = experiment_of(&row)?;
        let ladder = trainyard_searcher::ladder(&experiment.searcher, &experiment.space);
        let trials = trials_of(&search, &jobs, experiment.state);
        self.search_keep(id, search, events);
        Ok(ExperimentDetail { trials, experiment, ladder, gpu_hours, events })
    }

    pub async fn experiment_pause(&self, caller: &Caller, id: Uuid) -> Result<Experiment> {
        self.experiment_command(caller, id, "experiment.pause", Event::Paused).await
    }

    pub async fn experiment_resume(&self, caller: &Caller, id: Uuid) -> Result<Experiment> {
        self.experiment_command(caller, id, "experiment.resume", Event::Resumed).await
    }

    /// Ends the search and cancels every trial's job still queued or running.
    pub async fn experiment_cancel(&self, caller: &Caller, id: Uuid) -> Result<Experiment> {
        let experiment = self.experiment_command(caller, id, "experiment.cancel", Event::Cancelled).await?;
        for job in self.store.experiment_run_jobs(id).await? {
            if !job_state(&job).is_some_and(JobState::is_terminal) {
                self.job_cancel(caller, job.job_id).await?;
            }
        }
        Ok(experiment)
    }

    /// An outside searcher's trial (`custom` searchers): its parameters are checked with the
    /// experiment's shared ones against the template, then it is an event like any, and its
    /// job is submitted at once.
    pub async fn experiment_ask(&self, caller: &Caller, id: Uuid, ask: ExperimentAsk) -> Result<ExperimentAsked> {
        let audit = Audit::by(caller, "experiment.ask", format!("experiment:{id}"));
        self.audited(&audit, async {
            caller.authorize(Action::ReadJobs)?;
            let row = self.store.experiment_get(caller.tenant_id, id).await?;
            caller.authorize(Action::WriteJobs)?;
            let (spec, _) = spec_of(&row)?;
            let mut problems = Problems::default();
            for name in [LENGTH_PARAM, PAUSE_PARAM, CHECKPOINT_KEY_PARAM] {
                if ask.params.contains_key(name) {
                    problems.add(format!("params.{name}"), "set by the search for each trial; leave it out");
                }
            }
            let (template, _) =
                self.templates.resolve(caller.tenant_id, &row.template, Some(&row.template_version)).await?;
            let mut params: serde_json::Map<String, serde_json::Value> =
                serde_json::from_value(row.params.clone()).map_err(Error::internal)?;
            params.extend(ask.params.clone());
            params.insert(LENGTH_PARAM.into(), spec.max_length.into());
            problems.check(template.check_params(&params).map(|_| ()));
            problems.into_result()?;
            for _ in 0..5 {
                let (search, seq) = self.experiment_replay(&row).await?;
                if spec.method != Method::Custom {
                    return Err(Error::Conflict(
                        "only an experiment with searcher method custom is asked for trials".into(),
                    ));
                }
                if !search.takes_asks() {
                    return Err(Error::Conflict(format!(
                        "the experiment takes no more trials (it is {}, with {} of its {} trials)",
                        row.state,
                        search.trials().len(),
                        spec.max_trials.unwrap_or(0)
                    )));
                }
                let trial = search.trials().len() as u32;
                let event = Event::Asked { trial, params: ask.params.clone().into_iter().collect() };
                if self.store.experiment_events_append(id, seq as i32, &[to_json(&event)?]).await? {
                    self.store.audit_done(&audit.clone().target(format!("experiment:{id}:trial:{trial}"))).await?;
                    self.experiment_advance(&row).await?;
                    let job_id = self
                        .store
                        .experiment_run_jobs(id)
                        .await?
                        .into_iter()
                        .find(|j| j.trial as u32 == trial)
                        .map(|j| j.job_id);
                    return Ok(ExperimentAsked { trial, job_id });
                }
            }
            Err(Error::Unavailable("the experiment is busy; ask again".into()))
        })
        .await
    }

    /// An outside searcher says it asks for no more trials.
    pub async fn experiment_tell(&self, caller: &Caller, id: Uuid, tell: ExperimentTell) -> Result<Experiment> {
        caller.authorize(Action::ReadJobs)?;
        let row = self.store.experiment_get(caller.tenant_id, id).await?;
        caller.authorize(Action::WriteJobs)?;
        // Nothing to tell, or an experiment already over (its last asked trial ended the
        // search): the experiment as it is.
        if !tell.finished || ExperimentState::parse(&row.state).is_some_and(ExperimentState::is_over) {
            return experiment_of(&row);
        }
        self.experiment_command(caller, id, "experiment.tell", Event::AskingDone).await
    }

    /// A user's pause, resume or cancel: an event at the end of the log (read again and put
    /// again when the driver stored one at that place first).
    async fn experiment_command(
        &self,
        caller: &Caller,
        id: Uuid,
        action: &'static str,
        event: Event,
    ) -> Result<Experiment> {
        let audit = Audit::by(caller, action, format!("experiment:{id}"));
        self.audited(&audit, async {
            caller.authorize(Action::ReadJobs)?;
            let row = self.store.experiment_get(caller.tenant_id, id).await?;
            caller.authorize(Action::WriteJobs)?;
            let state =
                ExperimentState::parse(&row.state).ok_or_else(|| Error::internal("unknown experiment state"))?;
            if state.is_over() {
                return Err(Error::Conflict(format!("the experiment is {} already", state.as_str())));
            }
            // Put at the end of the log as the replay found it; a writer that took that place
            // first (the driver) makes it read again.
            let value = to_json(&event)?;
            let mut stored = false;
            for _ in 0..5 {
                let (search, seq) = self.experiment_replay(&row).await?;
                if matches!(
                    (&event, search.outcome()),
                    (Event::Paused, Outcome::Paused) | (Event::Resumed, Outcome::Searching)
                ) {
                    stored = true;
                    break;
                }
                if self.store.experiment_events_append(id, seq as i32, std::slice::from_ref(&value)).await? {
                    self.store.audit_done(&audit).await?;
                    stored = true;
                    break;
                }
            }
            if !stored {
                return Err(Error::Unavailable("the experiment is busy; try again".into()));
            }
            self.experiment_advance(&row).await?;
            experiment_of(&self.store.experiment_get(caller.tenant_id, id).await?)
        })
        .await
    }

    /// Every unfinished experiment one step on (see the module's comment); one experiment's
    /// failure to advance is logged and does not hold the others back.
    pub async fn experiments_advance(&self) -> Result<()> {
        for row in self.store.experiments_unfinished().await? {
            if let Err(err) = self.experiment_advance(&row).await {
                if matches!(err, Error::Unavailable(_)) {
                    return Err(err);
                }
                tracing::warn!(experiment = %row.id, "could not advance the experiment: {err}");
            }
        }
        Ok(())
    }

    /// The GPUs no job holds now, over the cluster: what trials on spare room can take.
    async fn gpus_idle_now(&self) -> Result<u64> {
        let snapshot = self.scheduling_snapshot().await?;
        let total: u64 = snapshot.nodes.iter().map(|n| u64::from(n.gpus)).sum();
        let held: u64 = snapshot.running.iter().map(|r| r.demand.total_gpus()).sum();
        Ok(total.saturating_sub(held))
    }

    /// The GPUs the tenant's quotas let it use at most (nominal plus borrowing limit, over its
    /// GPU types); `None` when some quota borrows without limit or it has none.
    async fn gpus_within_reach(&self, tenant_id: Uuid) -> Result<Option<u64>> {
        let policies = self.store.tenant_policies().await?;
        let Some(policy) = policies.iter().find(|p| p.id == tenant_id) else { return Ok(None) };
        if policy.quotas.is_empty() {
            return Ok(None);
        }
        Ok(policy.quotas.iter().try_fold(0u64, |total, q| Some(total + q.nominal as u64 + q.borrowing_limit? as u64)))
    }

    /// The experiments' driver: on the leader, every experiment advanced after each wake-up (a
    /// create, a command) and at least each second, until `stop`. A panic in a pass is counted in
    /// the loop's health (`/readyz`) and the next pass runs.
    pub async fn experiments_drive(self, stop: tokio_util::sync::CancellationToken) {
        use futures::FutureExt;
        while !stop.is_cancelled() {
            if self.health.is_leading() {
                match std::panic::AssertUnwindSafe(self.experiments_advance()).catch_unwind().await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => tracing::warn!("the experiments' driver: {err}"),
                    Err(panic) => self.health.panicked(crate::scheduling::health::panic_message(&*panic)),
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.experiments_wake.notified()) => {}
            }
        }
    }

    /// The experiment's searcher brought up to date: the one kept in memory (see
    /// [`App::search_keep`]) with the events stored after those it took, or a replay of all of
    /// them (after a restart, or when two callers wanted it at once). The log is append-only
    /// and numbered, so both give the same state. Also the number of events taken.
    async fn experiment_replay(&self, row: &ExperimentRow) -> Result<(Search, u32)> {
        let kept = self.searches.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&row.id);
        let (mut search, mut taken) = match kept {
            Some(kept) => kept,
            None => {
                let (spec, space) = spec_of(row)?;
                (Search::new(spec, space), 0)
            }
        };
        for (seq, event) in self.store.experiment_events(row.id, taken as i32).await? {
            let event: Event = serde_json::from_value(event).map_err(Error::internal)?;
            search
                .apply(&event)
                .map_err(|why| Error::internal(format!("event {seq} of experiment {}: {why}", row.id)))?;
            taken += 1;
        }
        Ok((search, taken))
    }

    /// Keeps a searcher that has taken the first `taken` events, for the next pass; an ended
    /// search is let go.
    fn search_keep(&self, id: Uuid, search: Search, taken: u32) {
        if matches!(search.outcome(), Outcome::Searching | Outcome::Paused) {
            self.searches.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, (search, taken));
        }
    }

    async fn experiment_advance(&self, row: &ExperimentRow) -> Result<()> {
        let (mut search, seq) = self.experiment_replay(row).await?;
        let jobs: BTreeMap<(u32, u32), ExperimentRunJob> = self
            .store
            .experiment_run_jobs(row.id)
            .await?
            .into_iter()
            .map(|j| ((j.trial as u32, j.rung as u32), j))
            .collect();
        let (spec, _) = spec_of(row)?;

        // 1. What happened since: every ended run under way, in the order its job ended.
        let mut facts: Vec<(Option<chrono::DateTime<chrono::Utc>>, u32, Event)> = Vec::new();
        let under_way: Vec<u32> = search.under_way().collect();
        for trial in under_way {
            let rung = search.trials()[trial as usize].rung;
            let Some(job) = jobs.get(&(trial, rung)) else { continue };
            let Some(state) = job_state(job).filter(|s| s.is_terminal()) else { continue };
            let length = search.rung_lengths()[rung as usize];
            let event = if state == JobState::Succeeded {
                match self.store.job_metric_at(job.job_id, &spec.metric, length as i64).await? {
                    (Some(value), _) => Event::Reported { trial, rung, value },
                    // Nothing at all reached the server (it may have been away when the run
                    // reported): this trial fails, the search goes on.
                    (None, reported) if reported.is_empty() => Event::TrialFailed {
                        trial,
                        rung,
                        reason: format!("its job {} succeeded but reported no metric at all", job.job_id),
                    },
                    // Other metrics arrived, not the searched one: no trial can be ranked.
                    (None, reported) => Event::MetricMissing {
                        trial,
                        rung,
                        reason: format!(
                            "trial {trial}'s job {} reported no `{}` at or before step {length} (it reported: {})",
                            job.job_id,
                            spec.metric,
                            reported.join(", ")
                        ),
                    },
                }
            } else {
                let why = job.job_reason.clone().unwrap_or_else(|| format!("the job was {}", state.as_str()));
                Event::TrialFailed { trial, rung, reason: why }
            };
            facts.push((job.finished_at, trial, event));
        }
        facts.sort_by_key(|(at, trial, _)| (*at, *trial));
        let mut facts: Vec<Event> = facts.into_iter().map(|(_, _, e)| e).collect();
        if let Some(budget) = row.budget_gpu_hours
            && search.outcome() == Outcome::Searching
            && self.store.experiment_gpu_hours(row.id).await? >= budget
        {
            facts.push(Event::BudgetReached);
        }
        if !facts.is_empty() {
            let values: Vec<serde_json::Value> = facts
                .iter()
                .map(serde_json::to_value)
                .collect::<std::result::Result<_, _>>()
                .map_err(Error::internal)?;
            if !self.store.experiment_events_append(row.id, seq as i32, &values).await? {
                // Another writer (a preemption, a pause) took this place in the log: the next
                // pass reads it, on top of what this searcher has taken in so far.
                self.search_keep(row.id, search, seq);
                return Ok(());
            }
            for fact in &facts {
                search.apply(fact).map_err(Error::internal)?;
            }
        }
        let mut taken = seq + facts.len() as u32;

        // 2. Every decided run exists as a job, unless the search is over.
        let outcome = search.outcome();
        let ended = matches!(outcome, Outcome::Failed { .. } | Outcome::Cancelled);
        if !ended {
            let runs: Vec<_> =
                search.runs().iter().filter(|r| !jobs.contains_key(&(r.trial, r.rung))).cloned().collect();
            if !runs.is_empty() {
                let owner = match self.store.member_as_caller(row.tenant_id, row.created_by).await {
                    Ok(caller) => Some(caller),
                    Err(Error::NotFound { .. }) => None,
                    Err(err) => return Err(err),
                };
                for run in runs {
                    let submitted = match &owner {
                        Some(owner) => self.trial_submit(owner, row, &spec, &run).await,
                        None => {
                            Err(Error::Forbidden("the experiment's creator is no longer a member of the tenant".into()))
                        }
                    };
                    match submitted {
                        Ok(job_id) => self.store.experiment_run_link(row.id, run.trial, run.rung, job_id).await?,
                        Err(err @ (Error::Unavailable(_) | Error::Fenced(_))) => return Err(err),
                        Err(err) => {
                            // A trial the template refuses, a tenant being removed, a creator no
                            // longer a member: the search cannot go on, and says why.
                            let reason = format!("trial {}'s job could not be submitted: {err}", run.trial);
                            let event = Event::MetricMissing { trial: run.trial, rung: run.rung, reason };
                            let value = serde_json::to_value(&event).map_err(Error::internal)?;
                            if self.store.experiment_events_append(row.id, taken as i32, &[value]).await? {
                                search.apply(&event).map_err(Error::internal)?;
                                taken += 1;
                            } else {
                                return Ok(());
                            }
                            break;
                        }
                    }
                }
            }
        }

        // 3. An ended search stops what still runs, then says how it ended.
        let outcome = search.outcome();
        if matches!(outcome, Outcome::Failed { .. } | Outcome::Cancelled)
            && let Ok(owner) = self.store.member_as_caller(row.tenant_id, row.created_by).await
        {
            for job in self.store.experiment_run_jobs(row.id).await? {
                if !job_state(&job).is_some_and(JobState::is_terminal) {
                    self.job_cancel(&owner, job.job_id).await?;
                }
            }
        }
        let jobs = self.store.experiment_run_jobs(row.id).await?;
        let best = best_of(&search, &jobs)?.map(serde_json::to_value).transpose().map_err(Error::internal)?;
        let (state, reason) = match &outcome {
            Outcome::Searching => ("searching", None),
            Outcome::Paused => ("paused", None),
            Outcome::Completed => ("completed", None),
            Outcome::Failed { reason } => ("failed", Some(reason.as_str())),
            Outcome::Cancelled => ("cancelled", None),
        };
        self.store.experiment_standing_set(row.id, &ExperimentStanding { state, reason, best }).await?;
        self.search_keep(row.id, search, taken);
        Ok(())
    }

    /// Submits one decided run as a job of the experiment's template, as its creator, with an
    /// idempotency key naming the run: submitting it again finds the same job.
    async fn trial_submit(
        &self,
        owner: &Caller,
        row: &ExperimentRow,
        spec: &SearcherSpec,
        run: &trainyard_searcher::Run,
    ) -> Result<Uuid> {
        let mut params: serde_json::Map<String, serde_json::Value> =
            serde_json::from_value(row.params.clone()).map_err(Error::internal)?;
        params.extend(run.params.iter().map(|(k, v)| (k.clone(), v.clone())));
        params.insert(LENGTH_PARAM.into(), spec.max_length.into());
        if spec.method == Method::Asha {
            params.insert(PAUSE_PARAM.into(), run.length.into());
            params.insert(CHECKPOINT_KEY_PARAM.into(), format!("experiment-{}-trial-{}", row.id, run.trial).into());
        }
        let request = TemplateRun {
            version: Some(row.template_version.clone()),
            params,
            name: Some(format!("{}-t{}-r{}", row.name, run.trial, run.rung)),
            priority: 0,
            max_restarts: 0,
            idempotency_key: Some(format!("experiment:{}:trial:{}:rung:{}", row.id, run.trial, run.rung)),
            cache_wait_seconds: None,
            spare: row.spare,
        };
        match self.template_run(owner, &row.template, request, RunMode::Submit).await? {
            TemplateRunOutcome::Submitted(submitted) => Ok(match *submitted {
                trainyard_store::jobs::Submitted::Created(job) | trainyard_store::jobs::Submitted::Replayed(job) => {
                    job.id
                }
            }),
            _ => Err(Error::internal("a submit that did not submit")),
        }
    }

    /// Every rule a new experiment must keep, each broken one named at once; the template
    /// version its trials will run.
    async fn experiment_check(&self, caller: &Caller, create: &ExperimentCreate) -> Result<String> {
        let mut problems = Problems::default();
        problems.check(trainyard_core::job::check_name("name", &create.name));
        if let Some(key) = &create.idempotency_key
            && (key.is_empty() || key.len() > 200)
        {
            problems.add("idempotency_key", "1 to 200 bytes");
        }
        if let Some(budget) = create.budget_gpu_hours
            && !(budget.is_finite() && budget > 0.0)
        {
            problems.add("budget_gpu_hours", "a budget must be a number of GPU-hours above 0");
        }
        let mut searcher = trainyard_searcher::Problems::default();
        create.searcher.check(&create.space, &mut searcher);
        for (field, message) in searcher.0 {
            problems.add(field, message);
        }
        let template = match self.templates.resolve(caller.tenant_id, &create.template, create.version.as_deref()).await
        {
            Ok((template, _)) => Some(template),
            Err(Error::NotFound { .. }) => {
                problems.add("template", format!("no template {} in your tenant or the built-ins", create.template));
                None
            }
            Err(err) => return Err(err),
        };
        let Some(template) = template else {
            problems.into_result()?;
            unreachable!("a problem was added");
        };
        space_fits_template(&template.manifest, &create.space, &create.params, &create.searcher, &mut problems);
        // The corners of the space, with the shared parameters, pass the template's own checks
        // (patterns, volumes, required parameters), named as the user wrote them.
        if problems.count() == 0 {
            for corner in [Corner::Low, Corner::High] {
                let mut params = create.params.clone();
                for (name, dimension) in &create.space {
                    params.insert(name.clone(), corner.of(dimension));
                }
                params.insert(LENGTH_PARAM.into(), create.searcher.max_length.into());
                if let Err(err) = template.check_params(&params) {
                    for problem in err.field_problems() {
                        let name = problem.field.strip_prefix("params.").unwrap_or(&problem.field);
                        let field = if create.space.contains_key(name) {
                            format!("space.{name}")
                        } else {
                            problem.field.clone()
                        };
                        problems.add(field, problem.message);
                    }
                    break;
                }
            }
        }
        problems.into_result()?;
        Ok(template.manifest.version.to_string())
    }
}

/// The space's lowest or highest values, to check against the template.
#[derive(Clone, Copy)]
enum Corner {
    Low,
    High,
}

impl Corner {
    fn of(self, dimension: &Dimension) -> serde_json::Value {
        match (self, dimension) {
            (Corner::Low, Dimension::Int { min, .. }) => (*min).into(),
            (Corner::High, Dimension::Int { max, .. }) => (*max).into(),
            (Corner::Low, Dimension::Float { min, .. }) => (*min).into(),
            (Corner::High, Dimension::Float { max, .. }) => (*max).into(),
            (Corner::Low, Dimension::Categorical { values }) => values.first().cloned().unwrap_or_default(),
            (Corner::High, Dimension::Categorical { values }) => values.last().cloned().unwrap_or_default(),
        }
    }
}

/// Whether the space searches parameters the template has, with values of their types inside
/// their bounds, and leaves the parameters the search sets to it. Pure; every problem named.
pub fn space_fits_template(
    manifest: &Manifest,
    space: &Space,
    params: &serde_json::Map<String, serde_json::Value>,
    searcher: &SearcherSpec,
    problems: &mut Problems,
) {
    let mut set_by_search = vec![LENGTH_PARAM];
    if searcher.method == Method::Asha {
        set_by_search.extend([PAUSE_PARAM, CHECKPOINT_KEY_PARAM]);
    }
    for name in &set_by_search {
        if !manifest.parameters.contains_key(*name) {
            problems.add(
                "template",
                format!(
                    "{} has no parameter {name}; a {} search sets {} (pytorch-ddp has them)",
                    manifest.name,
                    serde_json::to_value(searcher.method)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    set_by_search.join(", ")
                ),
            );
        }
        if params.contains_key(*name) {
            problems.add(format!("params.{name}"), "set by the search for each trial; leave it out");
        }
    }
    for (name, dimension) in space {
        let field = format!("space.{name}");
        if set_by_search.contains(&name.as_str()) {
            problems.add(&field, "set by the search for each trial; it cannot be searched");
            continue;
        }
        if params.contains_key(name) {
            problems.add(&field, "also given in params; search it or fix it, not both");
        }
        let Some(param) = manifest.parameters.get(name) else {
            let known: Vec<&str> = manifest.parameters.keys().map(String::as_str).collect();
            problems.add(&field, format!("{} has no parameter {name}; it has {}", manifest.name, known.join(", ")));
            continue;
        };
        let numeric = |lo: f64, hi: f64, problems: &mut Problems| {
            if let Some(min) = param.min
                && lo < min
            {
                problems.add(format!("{field}.min"), format!("{lo} is below the template's minimum {min}"));
            }
            if let Some(max) = param.max
                && hi > max
            {
                problems.add(format!("{field}.max"), format!("{hi} is above the template's maximum {max}"));
            }
        };
        match (param.kind, dimension) {
            (ParamKind::Int, Dimension::Int { min, max, .. }) => numeric(*min as f64, *max as f64, problems),
            (ParamKind::Float, Dimension::Float { min, max, .. }) => numeric(*min, *max, problems),
            (ParamKind::Float, Dimension::Int { min, max, .. }) => numeric(*min as f64, *max as f64, problems),
            (ParamKind::Int | ParamKind::Float, Dimension::Categorical { values }) => {
                if let Some(bad) = values
                    .iter()
                    .find(|v| !(v.is_i64() || v.is_u64() || (param.kind == ParamKind::Float && v.is_f64())))
                {
                    problems.add(format!("{field}.values"), format!("{bad} is not a {} value", kind_name(param.kind)));
                } else {
                    let numbers: Vec<f64> = values.iter().filter_map(serde_json::Value::as_f64).collect();
                    let lo = numbers.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = numbers.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    if !numbers.is_empty() {
                        numeric(lo, hi, problems);
                    }
                }
            }
            (ParamKind::Enum, Dimension::Categorical { values }) => {
                let choices = param.choices.clone().unwrap_or_default();
                for value in values {
                    if !value.as_str().is_some_and(|v| choices.iter().any(|c| c == v)) {
                        problems
                            .add(format!("{field}.values"), format!("{value} is not one of {}", choices.join(", ")));
                    }
                }
            }
            (ParamKind::Bool, Dimension::Categorical { values })
                if values.iter().all(serde_json::Value::is_boolean) => {}
            (ParamKind::String | ParamKind::Path | ParamKind::Dataset, Dimension::Categorical { values })
                if values.iter().all(serde_json::Value::is_string) => {}
            (kind, _) => problems.add(
                &field,
                format!(
                    "{name} is a {} parameter; {}",
                    kind_name(kind),
                    match kind {
                        ParamKind::Int => "search it with type int or categorical integers",
                        ParamKind::Float => "search it with type float, int or categorical numbers",
                        _ => "search it with type categorical, values of its type",
                    }
                ),
            ),
        }
    }
}

fn kind_name(kind: ParamKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// GPUs one trial takes: the template's replicas x GPUs per replica, at the parameters given
/// (or their defaults).
fn gpus_of(manifest: &Manifest, params: &serde_json::Map<String, serde_json::Value>) -> u32 {
    let value = |name: &str| {
        params
            .get(name)
            .or_else(|| manifest.parameters.get(name).and_then(|p| p.default.as_ref()))
            .and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
    };
    let replicas = value("replicas").unwrap_or(1).max(1);
    (value("gpus").unwrap_or(0) * replicas) as u32
}

fn spec_of(row: &ExperimentRow) -> Result<(SearcherSpec, Space)> {
    let spec = serde_json::from_value(row.searcher.clone()).map_err(Error::internal)?;
    let space = serde_json::from_value(row.space.clone()).map_err(Error::internal)?;
    Ok((spec, space))
}

fn job_state(job: &ExperimentRunJob) -> Option<JobState> {
    JobState::parse(&job.job_state)
}

fn experiment_of(row: &ExperimentRow) -> Result<Experiment> {
    let state = ExperimentState::parse(&row.state).ok_or_else(|| Error::internal("unknown experiment state"))?;
    let (searcher, space) = spec_of(row)?;
    Ok(Experiment {
        id: row.id,
        name: row.name.clone(),
        template: row.template.clone(),
        template_version: row.template_version.clone(),
        state,
        reason: row.reason.clone(),
        best: row.best.clone().map(serde_json::from_value).transpose().map_err(Error::internal)?,
        params: serde_json::from_value(row.params.clone()).map_err(Error::internal)?,
        space,
        searcher,
        budget_gpu_hours: row.budget_gpu_hours,
        spare: row.spare,
        created_by: row.created_by,
        created_at: row.created_at,
        ended_at: row.ended_at,
    })
}

fn best_of(search: &Search, jobs: &[ExperimentRunJob]) -> Result<Option<BestTrial>> {
    let Some(best) = search.best() else { return Ok(None) };
    let params = search.trials()[best.trial as usize].params.clone().into_iter().collect();
    let job_id = jobs.iter().find(|j| j.trial as u32 == best.trial && j.rung as u32 == best.rung).map(|j| j.job_id);
    Ok(Some(BestTrial { trial: best.trial, rung: best.rung, value: best.value, params, job_id }))
}

/// Each trial as people read it: its runs (with their jobs) and where it stands.
fn trials_of(search: &Search, jobs: &[ExperimentRunJob], state: ExperimentState) -> Vec<Trial> {
    let lengths = search.rung_lengths();
    let top = lengths.len() as u32 - 1;
    search
        .trials()
        .iter()
        .map(|t| {
            let runs = (0..=t.rung)
                .map(|rung| {
                    let job = jobs.iter().find(|j| j.trial as u32 == t.trial && j.rung as u32 == rung);
                    TrialRun {
                        rung,
                        length: lengths[rung as usize],
                        job_id: job.map(|j| j.job_id),
                        job_state: job.map(|j| j.job_state.clone()),
                        value: t.values.get(rung as usize).copied(),
                    }
                })
                .collect();
            let status = if t.failed.is_some() {
                TrialStatus::Failed
            } else if t.running && state.is_over() {
                TrialStatus::Stopped
            } else if t.running {
                TrialStatus::Running
            } else if t.rung == top {
                TrialStatus::Completed
            } else {
                TrialStatus::Paused
            };
            Trial {
                trial: t.trial,
                params: t.params.clone().into_iter().collect(),
                status,
                rung: t.rung,
                runs,
                failure: t.failed.clone(),
                preemptions: t.preemptions,
            }
        })
        .collect()
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(Error::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Manifest {
        let bundle = trainyard_templates::Bundle {
            manifest: include_str!("../../../../templates/pytorch-ddp/template.yaml").into(),
            // The manifest names its engine folder; its files do not matter here.
            files: [("engine/train.py".to_string(), Vec::new())].into(),
        };
        trainyard_templates::Template::load(&bundle).unwrap().manifest
    }

    fn fields(space: serde_json::Value, params: serde_json::Value, method: &str) -> Vec<String> {
        let space: Space = serde_json::from_value(space).unwrap();
        let params = serde_json::from_value(params).unwrap();
        let searcher: SearcherSpec = serde_json::from_value(
            serde_json::json!({"method": method, "metric": "loss", "max_length": 64, "max_trials": 4}),
        )
        .unwrap();
        let mut problems = Problems::default();
        space_fits_template(&manifest(), &space, &params, &searcher, &mut problems);
        problems
            .into_result()
            .err()
            .map(|e| e.field_problems().into_iter().map(|p| p.field).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_space_over_the_templates_parameters_fits() {
        let space = serde_json::json!({
            "lr": {"type": "float", "min": 0.0001, "max": 0.1, "log": true},
            "batch_size": {"type": "categorical", "values": [16, 32]},
            "precision": {"type": "categorical", "values": ["fp32", "bf16"]},
        });
        assert_eq!(fields(space, serde_json::json!({"data": "/d"}), "asha"), Vec::<String>::new());
    }

    #[test]
    fn every_misfit_is_named_by_its_field() {
        let space = serde_json::json!({
            "lrr": {"type": "float", "min": 0.1, "max": 1.0},
            "lr": {"type": "float", "min": 0.1, "max": 20.0},
            "epochs": {"type": "float", "min": 1.0, "max": 2.0},
            "precision": {"type": "categorical", "values": ["fp8"]},
            "stop_at_step": {"type": "int", "min": 1, "max": 2},
        });
        let got = fields(space, serde_json::json!({"max_steps": 5}), "asha");
        for field in [
            "space.lrr",
            "space.lr.max",
            "space.epochs",
            "space.precision.values",
            "space.stop_at_step",
            "params.max_steps",
        ] {
            assert!(got.contains(&field.to_string()), "{field} not in {got:?}");
        }
    }
}
