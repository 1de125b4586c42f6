//! Admission: which queued jobs start now, and why the others wait.
//!
//! This is the seam where the real scheduler (quotas by GPU type, borrowing, fair share,
//! preemption, gang placement over nodes) plugs in. Today it is a capacity check against one
//! pool of resources, in queue order. It is pure: a [`Snapshot`] in, [`Decision`]s out, no clock,
//! no I/O, so it can be tested and benchmarked on its own.

use trainyard_core::resources::Resources;
use uuid::Uuid;

/// What the cluster offers in total (the local machine today).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpus: u64,
}

impl Capacity {
    fn fits(&self, need: &Capacity) -> bool {
        need.cpu_millis <= self.cpu_millis && need.memory_bytes <= self.memory_bytes && need.gpus <= self.gpus
    }

    fn take(&mut self, need: &Capacity) {
        self.cpu_millis -= need.cpu_millis;
        self.memory_bytes -= need.memory_bytes;
        self.gpus -= need.gpus;
    }

    /// What `replicas` replicas of `resources` need together.
    pub fn of_job(resources: &Resources, replicas: u32) -> Capacity {
        let r = u64::from(replicas);
        Capacity {
            cpu_millis: resources.cpu.millis().saturating_mul(r),
            memory_bytes: resources.memory.bytes().saturating_mul(r),
            gpus: u64::from(resources.gpus).saturating_mul(r),
        }
    }
}

/// A job waiting for admission.
#[derive(Debug, Clone)]
pub struct PendingJob {
    pub id: Uuid,
    pub resources: Resources,
    pub replicas: u32,
}

/// Everything admission looks at, taken at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Total capacity of the pool.
    pub total: Capacity,
    /// What running and admitted jobs hold.
    pub in_use: Capacity,
    /// GPU types the pool has; a job asking for another type can never run here.
    pub gpu_types: Vec<String>,
    /// Waiting jobs in queue order (priority, then submit time).
    pub queue: Vec<PendingJob>,
}

/// The verdict on one queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Admit(Uuid),
    /// Stays queued, with a reason a person can act on.
    Wait {
        job: Uuid,
        reason: String,
    },
}

/// Walks the queue in order and admits every job that fits in what is left. A job that does not
/// fit now waits; a job that could never fit says so.
pub fn admission_cycle(snapshot: &Snapshot) -> Vec<Decision> {
    let mut free = Capacity {
        cpu_millis: snapshot.total.cpu_millis.saturating_sub(snapshot.in_use.cpu_millis),
        memory_bytes: snapshot.total.memory_bytes.saturating_sub(snapshot.in_use.memory_bytes),
        gpus: snapshot.total.gpus.saturating_sub(snapshot.in_use.gpus),
    };
    snapshot
        .queue
        .iter()
        .map(|job| {
            let need = Capacity::of_job(&job.resources, job.replicas);
            if let Some(reason) = never_fits(snapshot, job, &need) {
                return Decision::Wait { job: job.id, reason };
            }
            if free.fits(&need) {
                free.take(&need);
                Decision::Admit(job.id)
            } else {
                Decision::Wait { job: job.id, reason: short_of(&need, &free) }
            }
        })
        .collect()
}

fn never_fits(snapshot: &Snapshot, job: &PendingJob, need: &Capacity) -> Option<String> {
    if let Some(gpu_type) = &job.resources.gpu_type
        && !snapshot.gpu_types.contains(gpu_type)
    {
        return Some(format!("no GPUs of type {gpu_type} in the cluster"));
    }
    let total = &snapshot.total;
    if need.gpus > total.gpus {
        return Some(format!("needs {} GPUs in all; the cluster has {}", need.gpus, total.gpus));
    }
    if need.cpu_millis > total.cpu_millis {
        return Some(format!(
            "needs {} cpu in all; the cluster has {}",
            cores(need.cpu_millis),
            cores(total.cpu_millis)
        ));
    }
    if need.memory_bytes > total.memory_bytes {
        return Some(format!(
            "needs {} memory in all; the cluster has {}",
            gib(need.memory_bytes),
            gib(total.memory_bytes)
        ));
    }
    None
}

fn short_of(need: &Capacity, free: &Capacity) -> String {
    let mut short = Vec::new();
    if need.gpus > free.gpus {
        short.push(format!("{} GPUs (free {})", need.gpus, free.gpus));
    }
    if need.cpu_millis > free.cpu_millis {
        short.push(format!("{} cpu (free {})", cores(need.cpu_millis), cores(free.cpu_millis)));
    }
    if need.memory_bytes > free.memory_bytes {
        short.push(format!("{} memory (free {})", gib(need.memory_bytes), gib(free.memory_bytes)));
    }
    format!("waiting for capacity: needs {}", short.join(", "))
}

fn cores(millis: u64) -> String {
    format!("{:.1}", millis as f64 / 1000.0)
}

fn gib(bytes: u64) -> String {
    format!("{:.1}GiB", bytes as f64 / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::resources::{Cpu, Memory};

    fn job(n: u128, cpu: u64, gpus: u32, replicas: u32) -> PendingJob {
        PendingJob {
            id: Uuid::from_u128(n),
            resources: Resources { cpu: Cpu(cpu * 1000), memory: Memory(1 << 30), gpus, gpu_type: None },
            replicas,
        }
    }

    fn snapshot(queue: Vec<PendingJob>) -> Snapshot {
        Snapshot {
            total: Capacity { cpu_millis: 4000, memory_bytes: 16 << 30, gpus: 2 },
            in_use: Capacity::default(),
            gpu_types: vec!["nvidia-a100-40gb".into()],
            queue,
        }
    }

    #[test]
    fn admits_in_order_while_capacity_lasts() {
        let decisions = admission_cycle(&snapshot(vec![job(1, 2, 0, 1), job(2, 1, 0, 2), job(3, 1, 0, 1)]));
        assert_eq!(decisions[0], Decision::Admit(Uuid::from_u128(1)));
        assert_eq!(decisions[1], Decision::Admit(Uuid::from_u128(2)));
        match &decisions[2] {
            Decision::Wait { reason, .. } => assert!(reason.contains("cpu (free 0.0)"), "{reason}"),
            other => panic!("job 3 should wait, got {other:?}"),
        }
    }

    #[test]
    fn a_job_larger_than_the_cluster_says_it_can_never_fit() {
        let decisions = admission_cycle(&snapshot(vec![job(1, 1, 2, 2)]));
        assert_eq!(
            decisions,
            vec![Decision::Wait { job: Uuid::from_u128(1), reason: "needs 4 GPUs in all; the cluster has 2".into() }]
        );
    }

    #[test]
    fn capacity_in_use_is_not_offered_again() {
        let mut snap = snapshot(vec![job(1, 1, 1, 1)]);
        snap.in_use.gpus = 2;
        assert!(
            matches!(&admission_cycle(&snap)[0], Decision::Wait { reason, .. } if reason.contains("GPUs (free 0)"))
        );
    }

    #[test]
    fn unknown_gpu_type_waits_with_the_type_named() {
        let mut pending = job(1, 1, 1, 1);
        pending.resources.gpu_type = Some("nvidia-h100-80gb".into());
        let decisions = admission_cycle(&snapshot(vec![pending]));
        assert!(matches!(&decisions[0], Decision::Wait { reason, .. } if reason.contains("nvidia-h100-80gb")));
    }
}
