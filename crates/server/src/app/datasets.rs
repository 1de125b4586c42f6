//! Datasets: registering an immutable version (by URI or from the job that produced it),
//! listing and showing them.

use trainyard_core::api::{Dataset, DatasetRegister};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::{Error, Result};
use trainyard_store::audit::Audit;
use trainyard_store::templates::Published;

use super::App;

impl App {
    /// Registers a dataset version, described in full or taken from a data-pack job's output.
    pub async fn dataset_register(&self, caller: &Caller, request: DatasetRegister) -> Result<(Dataset, bool)> {
        let audit = Audit::by(caller, "dataset.register", format!("dataset:{}@{}", request.name, request.version));
        self.audited(&audit, self.dataset_register_checked(caller, request, &audit)).await
    }

    async fn dataset_register_checked(
        &self,
        caller: &Caller,
        request: DatasetRegister,
        audit: &Audit,
    ) -> Result<(Dataset, bool)> {
        caller.authorize(Action::WriteJobs)?;
        if let Err(message) = trainyard_core::names::DatasetRef::new(&request.name, &request.version) {
            let field = if message.contains("dataset name") { "name" } else { "version" };
            return Err(Error::invalid(field, message));
        }
        let mut dataset = Dataset {
            name: request.name.clone(),
            version: request.version.clone(),
            uri: request.uri.clone().unwrap_or_default(),
            format: request.format.clone().unwrap_or_else(|| "files".into()),
            size_bytes: request.size_bytes,
            samples: request.samples,
            content_hash: request.content_hash.clone().unwrap_or_default(),
            source_job: None,
            created_by: caller.user.clone(),
            created_at: chrono::Utc::now(),
        };
        if let Some(job_id) = request.from_job {
            let no_such_job = |err| match err {
                Error::NotFound { .. } => Error::invalid("from_job", "names no job of your tenant"),
                other => other,
            };
            let job = self.store.job_get(caller.tenant_id, job_id).await.map_err(no_such_job)?;
            let outputs = self.store.job_outputs(caller.tenant_id, job_id).await.map_err(no_such_job)?;
            if job.state != trainyard_core::job::JobState::Succeeded {
                return Err(Error::invalid(
                    "from_job",
                    format!("the job {}; only a succeeded job's output is registered", job.state),
                ));
            }
            let out = outputs.get("dataset").ok_or_else(|| {
                Error::invalid("from_job", "the job recorded no `dataset` output (data-pack jobs do)")
            })?;
            let text = |k: &str| out[k].as_str().map(str::to_string);
            dataset.uri = text("path").unwrap_or_default();
            dataset.format = text("format").unwrap_or_else(|| "trainyard-shards-v1".into());
            dataset.content_hash = text("content_hash").unwrap_or_default();
            dataset.size_bytes = out["bytes"].as_i64();
            dataset.samples = out["samples"].as_i64();
            dataset.source_job = Some(job_id);
        }
        if dataset.uri.is_empty() {
            return Err(Error::invalid("uri", "say where the dataset is, or give from_job"));
        }
        if dataset.content_hash.is_empty() {
            return Err(Error::invalid(
                "content_hash",
                "a dataset version needs its content hash (data-pack records one)",
            ));
        }
        let published = self.store.dataset_register(caller, &dataset, audit).await?;
        let stored = self.store.dataset_get(caller.tenant_id, &dataset.name, &dataset.version).await?;
        Ok((stored, published == Published::Created))
    }

    pub async fn datasets_list(&self, caller: &Caller) -> Result<Vec<Dataset>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.datasets_list(caller.tenant_id).await
    }

    pub async fn dataset_get(&self, caller: &Caller, name: &str, version: &str) -> Result<Dataset> {
        caller.authorize(Action::ReadJobs)?;
        self.store.dataset_get(caller.tenant_id, name, version).await
    }
}
