//! Lineage: the walk of [`trainyard_core::lineage`] fed from the store, a level at a time in
//! each direction. Upstream, a job leads to the dataset versions it read, the job it reran and
//! the job whose checkpoint it was fine-tuned from; a dataset version to the job whose output it
//! was registered from. Downstream, a job leads to the dataset versions registered from its
//! output, the artefacts it uploaded, its reruns and its fine-tunes; a dataset version to the jobs that read it. Every read is the caller's tenant's: another
//! tenant's job or dataset is a 404, and nothing of another tenant is ever reached.

use std::collections::HashMap;

use trainyard_core::api::{Dataset, DatasetUse, Job};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::lineage::{
    DEFAULT_DEPTH, Direction, Lineage, MAX_DEPTH, NodeFacts, Relation, Walk, dataset_key, job_key,
};
use trainyard_core::resources::human_memory;
use trainyard_core::{Error, Result};
use uuid::Uuid;

use super::App;

/// The most readers of one dataset version, reruns of one job and artefacts of one job a level
/// lists; a walk with more says it was cut.
const READERS_PER_DATASET: i64 = 100;
const RERUNS_PER_JOB: i64 = 100;
const ARTIFACTS_PER_JOB: i64 = 50;

/// What a walk starts from.
#[derive(Debug, Clone)]
pub enum LineageRoot {
    Job(Uuid),
    Dataset { name: String, version: String },
}

/// The nodes a level walks on from: jobs (whole) and dataset versions (registered ones; a version
/// a job read that is no longer registered is a leaf).
#[derive(Default)]
struct Frontier {
    jobs: Vec<Job>,
    datasets: Vec<Dataset>,
}

impl Frontier {
    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.datasets.is_empty()
    }
}

impl App {
    /// Walks up to `depth` levels ([`DEFAULT_DEPTH`] when none, at most [`MAX_DEPTH`]) upstream
    /// and downstream from a job or dataset version of the caller's tenant.
    pub async fn lineage(&self, caller: &Caller, root: LineageRoot, depth: Option<u32>) -> Result<Lineage> {
        caller.authorize(Action::ReadJobs)?;
        let depth = depth.unwrap_or(DEFAULT_DEPTH);
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(Error::invalid("depth", format!("1 to {MAX_DEPTH} levels")));
        }
        let tenant = caller.tenant_id;
        let (facts, start) = match root {
            LineageRoot::Job(id) => {
                let job = self.store.job_get(tenant, id).await?;
                (job_facts(&job), Frontier { jobs: vec![job], datasets: Vec::new() })
            }
            LineageRoot::Dataset { name, version } => {
                let dataset = self.store.dataset_get(tenant, &name, &version).await?;
                (dataset_facts(&dataset), Frontier { jobs: Vec::new(), datasets: vec![dataset] })
            }
        };
        let mut walk = Walk::new(facts, depth);
        for direction in [Direction::Upstream, Direction::Downstream] {
            let mut frontier = Frontier { jobs: start.jobs.clone(), datasets: start.datasets.clone() };
            for _ in 0..depth {
                if frontier.is_empty() {
                    break;
                }
                frontier = match direction {
                    Direction::Upstream => self.lineage_upstream(tenant, &mut walk, frontier).await?,
                    Direction::Downstream => self.lineage_downstream(tenant, &mut walk, frontier).await?,
                };
            }
        }
        Ok(walk.finish())
    }

    /// One level upstream: the dataset versions the jobs read and the jobs they reran; the jobs
    /// the dataset versions came from.
    async fn lineage_upstream(&self, tenant: Uuid, walk: &mut Walk, frontier: Frontier) -> Result<Frontier> {
        let mut next = Frontier::default();
        let mut read = Vec::new();
        // (the node reached from, the job it leads to, how)
        let mut leads: Vec<(String, Uuid, Relation, Option<String>)> = Vec::new();
        for job in &frontier.jobs {
            let key = job_key(job.id);
            for used in &job.datasets {
                if walk.reach(Direction::Upstream, &key, used_facts(used), Relation::Consumed, Some(used.param.clone()))
                {
                    read.push((used.name.clone(), used.version.clone()));
                }
            }
            if let Some(original) = job.rerun_of {
                leads.push((key.clone(), original, Relation::Reran, Some(overrides(job))));
            }
            if let Some(source) = job.init_from {
                leads.push((key, source.job_id, Relation::FineTuned, Some(format!("checkpoint step {}", source.step))));
            }
        }
        for dataset in &frontier.datasets {
            if let Some(source) = dataset.source_job {
                leads.push((dataset_key(&dataset.name, &dataset.version), source, Relation::Produced, None));
            }
        }
        let ids: Vec<Uuid> = leads.iter().map(|(_, id, _, _)| *id).collect();
        let mut jobs = self.jobs_by_id(tenant, &ids).await?;
        for (near, id, relation, note) in leads {
            // A job gone from the store (or never the tenant's) is not shown.
            let Some(job) = jobs.get(&id) else { continue };
            if walk.reach(Direction::Upstream, &near, job_facts(job), relation, note) {
                next.jobs.extend(jobs.remove(&id));
            }
        }
        if !read.is_empty() {
            next.datasets = self.store.datasets_by_refs(tenant, &read).await?;
        }
        Ok(next)
    }

    /// One level downstream: the dataset versions registered from the jobs' output, their
    /// artefacts and reruns; the jobs that read the dataset versions.
    async fn lineage_downstream(&self, tenant: Uuid, walk: &mut Walk, frontier: Frontier) -> Result<Frontier> {
        let mut next = Frontier::default();
        let ids: Vec<Uuid> = frontier.jobs.iter().map(|j| j.id).collect();
        let mut leads: Vec<(String, Uuid, Relation)> = Vec::new();
        if !ids.is_empty() {
            for dataset in self.store.datasets_produced_by(tenant, &ids).await? {
                let Some(source) = dataset.source_job else { continue };
                if walk.reach(
                    Direction::Downstream,
                    &job_key(source),
                    dataset_facts(&dataset),
                    Relation::Produced,
                    None,
                ) {
                    next.datasets.push(dataset);
                }
            }
            let artifacts = self.store.artifacts_of(tenant, &ids, ARTIFACTS_PER_JOB).await?;
            let mut listed: HashMap<Uuid, i64> = HashMap::new();
            for a in artifacts {
                let count = listed.entry(a.job_id).or_default();
                *count += 1;
                if *count > ARTIFACTS_PER_JOB {
                    walk.truncate();
                    continue;
                }
                let size = human_memory(u64::try_from(a.size_bytes).unwrap_or_default());
                let facts = NodeFacts::artifact(a.job_id, &a.path, &size, &a.sha256);
                walk.reach(Direction::Downstream, &job_key(a.job_id), facts, Relation::Produced, None);
            }
            let mut reruns: HashMap<Uuid, i64> = HashMap::new();
            for (original, rerun) in self.store.reruns_of(tenant, &ids, RERUNS_PER_JOB).await? {
                let count = reruns.entry(original).or_default();
                *count += 1;
                if *count > RERUNS_PER_JOB {
                    walk.truncate();
                    continue;
                }
                leads.push((job_key(original), rerun, Relation::Reran));
            }
            let mut tunes: HashMap<Uuid, i64> = HashMap::new();
            for (source, run) in self.store.fine_tunes_of(tenant, &ids, RERUNS_PER_JOB).await? {
                let count = tunes.entry(source).or_default();
                *count += 1;
                if *count > RERUNS_PER_JOB {
                    walk.truncate();
                    continue;
                }
                leads.push((job_key(source), run, Relation::FineTuned));
            }
        }
        for dataset in &frontier.datasets {
            let readers = self.store.jobs_reading(tenant, &dataset.name, &dataset.version, READERS_PER_DATASET).await?;
            if readers.len() as i64 > READERS_PER_DATASET {
                walk.truncate();
            }
            let key = dataset_key(&dataset.name, &dataset.version);
            leads.extend(
                readers.into_iter().take(READERS_PER_DATASET as usize).map(|id| (key.clone(), id, Relation::Consumed)),
            );
        }
        let ids: Vec<Uuid> = leads.iter().map(|(_, id, _)| *id).collect();
        let mut jobs = self.jobs_by_id(tenant, &ids).await?;
        for (near, id, relation) in leads {
            let Some(job) = jobs.get(&id) else { continue };
            let note = match relation {
                Relation::Reran => Some(overrides(job)),
                Relation::FineTuned => job.init_from.map(|source| format!("checkpoint step {}", source.step)),
                // The parameter the job read the dataset version through.
                _ => job.datasets.iter().find(|u| dataset_key(&u.name, &u.version) == near).map(|u| u.param.clone()),
            };
            if walk.reach(Direction::Downstream, &near, job_facts(job), relation, note) {
                next.jobs.extend(jobs.remove(&id));
            }
        }
        Ok(next)
    }

    async fn jobs_by_id(&self, tenant: Uuid, ids: &[Uuid]) -> Result<HashMap<Uuid, Job>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        Ok(self.store.jobs_get_many(tenant, ids).await?.into_iter().map(|j| (j.id, j)).collect())
    }
}

fn job_facts(job: &Job) -> NodeFacts {
    let template = job.spec.template.as_ref().map(|t| format!("{} {}", t.name, t.version));
    NodeFacts::job(job.id, &job.name, template.as_deref(), job.state.as_str())
}

fn dataset_facts(d: &Dataset) -> NodeFacts {
    NodeFacts::dataset(&d.name, &d.version, &d.content_hash, &d.uri)
}

fn used_facts(u: &DatasetUse) -> NodeFacts {
    NodeFacts::dataset(&u.name, &u.version, &u.content_hash, &u.uri)
}

/// A rerun's changed parameters, `lr=0.01 epochs=2`, or `exact`.
fn overrides(job: &Job) -> String {
    let Some(map) = job.rerun_overrides.as_ref().and_then(|v| v.as_object()).filter(|m| !m.is_empty()) else {
        return "exact".into();
    };
    let mut given: Vec<String> =
        map.iter().map(|(k, v)| format!("{k}={}", v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect();
    given.sort();
    given.join(" ")
}
