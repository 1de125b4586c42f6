//! The mutable bookkeeping of one cycle: free capacity per node (indexed by flavor and free GPUs
//! for best-fit lookups), usage per tenant and flavor, and per cohort the borrowed and lendable
//! totals, all kept incrementally so that each decision costs O(log n), not a scan.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use uuid::Uuid;

use crate::decision::PendingReason;
use crate::model::{Demand, Quota, RunningJob, Snapshot};

/// Where a gang goes: the node index of each replica.
pub(crate) type Placement = Vec<usize>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaCheck {
    Fits,
    /// Within the tenant's nominal quota, but others borrowed it: reclaimable by preemption.
    Reclaimable,
}

/// The fewest nodes a gang's placement looks at (the fullest first; four per replica when more).
const MAX_GANG_CANDIDATES: usize = 64;

/// Flavors are interned as small integers: every lookup in the hot path is an index.
pub(crate) type FlavorId = usize;

pub(crate) struct State<'a> {
    pub snap: &'a Snapshot,
    pub flavors: Vec<&'a str>,
    /// The same names, shared into reasons.
    pub flavor_names: Vec<crate::decision::FlavorName>,
    // Lookups only (never iterated, so their order cannot leak into decisions): hashed with
    // FxHash, which costs a fraction of a B-tree's string compares over 100,000 jobs.
    flavor_ids: FxHashMap<&'a str, FlavorId>,
    node_by_name: FxHashMap<&'a str, usize>,
    tenant_index: FxHashMap<Uuid, usize>,
    node_flavor: Vec<Option<FlavorId>>,
    /// Each node's rack as a number, in the order of rack names; 0 for a node without one.
    node_rack: Vec<u32>,
    free_gpus: Vec<u32>,
    free_cpu: Vec<u64>,
    free_mem: Vec<u64>,
    reserved: Vec<Option<Uuid>>,
    /// Drained nodes ([`crate::Node::drained`]): out of the best-fit index like reserved ones,
    /// so that nothing new is placed there, but their capacity is still tracked.
    drained: Vec<bool>,
    /// Whether any node is drained (the drain's reason is searched for only then).
    pub any_drained: bool,
    /// The first job that holds nodes this cycle, per flavor.
    reserved_holder: Vec<Option<Uuid>>,
    /// Per flavor: the largest node (GPUs, cpu, memory) and node counts by size, for "can this
    /// ever fit" answers without scanning nodes.
    largest: Vec<(u32, u64, u64)>,
    sizes: Vec<BTreeMap<u32, u64>>,
    /// flavor -> free GPUs -> nodes (unreserved only), for best-fit lookups.
    buckets: Vec<BTreeMap<u32, BTreeSet<usize>>>,
    flavor_free: Vec<u64>,
    /// Per tenant, the flavors it has a quota for.
    tenant_flavors: Vec<smallvec::SmallVec<[FlavorId; 4]>>,
    /// quotas[tenant * flavors + flavor]: one flat table, so a lookup is one load.
    quotas: Vec<Option<Quota>>,
    /// usage[tenant * flavors + flavor], in GPUs.
    usage: Vec<u64>,
    cohort_of: Vec<usize>,
    /// pools[cohort][flavor] = (borrowed, lendable) summed over the cohort's members.
    pools: Vec<Vec<(u64, u64)>>,
    /// The distinct shapes of the cycle's jobs, interned: a long queue holds few of them.
    shapes: Vec<Shape>,
    shape_ids: FxHashMap<Shape, ShapeId>,
    /// Per (shape, flavor or none) slot: the generation in which that shape found no
    /// placement. Within a cycle capacity mostly only shrinks (admissions, reservations), so
    /// most of a long queue's jobs are answered from here instead of searching nodes again; a
    /// release (preemption's what-if) starts a new generation, which forgets them all at once.
    unplaceable: Vec<u32>,
    generation: u32,
}

/// What placement depends on: a demand's numbers, not its GPU type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Shape {
    pub replicas: u32,
    pub gpus: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// What is free on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Free {
    pub gpus: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Shape {
    pub fn of(demand: &Demand) -> Shape {
        Shape {
            replicas: demand.replicas,
            gpus: demand.gpus,
            cpu_millis: demand.cpu_millis,
            memory_bytes: demand.memory_bytes,
        }
    }

    pub fn total_gpus(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.gpus)
    }
}

/// An interned [`Shape`].
pub(crate) type ShapeId = u32;

impl<'a> State<'a> {
    pub fn new(snap: &'a Snapshot) -> State<'a> {
        let mut names: Vec<&'a str> = snap
            .nodes
            .iter()
            .filter_map(|n| n.gpu_type.as_deref())
            .chain(snap.tenants.iter().flat_map(|t| t.quotas.keys().map(String::as_str)))
            .chain(snap.pending.iter().filter_map(|j| j.demand.gpu_type.as_deref()))
            .chain(snap.running.iter().filter_map(|j| j.flavor.as_deref()))
            .collect::<rustc_hash::FxHashSet<&str>>()
            .into_iter()
            .collect();
        names.sort();
        let flavor_ids: FxHashMap<&str, FlavorId> = names.iter().enumerate().map(|(i, f)| (*f, i)).collect();
        // Cohorts numbered in order of first appearance; a tenant without one is a cohort alone.
        let mut cohorts: FxHashMap<&str, usize> = FxHashMap::default();
        let mut cohort_count = 0;
        let cohort_of: Vec<usize> = snap
            .tenants
            .iter()
            .map(|t| {
                let next = cohort_count;
                let id = match t.cohort.as_deref() {
                    Some(name) => *cohorts.entry(name).or_insert(next),
                    None => next,
                };
                cohort_count = cohort_count.max(id + 1);
                id
            })
            .collect();
        let mut racks: Vec<&str> = snap.nodes.iter().filter_map(|n| n.rack.as_deref()).collect();
        racks.sort_unstable();
        racks.dedup();
        let node_rack = snap
            .nodes
            .iter()
            .map(|n| n.rack.as_deref().map_or(0, |r| racks.binary_search(&r).map_or(0, |i| i as u32 + 1)))
            .collect();
        let nf = names.len();
        let mut state = State {
            node_rack,
            snap,
            node_by_name: snap.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect(),
            node_flavor: snap.nodes.iter().map(|n| n.gpu_type.as_deref().map(|f| flavor_ids[f])).collect(),
            free_gpus: snap.nodes.iter().map(|n| n.gpus).collect(),
            free_cpu: snap.nodes.iter().map(|n| n.cpu_millis).collect(),
            free_mem: snap.nodes.iter().map(|n| n.memory_bytes).collect(),
            reserved: vec![None; snap.nodes.len()],
            drained: snap.nodes.iter().map(|n| n.drained.is_some()).collect(),
            any_drained: snap.nodes.iter().any(|n| n.drained.is_some()),
            reserved_holder: vec![None; nf],
            largest: vec![(0, 0, 0); nf],
            sizes: vec![BTreeMap::new(); nf],
            buckets: vec![BTreeMap::new(); nf],
            flavor_free: vec![0; nf],
            tenant_index: snap.tenants.iter().enumerate().map(|(i, t)| (t.id, i)).collect(),
            tenant_flavors: snap
                .tenants
                .iter()
                .map(|t| (0..names.len()).filter(|f| t.quotas.contains_key(names[*f])).collect())
                .collect(),
            quotas: snap.tenants.iter().flat_map(|t| names.iter().map(|f| t.quotas.get(*f).copied())).collect(),
            usage: vec![0; nf * snap.tenants.len()],
            pools: vec![vec![(0, 0); nf]; cohort_count],
            shapes: Vec::new(),
            shape_ids: FxHashMap::default(),
            unplaceable: Vec::new(),
            generation: 1,
            cohort_of,
            flavor_names: names.iter().map(|n| std::sync::Arc::from(*n)).collect(),
            flavors: names,
            flavor_ids,
        };
        for node in 0..snap.nodes.len() {
            if let Some(f) = state.node_flavor[node] {
                state.index_insert(f, node);
                let n = &snap.nodes[node];
                let largest = &mut state.largest[f];
                *largest = (largest.0.max(n.gpus), largest.1.max(n.cpu_millis), largest.2.max(n.memory_bytes));
                *state.sizes[f].entry(n.gpus).or_default() += 1;
            }
        }
        for t in 0..snap.tenants.len() {
            for f in 0..nf {
                let (b, l) = state.contribution(t, f, 0);
                let pool = &mut state.pools[state.cohort_of[t]][f];
                pool.0 += b;
                pool.1 += l;
            }
        }
        for job in &snap.running {
            let nodes = state.running_nodes(job);
            let flavor = job.flavor.as_deref().map(|f| state.flavor_ids[f]);
            state.allocate(state.quota_tenant(job), flavor, &Shape::of(&job.demand), &nodes);
        }
        state
    }

    /// The tenant whose quota a running job counts in: its tenant's index, `None` for a job on
    /// spare room (counted in no quota) or of a tenant without a policy.
    pub fn quota_tenant(&self, job: &RunningJob) -> Option<usize> {
        if job.spare { None } else { self.tenant(job.tenant) }
    }

    pub fn flavor_id(&self, name: &str) -> Option<FlavorId> {
        self.flavor_ids.get(name).copied()
    }

    pub fn tenant(&self, id: Uuid) -> Option<usize> {
        self.tenant_index.get(&id).copied()
    }

    /// The index of (tenant, flavor) in the flat tables.
    fn cell(&self, t: usize, flavor: FlavorId) -> usize {
        t * self.flavors.len() + flavor
    }

    pub fn quota(&self, t: usize, flavor: FlavorId) -> Option<Quota> {
        self.quotas[self.cell(t, flavor)]
    }

    /// The flavors tenant `t` has a quota for.
    pub fn quota_flavors(&self, t: usize) -> &[FlavorId] {
        &self.tenant_flavors[t]
    }

    pub fn usage(&self, t: usize, flavor: FlavorId) -> u64 {
        self.usage[self.cell(t, flavor)]
    }

    /// What tenant `t` adds to its cohort's (borrowed, lendable) for `flavor` at usage `u`.
    fn contribution(&self, t: usize, flavor: FlavorId, u: u64) -> (u64, u64) {
        Quota::contribution(self.quotas[self.cell(t, flavor)].as_ref(), u)
    }

    fn usage_add(&mut self, t: usize, flavor: FlavorId, delta: i64) {
        let old = self.usage[self.cell(t, flavor)];
        let new = old.saturating_add_signed(delta);
        let (b0, l0) = self.contribution(t, flavor, old);
        let (b1, l1) = self.contribution(t, flavor, new);
        let pool = &mut self.pools[self.cohort_of[t]][flavor];
        pool.0 = pool.0 + b1 - b0;
        pool.1 = pool.1 + l1 - l0;
        let cell = self.cell(t, flavor);
        self.usage[cell] = new;
    }

    /// Whether tenant `t` may take `need` more GPUs of `flavor`.
    pub fn quota_check(&self, t: Option<usize>, flavor: FlavorId, need: u64) -> Result<QuotaCheck, PendingReason> {
        let name = || self.flavor_names[flavor].clone();
        let (Some(t), Some(q)) = (t, t.and_then(|t| self.quotas[self.cell(t, flavor)])) else {
            return Err(PendingReason::NoQuota { flavor: name() });
        };
        let used = self.usage[self.cell(t, flavor)];
        let after = used + need;
        let borrowed = after.saturating_sub(q.nominal);
        let alone = self.snap.tenants[t].cohort.is_none();
        if borrowed > 0 && (alone || q.borrowing_limit.is_some_and(|limit| borrowed > limit)) {
            return Err(PendingReason::QuotaExceeded {
                flavor: name(),
                used,
                nominal: q.nominal,
                borrowing_limit: if alone { Some(0) } else { q.borrowing_limit },
                needed: need,
            });
        }
        let (pool_borrowed, pool_lendable) = self.pools[self.cohort_of[t]][flavor];
        let (b0, l0) = self.contribution(t, flavor, used);
        let (b1, l1) = self.contribution(t, flavor, after);
        if pool_borrowed - b0 + b1 <= pool_lendable - l0 + l1 {
            Ok(QuotaCheck::Fits)
        } else if after <= q.nominal {
            Ok(QuotaCheck::Reclaimable)
        } else {
            Err(PendingReason::CohortExhausted {
                flavor: name(),
                used,
                nominal: q.nominal,
                // What the others lend and have not lent out yet.
                lendable: (pool_lendable - l0).saturating_sub(pool_borrowed - b0),
                needed: need,
            })
        }
    }

    fn index_insert(&mut self, flavor: FlavorId, node: usize) {
        if self.reserved[node].is_some() || self.drained[node] {
            return;
        }
        let free = self.free_gpus[node];
        self.buckets[flavor].entry(free).or_default().insert(node);
        self.flavor_free[flavor] += u64::from(free);
    }

    fn index_remove(&mut self, flavor: FlavorId, node: usize) {
        if self.reserved[node].is_some() || self.drained[node] {
            return;
        }
        let free = self.free_gpus[node];
        if let Some(bucket) = self.buckets[flavor].get_mut(&free) {
            bucket.remove(&node);
            if bucket.is_empty() {
                self.buckets[flavor].remove(&free);
            }
        }
        self.flavor_free[flavor] -= u64::from(free);
    }

    /// Takes a job's resources: on its nodes, and in its tenant's usage (`t`: the tenant's
    /// index; `None` for a tenant without a policy, whose usage is not counted).
    pub fn allocate(&mut self, t: Option<usize>, flavor: Option<FlavorId>, demand: &Shape, nodes: &[usize]) {
        self.adjust(t, flavor, demand, nodes, -1);
    }

    /// What is free on `node`: GPUs, CPU (millicores), memory (bytes).
    pub fn free_on(&self, node: usize) -> Free {
        Free { gpus: self.free_gpus[node], cpu_millis: self.free_cpu[node], memory_bytes: self.free_mem[node] }
    }

    /// Lowers what is free on `node` to at most `left`: a preemptor holds what it will need
    /// there beyond its victims' room, so that nobody else is placed on it this cycle. No
    /// tenant's usage changes.
    pub fn hold(&mut self, node: usize, left: Free) {
        let node_flavor = self.node_flavor[node];
        if let Some(f) = node_flavor {
            self.index_remove(f, node);
        }
        self.free_gpus[node] = self.free_gpus[node].min(left.gpus);
        self.free_cpu[node] = self.free_cpu[node].min(left.cpu_millis);
        self.free_mem[node] = self.free_mem[node].min(left.memory_bytes);
        if let Some(f) = node_flavor {
            self.index_insert(f, node);
        }
    }

    /// Gives a job's resources back.
    pub fn release(&mut self, t: Option<usize>, flavor: Option<FlavorId>, demand: &Shape, nodes: &[usize]) {
        self.generation += 1;
        self.adjust(t, flavor, demand, nodes, 1);
    }

    /// The id of `shape`, interned on first sight.
    pub fn intern(&mut self, shape: Shape) -> ShapeId {
        if let Some(&id) = self.shape_ids.get(&shape) {
            return id;
        }
        let id = self.shapes.len() as ShapeId;
        self.shapes.push(shape);
        self.shape_ids.insert(shape, id);
        self.unplaceable.resize(self.shapes.len() * (self.flavors.len() + 1), 0);
        id
    }

    pub fn shape(&self, id: ShapeId) -> &Shape {
        &self.shapes[id as usize]
    }

    /// [`State::place`] for an interned shape, remembering failures: a shape that found no
    /// room finds none again until something is released.
    pub fn place_remembered(&mut self, shape: ShapeId, flavor: Option<FlavorId>) -> Option<Placement> {
        let slot = shape as usize * (self.flavors.len() + 1) + flavor.map_or(0, |f| f + 1);
        if self.unplaceable[slot] == self.generation {
            return None;
        }
        let placement = self.place(&self.shapes[shape as usize], flavor);
        if placement.is_none() {
            self.unplaceable[slot] = self.generation;
        }
        placement
    }

    fn adjust(&mut self, t: Option<usize>, flavor: Option<FlavorId>, demand: &Shape, nodes: &[usize], sign: i64) {
        for &node in nodes {
            let node_flavor = self.node_flavor[node];
            if let Some(f) = node_flavor {
                self.index_remove(f, node);
            }
            self.free_gpus[node] = self.free_gpus[node].saturating_add_signed((i64::from(demand.gpus) * sign) as i32);
            self.free_cpu[node] = self.free_cpu[node].saturating_add_signed(demand.cpu_millis as i64 * sign);
            self.free_mem[node] = self.free_mem[node].saturating_add_signed(demand.memory_bytes as i64 * sign);
            if let Some(f) = node_flavor {
                self.index_insert(f, node);
            }
        }
        if let (Some(flavor), Some(t)) = (flavor, t) {
            self.usage_add(t, flavor, -sign * demand.total_gpus() as i64);
        }
    }

    pub fn running_nodes(&self, job: &RunningJob) -> Vec<usize> {
        job.nodes.iter().filter_map(|n| self.node_by_name.get(n.as_str()).copied()).collect()
    }

    /// Holds `nodes` for a starving job: nobody else is placed there this cycle.
    pub fn reserve(&mut self, job: Uuid, nodes: &[usize]) {
        for &node in nodes {
            if let Some(f) = self.node_flavor[node] {
                self.index_remove(f, node);
                self.reserved_holder[f].get_or_insert(job);
            }
            self.reserved[node] = Some(job);
        }
    }

    /// The job holding nodes of `flavor`, if any.
    pub fn reserved_for(&self, flavor: FlavorId) -> Option<Uuid> {
        self.reserved_holder[flavor]
    }

    /// Whether one replica fits an empty node of `flavor`, and how many replicas all its nodes
    /// hold when empty.
    pub fn fits_ever(&self, demand: &Shape, flavor: FlavorId) -> (bool, u64) {
        let (gpus, cpu, mem) = self.largest[flavor];
        let one = gpus >= demand.gpus && cpu >= demand.cpu_millis && mem >= demand.memory_bytes;
        let total =
            self.sizes[flavor].iter().map(|(size, count)| count * u64::from(size / demand.gpus.max(1))).sum::<u64>();
        (one, total)
    }

    pub fn free_of(&self, flavor: FlavorId) -> u64 {
        self.flavor_free[flavor]
    }

    /// How many replicas of `demand` node `i` holds now.
    fn fits_on(&self, i: usize, demand: &Shape) -> u32 {
        let by = |free: u64, need: u64| free.checked_div(need).map_or(u32::MAX, |n| n.min(u64::from(u32::MAX)) as u32);
        by(u64::from(self.free_gpus[i]), u64::from(demand.gpus))
            .min(by(self.free_cpu[i], demand.cpu_millis))
            .min(by(self.free_mem[i], demand.memory_bytes))
    }

    /// A placement for every replica, or `None`. One replica: the fullest node that still fits
    /// (best fit keeps whole nodes free). Gangs: one rack when any rack can hold them all (the
    /// tightest such rack), then as few nodes as possible, preferring the fullest.
    pub fn place(&self, demand: &Shape, flavor: Option<FlavorId>) -> Option<Placement> {
        self.place_among(demand, flavor, |_| true)
    }

    /// A placement on the named nodes only (those whose shard cache holds the job's data), as
    /// [`State::place`] would choose among them; `None` when they cannot hold every replica now.
    pub fn place_warm(&self, demand: &Shape, flavor: Option<FlavorId>, warm: &[String]) -> Option<Placement> {
        if warm.is_empty() {
            return None;
        }
        // A node's membership in one load, whatever the number of warm nodes.
        let mut is_warm = vec![false; self.snap.nodes.len()];
        for name in warm {
            if let Some(&i) = self.node_by_name.get(name.as_str()) {
                is_warm[i] = true;
            }
        }
        if !is_warm.contains(&true) {
            return None;
        }
        self.place_among(demand, flavor, |i| is_warm[i])
    }

    /// How many of the named nodes are in the cluster.
    pub fn nodes_known(&self, names: &[String]) -> usize {
        let mut known: Vec<usize> = names.iter().filter_map(|n| self.node_by_name.get(n.as_str()).copied()).collect();
        known.sort_unstable();
        known.dedup();
        known.len()
    }

    fn place_among(
        &self,
        demand: &Shape,
        flavor: Option<FlavorId>,
        allowed: impl Fn(usize) -> bool,
    ) -> Option<Placement> {
        let replicas = demand.replicas as usize;
        let candidates: Vec<(usize, u32)> = match flavor {
            Some(f) => {
                if self.free_of(f) < demand.total_gpus() {
                    return None;
                }
                let nodes = self.buckets[f].range(demand.gpus..).flat_map(|(_, nodes)| nodes.iter());
                if replicas == 1 {
                    return nodes.copied().find(|&i| allowed(i) && self.fits_on(i, demand) >= 1).map(|i| vec![i]);
                }
                // An upper bound from the buckets alone, before looking at any node.
                let bound: u64 = self.buckets[f]
                    .range(demand.gpus..)
                    .map(|(free, nodes)| nodes.len() as u64 * u64::from(free / demand.gpus.max(1)))
                    .sum();
                if bound < replicas as u64 {
                    return None;
                }
                // The fullest nodes that fit, up to a bound: enough to choose racks and nodes
                // well without visiting thousands of nodes per gang.
                let cap = MAX_GANG_CANDIDATES.max(4 * replicas);
                nodes
                    .filter(|&&i| allowed(i))
                    .map(|&i| (i, self.fits_on(i, demand)))
                    .filter(|(_, n)| *n > 0)
                    .take(cap)
                    .collect()
            }
            None => {
                // CPU-only: nodes without GPUs first, then the fullest.
                let mut nodes: Vec<(usize, u32)> = (0..self.snap.nodes.len())
                    .filter(|&i| self.reserved[i].is_none() && !self.drained[i] && allowed(i))
                    .map(|i| (i, self.fits_on(i, demand)))
                    .filter(|(_, n)| *n > 0)
                    .collect();
                nodes.sort_by_key(|&(i, _)| (self.snap.nodes[i].gpus > 0, self.free_cpu[i], i));
                if replicas == 1 {
                    return nodes.first().map(|&(i, _)| vec![i]);
                }
                nodes
            }
        };
        if candidates.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() < replicas as u64 {
            return None;
        }
        // Prefer one rack: the tightest rack that can hold every replica.
        let mut racks: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, n) in &candidates {
            *racks.entry(self.node_rack[*i]).or_default() += u64::from(*n);
        }
        let rack = racks
            .iter()
            .filter(|(rack, cap)| **rack != 0 && **cap >= replicas as u64)
            .min_by_key(|(rack, cap)| (**cap, **rack))
            .map(|(rack, _)| *rack);
        let pool: Vec<(usize, u32)> = match rack {
            Some(rack) => candidates.into_iter().filter(|(i, _)| self.node_rack[*i] == rack).collect(),
            None => candidates,
        };
        greedy_fill(pool, replicas, |i| self.free_gpus[i])
    }

    /// The drained nodes a placement of `demand` would take were drains lifted, when it has one
    /// now only that way: what a job waiting for a drain is told. Scans the nodes (called only
    /// for a job that found no room, and only while some node is drained).
    pub fn drained_placement(&self, demand: &Shape, flavor: Option<FlavorId>) -> Option<Vec<String>> {
        if !self.any_drained {
            return None;
        }
        let candidates: Vec<(usize, u32)> = (0..self.snap.nodes.len())
            .filter(|&i| self.reserved[i].is_none())
            .filter(|&i| match flavor {
                Some(f) => self.node_flavor[i] == Some(f),
                None => true,
            })
            .map(|i| (i, self.fits_on(i, demand)))
            .filter(|(_, n)| *n > 0)
            .collect();
        if candidates.iter().map(|(_, n)| u64::from(*n)).sum::<u64>() < u64::from(demand.replicas) {
            return None;
        }
        let placement = greedy_fill(candidates, demand.replicas as usize, |i| self.free_gpus[i])?;
        let mut drained: Vec<String> =
            placement.iter().filter(|&&i| self.drained[i]).map(|&i| self.snap.nodes[i].name.clone()).collect();
        drained.dedup();
        (!drained.is_empty()).then_some(drained)
    }

    /// Nodes of `flavor` that, once empty, would hold the gang: the ones with most free GPUs
    /// first (closest to ready).
    pub fn reservation_for(&self, demand: &Shape, flavor: FlavorId) -> Vec<usize> {
        let mut nodes: Vec<usize> = (0..self.snap.nodes.len())
            .filter(|&i| self.node_flavor[i] == Some(flavor) && self.reserved[i].is_none() && !self.drained[i])
            .filter(|&i| self.snap.nodes[i].gpus >= demand.gpus)
            .collect();
        nodes.sort_by_key(|&i| (std::cmp::Reverse(self.free_gpus[i]), i));
        let mut chosen = Vec::new();
        let mut holds = 0u64;
        for i in nodes {
            if holds >= u64::from(demand.replicas) {
                break;
            }
            holds += u64::from(self.snap.nodes[i].gpus / demand.gpus.max(1));
            chosen.push(i);
        }
        chosen
    }
}

/// Fills `replicas` from nodes with capacities: a node that takes all the rest with the least
/// left over, else the node that takes the most (fewest nodes), ties to the fullest.
fn greedy_fill(mut pool: Vec<(usize, u32)>, replicas: usize, free: impl Fn(usize) -> u32) -> Option<Placement> {
    let mut placement = Vec::with_capacity(replicas);
    while placement.len() < replicas {
        let remaining = (replicas - placement.len()) as u32;
        let pick = pool
            .iter()
            .enumerate()
            .filter(|(_, (_, n))| *n >= remaining)
            .min_by_key(|(_, (i, n))| (*n, free(*i), *i))
            .or_else(|| {
                pool.iter()
                    .enumerate()
                    .max_by_key(|(_, (i, n))| (*n, std::cmp::Reverse(free(*i)), std::cmp::Reverse(*i)))
            })
            .map(|(k, _)| k)?;
        let (node, n) = pool.swap_remove(pick);
        for _ in 0..n.min(remaining) {
            placement.push(node);
        }
    }
    Some(placement)
}
