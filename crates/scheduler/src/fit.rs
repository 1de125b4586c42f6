//! Whether a job can ever run on the cluster as it is, whatever else runs: a replica larger than
//! every node, a GPU type no node has, a gang larger than the whole cluster. Asked at submit
//! (the server refuses such a job with the capacity named, unless the operator says the cluster
//! grows) and by what-if. Quotas and other jobs play no part here: only the nodes.

use trainyard_core::resources::{human_cpus, human_gpus, human_memory};

use crate::model::{Demand, Node};

/// Why a job can never fit, for the field of the request that asks too much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// `resources.gpu_type`, `resources.gpus`, `resources.cpu`, `resources.memory` or `replicas`.
    pub field: &'static str,
    pub message: String,
}

/// "No node of this cluster has GPUs of type X (its GPU types: ...)" when no node of `nodes` has
/// GPUs of type `wanted`; `None` when one has (or no nodes are known). Said at submit and when
/// a quota is set for such a type.
pub fn missing_gpu_type(nodes: &[Node], wanted: &str) -> Option<String> {
    let types: std::collections::BTreeSet<&str> =
        nodes.iter().filter(|n| n.gpus > 0).filter_map(|n| n.gpu_type.as_deref()).collect();
    if nodes.is_empty() || types.contains(wanted) {
        return None;
    }
    let have = if types.is_empty() {
        "no node has GPUs".to_string()
    } else {
        format!("its GPU types: {}", types.into_iter().collect::<Vec<_>>().join(", "))
    };
    Some(format!("no node of this cluster has GPUs of type {wanted} ({have})"))
}

/// How many replicas of `demand` one node holds when empty.
fn replicas_on(node: &Node, demand: &Demand) -> u64 {
    let per = |have: u64, want: u64| have.checked_div(want).unwrap_or(u64::MAX);
    per(u64::from(node.gpus), u64::from(demand.gpus))
        .min(per(node.cpu_millis, demand.cpu_millis))
        .min(per(node.memory_bytes, demand.memory_bytes))
}

/// `None` when the job could run on an empty cluster of `nodes` (or when no nodes are known:
/// nothing can be judged then); otherwise the first reason it never can, naming the field.
pub fn never_fits(nodes: &[Node], demand: &Demand) -> Option<Unfit> {
    if nodes.is_empty() {
        return None;
    }
    let uses_gpus = demand.gpus > 0;
    // The nodes a replica could be on at all: of the type asked for (any, without GPUs).
    let typed: Vec<&Node> = nodes
        .iter()
        .filter(|n| !uses_gpus || demand.gpu_type.as_ref().is_none_or(|t| n.gpu_type.as_ref() == Some(t)))
        .filter(|n| !uses_gpus || n.gpus > 0)
        .collect();
    if typed.is_empty() {
        return Some(match &demand.gpu_type {
            Some(wanted) => {
                Unfit { field: "resources.gpu_type", message: missing_gpu_type(nodes, wanted).unwrap_or_default() }
            }
            None => Unfit { field: "resources.gpus", message: "the job asks for GPUs and no node has GPUs".into() },
        });
    }
    let largest = |f: fn(&Node) -> u64| typed.iter().map(|n| f(n)).max().unwrap_or(0);
    let kind = demand.gpu_type.as_deref();
    if uses_gpus && largest(|n| u64::from(n.gpus)) < u64::from(demand.gpus) {
        return Some(Unfit {
            field: "resources.gpus",
            message: format!(
                "a replica asks for {}; the largest node has {}",
                human_gpus(u64::from(demand.gpus), kind),
                human_gpus(largest(|n| u64::from(n.gpus)), kind)
            ),
        });
    }
    if largest(|n| n.cpu_millis) < demand.cpu_millis {
        return Some(Unfit {
            field: "resources.cpu",
            message: format!(
                "a replica asks for {}; the largest node has {}",
                human_cpus(demand.cpu_millis),
                human_cpus(largest(|n| n.cpu_millis))
            ),
        });
    }
    if largest(|n| n.memory_bytes) < demand.memory_bytes {
        return Some(Unfit {
            field: "resources.memory",
            message: format!(
                "a replica asks for {} of memory; the largest node has {}",
                human_memory(demand.memory_bytes),
                human_memory(largest(|n| n.memory_bytes))
            ),
        });
    }
    // Each dimension fits some node: now one node with all of them, and the whole gang. A job
    // without a type runs all its replicas on one type; it fits when some type holds them all.
    let mut groups: std::collections::BTreeMap<Option<&str>, u64> = Default::default();
    for node in &typed {
        let key = if uses_gpus { node.gpu_type.as_deref() } else { None };
        let slot = groups.entry(key).or_default();
        *slot = slot.saturating_add(replicas_on(node, demand));
    }
    let most = groups.values().copied().max().unwrap_or(0);
    if most == 0 {
        let gpus = if uses_gpus { format!("{}, ", human_gpus(u64::from(demand.gpus), kind)) } else { String::new() };
        return Some(Unfit {
            field: "resources",
            message: format!(
                "no single node has {gpus}{} and {} of memory together for one replica",
                human_cpus(demand.cpu_millis),
                human_memory(demand.memory_bytes)
            ),
        });
    }
    if most < u64::from(demand.replicas) {
        let per_replica = if uses_gpus {
            human_gpus(u64::from(demand.gpus), kind)
        } else {
            format!("{} and {} of memory", human_cpus(demand.cpu_millis), human_memory(demand.memory_bytes))
        };
        return Some(Unfit {
            field: "replicas",
            message: format!(
                "the job runs {} replicas of {per_replica} at once; the whole cluster holds at most {most}",
                demand.replicas
            ),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn node(name: &str, gpu_type: Option<&str>, gpus: u32, cores: u64, memory_gib: u64) -> Node {
        Node {
            name: name.into(),
            rack: None,
            gpu_type: gpu_type.map(str::to_string),
            gpus,
            cpu_millis: cores * 1000,
            memory_bytes: memory_gib * GI,
            drained: None,
        }
    }

    fn demand(replicas: u32, gpus: u32, gpu_type: Option<&str>, cpu_millis: u64, memory_gib: u64) -> Demand {
        Demand { replicas, gpus, gpu_type: gpu_type.map(str::to_string), cpu_millis, memory_bytes: memory_gib * GI }
    }

    fn cluster() -> Vec<Node> {
        vec![node("a", Some("h100"), 8, 32, 256), node("b", Some("a10"), 4, 16, 128), node("c", None, 0, 8, 32)]
    }

    #[test]
    fn each_way_a_job_can_never_fit_names_its_field_in_human_units() {
        let cases = [
            (
                demand(2, 8, Some("h100"), 1000, 1),
                "replicas",
                "runs 2 replicas of 8 GPUs of h100 at once; the whole cluster holds at most 1",
            ),
            (demand(1, 16, None, 1000, 1), "resources.gpus", "asks for 16 GPUs; the largest node has 8 GPUs"),
            (
                demand(1, 1, Some("b200"), 1000, 1),
                "resources.gpu_type",
                "no node of this cluster has GPUs of type b200 (its GPU types: a10, h100)",
            ),
            (demand(1, 0, None, 64_000, 1), "resources.cpu", "asks for 64 CPUs; the largest node has 32 CPUs"),
            (
                demand(1, 0, None, 500, 1024),
                "resources.memory",
                "asks for 1 TiB of memory; the largest node has 256 GiB",
            ),
            (demand(1, 4, Some("a10"), 20_000, 1), "resources.cpu", "asks for 20 CPUs; the largest node has 16 CPUs"),
            (demand(1, 8, None, 1000, 200), "resources", ""),
        ];
        for (wanted, field, text) in cases {
            let unfit = never_fits(&cluster(), &wanted);
            if field == "resources" {
                // 8 GPUs only on `a`, 200 GiB only on `a` too: this one fits.
                assert_eq!(unfit, None);
                continue;
            }
            let unfit = unfit.unwrap_or_else(|| panic!("{wanted:?} was judged to fit"));
            assert_eq!(unfit.field, field, "{wanted:?}");
            assert!(unfit.message.contains(text), "{wanted:?}: {}", unfit.message);
        }
    }

    #[test]
    fn no_single_node_with_everything_at_once_is_refused() {
        // 8 GPUs are on `a` (256 GiB) and 300 GiB nowhere: memory is refused by itself first;
        // 4 a10 GPUs with 200 GiB: a10's node has 128 GiB, `a` has the memory but other GPUs.
        let unfit = never_fits(&cluster(), &demand(1, 4, Some("a10"), 1000, 200)).unwrap();
        assert_eq!(unfit.field, "resources.memory");
        let nodes = vec![node("gpu", Some("h100"), 8, 4, 64), node("fat", None, 0, 64, 64)];
        let unfit = never_fits(&nodes, &demand(1, 8, None, 32_000, 1)).unwrap();
        assert_eq!(unfit.field, "resources.cpu", "{unfit:?}");
    }

    #[test]
    fn what_fits_an_empty_cluster_is_never_refused() {
        for fits in [
            demand(1, 8, Some("h100"), 32_000, 256),
            demand(2, 4, None, 1000, 1),
            demand(3, 0, None, 8000, 32),
            demand(1, 0, None, 0, 0),
        ] {
            assert_eq!(never_fits(&cluster(), &fits), None, "{fits:?}");
        }
        assert_eq!(never_fits(&[], &demand(64, 64, Some("x"), 1 << 40, 1 << 20)), None, "no nodes known: no judgement");
    }
}
