//! Task templates: list, show, publish, and running one (parameters checked, datasets and
//! volumes resolved, rendered to a job spec).

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use trainyard_core::api::{DryRun, Job, Schedule, TemplateDetail, TemplateRun, TemplateSummary, TemplateUpload};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::job::JobSubmission;
use trainyard_core::rerun::{RerunInputs, RerunLink, UnpinnedInput, pinned_image, unpinned_inputs};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::jobs::Submitted;
use trainyard_store::templates::Published;

use super::App;

/// What a template run did.
pub enum TemplateRunOutcome {
    DryRun(Box<DryRun>),
    WhatIf(Schedule),
    Submitted(Box<Submitted>),
}

/// How far a template run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    Submit,
    /// Render and check; return the spec.
    DryRun,
    /// Render and check; say when it would start.
    WhatIf,
}

impl App {
    /// A template as the caller's tenant sees it (a built-in or one of the tenant's), with its
    /// parsed manifest: what the submit form is generated from.
    pub async fn template_resolve(
        &self,
        caller: &Caller,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<trainyard_templates::Template>> {
        caller.authorize(Action::ReadJobs)?;
        Ok(self.templates.resolve(caller.tenant_id, name, version).await?.0)
    }

    /// Submits (or, with `dry_run`, only renders) a job from a template: the parameters are
    /// checked against the template's types and bounds, the manifest is rendered to a spec, and
    /// the job records template name, version and digest, the parameters as given, and the spec.
    pub async fn template_run(
        &self,
        caller: &Caller,
        template: &str,
        run: TemplateRun,
        mode: RunMode,
    ) -> Result<TemplateRunOutcome> {
        let audit = Audit::by(caller, "job.submit", format!("template:{template}"));
        let run = self.template_run_checked(caller, template, run, mode, &audit, None);
        // Only a submit changes anything; a dry run or what-if is not audited.
        if mode == RunMode::Submit { self.audited(&audit, run).await } else { run.await }
    }

    async fn template_run_checked(
        &self,
        caller: &Caller,
        template: &str,
        run: TemplateRun,
        mode: RunMode,
        audit: &Audit,
        rerun: Option<PinnedRerun>,
    ) -> Result<TemplateRunOutcome> {
        caller.authorize(Action::WriteJobs)?;
        let request_hash = {
            let mut hasher = Sha256::new();
            hasher.update(b"template\0");
            hasher.update(template.as_bytes());
            hasher.update(serde_json::to_vec(&run).map_err(Error::internal)?);
            hasher.finalize().to_vec()
        };
        // A rerun runs the exact template the original ran (by its digest); a run names a version.
        let (template, rerun) = match rerun {
            Some(PinnedRerun { template, link }) => (template, Some(link)),
            None => (self.templates.resolve(caller.tenant_id, template, run.version.as_deref()).await?.0, None),
        };
        let mut values = template.check_params(&run.params)?;
        // A dataset parameter names a registered version: the job gets its URI and records
        // exactly which version and content it used. So does a path parameter given as
        // NAME@VERSION (a folder name with '@' in it is written `./name@x`); a path parameter
        // given as a registered version's folder records that version too. A version pushed to
        // the object store reaches the job as `store:NAME@VERSION` (its URI), which the engine
        // reads from this server; written so, the parameter must name such a version.
        let mut datasets = Vec::new();
        let mut folders: Vec<(String, String)> = Vec::new();
        for (param, spec) in &template.manifest.parameters {
            let Some(reference) = values.get(param).and_then(|v| v.as_str()).map(str::to_string) else { continue };
            let field = || format!("params.{param}");
            let is_path = spec.kind == trainyard_templates::ParamKind::Path;
            let named_store = trainyard_core::names::DatasetRef::parse_store(&reference);
            let dataset_ref = match (spec.kind, named_store) {
                (trainyard_templates::ParamKind::Dataset | trainyard_templates::ParamKind::Path, Some(parsed)) => {
                    parsed.map_err(|message| Error::invalid(field(), message))?
                }
                (trainyard_templates::ParamKind::Dataset, None) => trainyard_core::names::DatasetRef::parse(&reference)
                    .map_err(|message| Error::invalid(field(), message))?,
                (trainyard_templates::ParamKind::Path, None) if reference.contains('@') && !reference.contains('/') => {
                    match trainyard_core::names::DatasetRef::parse(&reference) {
                        Ok(dataset_ref) => dataset_ref,
                        // Not a dataset version's name: a path after all.
                        Err(_) => continue,
                    }
                }
                (trainyard_templates::ParamKind::Path, None) if reference.starts_with('/') => {
                    folders.push((param.clone(), reference));
                    continue;
                }
                _ => continue,
            };
            let store_named = reference.starts_with(trainyard_core::names::STORE_DATASET_PREFIX);
            let (name, version) = (dataset_ref.name(), dataset_ref.version());
            let dataset = self.store.dataset_get(caller.tenant_id, name, version).await.map_err(|err| match err {
                Error::NotFound { .. } => Error::invalid(
                    field(),
                    if is_path && !store_named {
                        format!("no dataset {reference} is registered in your tenant (a file or folder named so: ./{reference})")
                    } else {
                        format!("no dataset {dataset_ref} is registered in your tenant")
                    },
                ),
                other => other,
            })?;
            if store_named && dataset.store_prefix.is_none() {
                return Err(Error::invalid(
                    field(),
                    format!(
                        "{dataset_ref} is registered at {}, not on Trainyard's object store; name it {dataset_ref} (or push it: `yard datasets push`)",
                        dataset.uri
                    ),
                ));
            }
            values.insert(param.clone(), serde_json::Value::String(dataset.uri.clone()));
            datasets.push(trainyard_core::api::DatasetUse {
                param: param.clone(),
                name: dataset.name,
                version: dataset.version,
                uri: dataset.uri,
                content_hash: dataset.content_hash,
            });
        }
        if !folders.is_empty() {
            let uris: Vec<String> = folders.iter().map(|(_, path)| path.clone()).collect();
            let registered = self.store.datasets_at(caller.tenant_id, &uris).await?;
            for (param, path) in folders {
                // The newest version registered at that folder (versions are listed oldest first).
                if let Some(dataset) = registered.iter().rev().find(|d| d.uri == path) {
                    datasets.push(trainyard_core::api::DatasetUse {
                        param,
                        name: dataset.name.clone(),
                        version: dataset.version.clone(),
                        uri: dataset.uri.clone(),
                        content_hash: dataset.content_hash.clone(),
                    });
                }
            }
        }
        // A volume parameter names one of the tenant's volumes: the job gets its path, and the
        // spec lists it so that a cluster executor mounts it there. One the template makes
        // (`create_size`) is made only once the whole run is checked, just before the submit,
        // and removed again if the submit fails: a refused run leaves nothing behind.
        let mut volumes: Vec<trainyard_core::job::VolumeMount> = Vec::new();
        let mut to_make: Vec<(String, String, String)> = Vec::new(); // (parameter, volume, size)
        for (param, spec) in &template.manifest.parameters {
            if spec.kind != trainyard_templates::ParamKind::Volume {
                continue;
            }
            let Some(name) = values.get(param).and_then(|v| v.as_str()).filter(|v| !v.is_empty()).map(str::to_string)
            else {
                continue;
            };
            let path = match self.volume_path(caller.tenant_id, &name).await {
                Ok(path) => path,
                Err(Error::NotFound { .. }) => match &spec.create_size {
                    // The template makes what it names: a durable place shared by the tenant's
                    // jobs (checkpoints that outlive pods), charged to its storage quota. The
                    // path is the one it will have (a preview or what-if makes nothing).
                    Some(size) => {
                        if mode == RunMode::Submit && !to_make.iter().any(|(_, made, _)| *made == name) {
                            to_make.push((param.clone(), name.clone(), size.clone()));
                        }
                        self.executor.volume_path(&name).unwrap_or_else(|| {
                            self.storage.volume_dir(caller.tenant_id, &name).to_string_lossy().into_owned()
                        })
                    }
                    None => {
                        return Err(Error::invalid(
                            format!("params.{param}"),
                            format!("no volume {name} exists in your tenant"),
                        ));
                    }
                },
                Err(other) => return Err(other),
            };
            if !volumes.iter().any(|v| v.name == name) {
                volumes.push(trainyard_core::job::VolumeMount { name, path: path.clone() });
            }
            values.insert(param.clone(), serde_json::Value::String(path));
        }
        // A checkpoint parameter names another job's checkpoint (`JOB[:STEP]`): the job gets the
        // file's path as its replicas see it, mounts the volume it is on, and records which job
        // and step it started from (the newest step at submit when none was named).
        let mut init_from = None;
        for (param, spec) in &template.manifest.parameters {
            if spec.kind != trainyard_templates::ParamKind::Checkpoint {
                continue;
            }
            let Some(text) = values.get(param).and_then(|v| v.as_str()).filter(|v| !v.is_empty()).map(str::to_string)
            else {
                continue;
            };
            let (path, mount, source) = self.checkpoint_resolve(caller, &format!("params.{param}"), &text).await?;
            if !volumes.iter().any(|v| v.name == mount.name) {
                volumes.push(mount);
            }
            values.insert(param.clone(), serde_json::Value::String(path));
            init_from = Some(source);
        }
        let spec = template.render(&values)?;
        // The job-level fields pass the same checks as a direct submit.
        let mut valid = JobSubmission {
            name: Some(run.name.clone().unwrap_or_else(|| template.name().to_string())),
            command: spec.command.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            resources: spec.resources.clone(),
            replicas: spec.replicas,
            priority: run.priority,
            max_restarts: run.max_restarts,
            idempotency_key: run.idempotency_key.clone(),
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: run.cache_wait_seconds,
            spare: run.spare,
            after_ok: Vec::new(),
            after_any: Vec::new(),
            after_failed: Vec::new(),
            array: None,
        }
        .validate()?;
        valid.spec.template = spec.template;
        valid.spec.volumes = volumes;
        valid.datasets = datasets;
        valid.init_from = init_from;
        // A rerun on a cluster runs its original's image by digest.
        valid.spec.image = rerun.as_ref().and_then(|link| link.image.clone());
        valid.rerun = rerun;
        valid.expected_runtime_seconds =
            template.manifest.expected_runtime_seconds().map(|s| s.min(u64::from(u32::MAX)) as u32);
        self.fits_cluster(&valid.spec)?;
        if mode == RunMode::WhatIf {
            let schedule = self.what_if_of(caller, &valid).await?;
            return Ok(TemplateRunOutcome::WhatIf(schedule));
        }
        if mode == RunMode::DryRun {
            let values = serde_json::to_value(&values).map_err(Error::internal)?;
            return Ok(TemplateRunOutcome::DryRun(Box::new(DryRun { name: valid.name, values, spec: valid.spec })));
        }
        let params = serde_json::Value::Object(run.params);
        let mut made = Vec::new();
        for (param, name, size) in &to_make {
            match self.volume_for_template(caller, param, name, size).await {
                Ok(Some(_)) => made.push(name.as_str()),
                Ok(None) => {} // another run made it a moment ago: it is theirs
                Err(err) => {
                    self.volumes_unmade(caller, &made).await;
                    return Err(err);
                }
            }
        }
        let submitted = match self.store.job_submit(caller, valid, Some(&params), &request_hash, audit).await {
            Ok(submitted) => submitted,
            Err(err) => {
                self.volumes_unmade(caller, &made).await;
                return Err(err);
            }
        };
        if matches!(submitted, Submitted::Created(_)) {
            self.scheduling_changed();
        }
        Ok(TemplateRunOutcome::Submitted(Box::new(submitted)))
    }

    pub async fn templates_list(&self, caller: &Caller) -> Result<Vec<TemplateSummary>> {
        caller.authorize(Action::ReadJobs)?;
        self.templates.list(caller.tenant_id).await
    }

    pub async fn template_show(&self, caller: &Caller, name: &str, version: Option<&str>) -> Result<TemplateDetail> {
        caller.authorize(Action::ReadJobs)?;
        Ok(self.templates.resolve(caller.tenant_id, name, version).await?.1)
    }

    /// Keeps this server's built-in template versions (by digest) for reruns after upgrades.
    pub async fn builtin_templates_keep(&self) -> Result<()> {
        self.templates.keep_builtins().await
    }

    pub async fn template_publish(
        &self,
        caller: &Caller,
        upload: TemplateUpload,
    ) -> Result<(TemplateDetail, Published)> {
        let audit = Audit::by(caller, "template.publish", "template");
        self.audited(&audit, async {
            caller.authorize(Action::WriteJobs)?;
            self.templates.publish(caller, upload, &audit).await
        })
        .await
    }
}

impl App {
    /// Creates the volume a template's parameter names (its `create_size`), read-write for every
    /// replica: its path, or `None` when another run created it a moment ago. A refusal (the
    /// storage quota) names the parameter.
    async fn volume_for_template(
        &self,
        caller: &Caller,
        param: &str,
        name: &str,
        size: &str,
    ) -> Result<Option<String>> {
        let size = trainyard_core::resources::Memory::parse(size).map_err(Error::internal)?;
        let request = trainyard_core::api::VolumeCreate {
            name: name.to_string(),
            size,
            access_mode: trainyard_core::api::AccessMode::ReadWriteMany,
            storage_class: None,
        };
        match self.volume_create(caller, request).await {
            Ok(volume) => {
                tracing::info!(tenant = %caller.tenant, volume = name, "volume created for a template run");
                Ok(Some(volume.path))
            }
            // Another run created it a moment ago.
            Err(Error::Conflict(_)) => Ok(None),
            Err(Error::InvalidInput { message, .. }) => Err(Error::invalid(
                format!("params.{param}"),
                format!(
                    "volume {name} does not exist and could not be created ({message}); create it with `yard volumes create {name} --size ...` or set {param} to another volume or to \"\""
                ),
            )),
            Err(other) => Err(other),
        }
    }

    /// Removes the volumes a run made before its submit failed (the failure is what the caller
    /// hears; a removal that fails is logged, and the volume is the tenant's to delete).
    async fn volumes_unmade(&self, caller: &Caller, made: &[&str]) {
        for name in made {
            if let Err(err) = self.volume_delete(caller, name).await {
                tracing::warn!(tenant = %caller.tenant, volume = name, %err, "cannot remove the volume of a refused run");
            }
        }
    }
}

/// What a rerun did.
pub enum RerunOutcome {
    Submitted(Box<Job>),
    /// `what_if`: when it would start; nothing queued.
    WhatIf(trainyard_core::api::Schedule),
}

/// A rerun of a job from a template: the template the original ran (resolved by its digest)
/// and the new job's link to the original.
struct PinnedRerun {
    template: Arc<trainyard_templates::Template>,
    link: RerunLink,
}

impl App {
    /// Runs a job again: a job from a template with the template it ran (by digest: a built-in
    /// from an earlier Trainyard comes from the kept versions), its parameters as given (dataset
    /// versions are immutable, so `name@version` is the same data) with `set` changed, its code
    /// archive by digest; a direct job with its spec. The new job links to the original with the
    /// overrides. What can no longer be had (a template version or code archive that is gone)
    /// is refused, naming it; so is what cannot be pinned (a file on the machine, an image tag:
    /// [`trainyard_core::rerun`]) unless the request accepts it, and then the new job and its run
    /// record list what was accepted.
    pub async fn job_rerun(
        &self,
        caller: &Caller,
        original_id: uuid::Uuid,
        request: trainyard_core::api::RerunRequest,
    ) -> Result<RerunOutcome> {
        caller.authorize(Action::ReadJobs)?;
        let original = self.store.job_get(caller.tenant_id, original_id).await?;
        caller.authorize(Action::WriteJobs)?;
        if let Some(code) = &original.spec.code {
            self.code_size(caller.tenant_id, &code.digest).await.map_err(|_| {
                Error::Conflict(format!(
                    "the job's code archive {} is no longer in the tenant's storage; submit the code again",
                    code.digest
                ))
            })?;
        }
        let template = self.template_of(caller, &original).await?;
        let RerunPins { unpinned, image } =
            self.rerun_pins(caller, &original, template.as_deref(), &request.set).await?;
        if !unpinned.is_empty() && !request.accept_unpinned {
            let list: Vec<String> = unpinned.iter().map(|u| format!("- {u}")).collect();
            return Err(Error::Conflict(format!(
                "job {original_id} cannot be run again exactly: Trainyard does not keep these inputs, so it cannot pin them:\n{}\nTo run it with them as they are now, accept that explicitly: accept_unpinned: true (`yard rerun --accept-unpinned`)",
                list.join("\n"),
            )));
        }
        let link = RerunLink {
            of: original_id,
            overrides: (!request.set.is_empty()).then(|| serde_json::Value::Object(request.set.clone())),
            unpinned,
            image,
        };
        let mode = if request.what_if { RunMode::WhatIf } else { RunMode::Submit };
        let job = match (template, &original.spec.template, &original.params) {
            (Some(template), Some(reference), Some(serde_json::Value::Object(params))) => {
                // The template checks every value, the changed ones included (`params.<name>`).
                let mut params = params.clone();
                params.extend(request.set.clone());
                // The checkpoint the original started from, exactly (`JOB` alone names the newest,
                // which may have moved on since), unless the rerun changes it.
                if let Some(source) = original.init_from {
                    for (param, spec) in &template.manifest.parameters {
                        if spec.kind == trainyard_templates::ParamKind::Checkpoint && !request.set.contains_key(param) {
                            let pinned = format!("{}:{}", source.job_id, source.step);
                            params.insert(param.clone(), serde_json::Value::String(pinned));
                        }
                    }
                }
                let run = TemplateRun {
                    version: Some(reference.version.clone()),
                    params,
                    name: Some(original.name.clone()),
                    priority: original.priority,
                    max_restarts: original.max_restarts.max(0) as u32,
                    idempotency_key: None,
                    cache_wait_seconds: original.spec.cache_wait_seconds,
                    spare: original.spec.spare,
                };
                let audit = Audit::by(caller, "job.submit", format!("rerun:{original_id}"));
                let rerun = PinnedRerun { template, link };
                let outcome = self.template_run_checked(caller, &reference.name, run, mode, &audit, Some(rerun));
                let outcome =
                    if mode == RunMode::Submit { self.audited(&audit, outcome).await? } else { outcome.await? };
                match outcome {
                    TemplateRunOutcome::WhatIf(schedule) => return Ok(RerunOutcome::WhatIf(schedule)),
                    TemplateRunOutcome::Submitted(submitted) => match *submitted {
                        Submitted::Created(job) | Submitted::Replayed(job) => job,
                    },
                    TemplateRunOutcome::DryRun(_) => return Err(Error::internal("a rerun is never a dry run")),
                }
            }
            _ => {
                if let Some(name) = request.set.keys().next() {
                    return Err(Error::invalid(
                        format!("set.{name}"),
                        "only a job from a template has parameters; this one ran a command",
                    ));
                }
                let submission = trainyard_core::job::JobSubmission {
                    name: Some(original.name.clone()),
                    command: original.spec.command.clone(),
                    args: original.spec.args.clone(),
                    env: original.spec.env.clone(),
                    resources: original.spec.resources.clone(),
                    replicas: original.spec.replicas,
                    priority: original.priority,
                    max_restarts: original.max_restarts.max(0) as u32,
                    idempotency_key: None,
                    code: original.spec.code.as_ref().map(|c| c.digest.clone()),
                    time_limit_seconds: original.spec.time_limit_seconds,
                    cache_wait_seconds: original.spec.cache_wait_seconds,
                    spare: original.spec.spare,
                    after_ok: Vec::new(),
                    after_any: Vec::new(),
                    after_failed: Vec::new(),
                    array: None,
                };
                if request.what_if {
                    return Ok(RerunOutcome::WhatIf(self.job_what_if(caller, submission).await?));
                }
                match self.job_submit_linked(caller, submission, Some(link)).await? {
                    Submitted::Created(job) | Submitted::Replayed(job) => job,
                }
            }
        };
        Ok(RerunOutcome::Submitted(Box::new(job)))
    }

    /// What a rerun of a job of the caller's tenant could not pin, as it stands now (empty: it
    /// would run exactly what the job ran). Nothing is read but the job, its template and its
    /// latest run record; never the files themselves.
    pub async fn job_rerun_unpinned(&self, caller: &Caller, job_id: uuid::Uuid) -> Result<Vec<UnpinnedInput>> {
        caller.authorize(Action::ReadJobs)?;
        let original = self.store.job_get(caller.tenant_id, job_id).await?;
        let template = self.template_of(caller, &original).await?;
        Ok(self.rerun_pins(caller, &original, template.as_deref(), &serde_json::Map::new()).await?.unpinned)
    }

    /// The template a job from a template ran, by its digest; none for a direct job.
    pub(super) async fn template_of(
        &self,
        caller: &Caller,
        job: &Job,
    ) -> Result<Option<Arc<trainyard_templates::Template>>> {
        match (&job.spec.template, &job.params) {
            (Some(reference), Some(serde_json::Value::Object(_))) => {
                Ok(Some(self.templates.resolve_pinned(caller.tenant_id, reference).await?))
            }
            _ => Ok(None),
        }
    }

    /// The inputs of `original` a rerun changing `changed` cannot pin, from its template's
    /// `path` parameters as it ran them, its latest run record, the tenant's registered datasets
    /// at those paths and this server's image; and the image it runs by digest on a cluster.
    async fn rerun_pins(
        &self,
        caller: &Caller,
        original: &Job,
        template: Option<&trainyard_templates::Template>,
        changed: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<RerunPins> {
        let mut path_params = BTreeMap::new();
        if let (Some(template), Some(serde_json::Value::Object(params))) = (template, &original.params) {
            // Defaults included: a template's default may be a path on the machine too.
            let values = template.check_params(params)?;
            for (name, spec) in &template.manifest.parameters {
                if spec.kind == trainyard_templates::ParamKind::Path
                    && let Some(serde_json::Value::String(path)) = values.get(name)
                {
                    path_params.insert(name.clone(), path.clone());
                }
            }
        }
        let record = self.store.run_record_latest(caller.tenant_id, original.id).await?;
        // The registry says which of those folders hold an immutable dataset version; the
        // files themselves are never read.
        let absolute: Vec<String> = path_params.values().filter(|p| p.starts_with('/')).cloned().collect();
        let registered =
            if absolute.is_empty() { Vec::new() } else { self.store.datasets_at(caller.tenant_id, &absolute).await? };
        let image = self.executor.image().unwrap_or_else(|| self.executor.name().to_string());
        let rerun = RerunInputs { path_params: &path_params, changed, image: &image, registered: &registered };
        let record = record.as_ref().map(|r| &r.record);
        Ok(RerunPins {
            unpinned: unpinned_inputs(record, &rerun),
            // The local executor runs the machine's programs: no image to pin.
            image: self.executor.image().and(record.and_then(pinned_image)),
        })
    }
}

/// What a rerun pins beyond the original's own record, and what it cannot.
struct RerunPins {
    unpinned: Vec<UnpinnedInput>,
    /// The image it runs by digest (a cluster only).
    image: Option<String>,
}
