//! Nodes, as the scheduler's snapshot needs them: allocatable GPUs by type, CPU and memory,
//! and whether Trainyard may place replicas there at all. Pure over the node objects.

use k8s_openapi::api::core::v1::Node;
use trainyard_core::resources::{Cpu, Memory};
use trainyard_executor::{Gpu, Inventory, NodeInventory};

use crate::names::GPU_RESOURCE;

/// One node in Trainyard's terms. The GPU type is the label's value in lower case, the form
/// job specs use.
pub fn node_inventory(node: &Node, gpu_label_key: &str) -> NodeInventory {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let quantity = |name: &str| allocatable.and_then(|a| a.get(name)).map(|q| q.0.as_str());
    let gpus: u32 = quantity(GPU_RESOURCE).and_then(|q| q.parse().ok()).unwrap_or(0);
    let gpu_type = node.metadata.labels.as_ref().and_then(|l| l.get(gpu_label_key)).map(|v| v.to_ascii_lowercase());
    NodeInventory {
        name: node.metadata.name.clone().unwrap_or_default(),
        gpu_type: if gpus > 0 { gpu_type } else { None },
        gpus,
        cpu_millis: quantity("cpu").and_then(|q| Cpu::parse(q).ok()).map(Cpu::millis).unwrap_or(0),
        memory_bytes: quantity("memory").and_then(|q| Memory::parse(q).ok()).map(Memory::bytes).unwrap_or(0),
        schedulable: schedulable(node),
    }
}

/// Ready, not cordoned, and without a taint our replicas do not tolerate (we tolerate only the
/// GPU taint). A draining node is cordoned, so it drops out at once.
pub fn schedulable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    let blocking_taint = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute") && taint.key != GPU_RESOURCE);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready && !blocking_taint
}

/// The sum of every schedulable node: what [`trainyard_executor::Executor::inventory`] reports.
pub fn total(nodes: &[NodeInventory]) -> Inventory {
    let usable: Vec<&NodeInventory> = nodes.iter().filter(|n| n.schedulable).collect();
    let mut gpus = Vec::new();
    for node in &usable {
        if let Some(gpu_type) = &node.gpu_type {
            for _ in 0..node.gpus {
                gpus.push(Gpu { index: gpus.len() as u32, gpu_type: gpu_type.clone() });
            }
        }
    }
    Inventory {
        cpu_millis: usable.iter().map(|n| n.cpu_millis).sum(),
        memory_bytes: usable.iter().map(|n| n.memory_bytes).sum(),
        gpus,
    }
}

/// The label value to select nodes of a GPU type by: the cluster's own spelling when a node
/// has it (labels are case-sensitive; Trainyard's types are lower case).
pub fn gpu_label_value(nodes: &[std::sync::Arc<Node>], gpu_label_key: &str, gpu_type: &str) -> String {
    nodes
        .iter()
        .filter_map(|n| n.metadata.labels.as_ref()?.get(gpu_label_key))
        .find(|value| value.eq_ignore_ascii_case(gpu_type))
        .cloned()
        .unwrap_or_else(|| gpu_type.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    fn gpu_node(name: &str, extra_spec: serde_json::Value) -> Node {
        node(serde_json::json!({
            "metadata": { "name": name, "labels": { "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" } },
            "spec": extra_spec,
            "status": {
                "allocatable": { "cpu": "95500m", "memory": "1000Gi", "nvidia.com/gpu": "8" },
                "conditions": [{ "type": "Ready", "status": "True" }],
            },
        }))
    }

    #[test]
    fn gpu_nodes_report_their_type_in_lower_case_and_allocatable_amounts() {
        let inv = node_inventory(&gpu_node("gpu-1", serde_json::json!({})), "nvidia.com/gpu.product");
        assert_eq!(inv.gpu_type.as_deref(), Some("nvidia-h100-80gb-hbm3"));
        assert_eq!((inv.gpus, inv.cpu_millis, inv.memory_bytes), (8, 95_500, 1000 << 30));
        assert!(inv.schedulable);
    }

    #[test]
    fn cordoned_and_tainted_nodes_are_left_out_but_the_gpu_taint_is_tolerated() {
        let key = "nvidia.com/gpu.product";
        let cordoned = gpu_node("a", serde_json::json!({ "unschedulable": true }));
        let tainted =
            gpu_node("b", serde_json::json!({ "taints": [{ "key": "maintenance", "effect": "NoSchedule" }] }));
        let gpu_tainted =
            gpu_node("c", serde_json::json!({ "taints": [{ "key": "nvidia.com/gpu", "effect": "NoSchedule" }] }));
        let nodes: Vec<NodeInventory> =
            [cordoned, tainted, gpu_tainted].iter().map(|n| node_inventory(n, key)).collect();
        assert_eq!(nodes.iter().map(|n| n.schedulable).collect::<Vec<_>>(), [false, false, true]);
        let inventory = total(&nodes);
        assert_eq!(inventory.gpus.len(), 8, "only node c counts");
        assert_eq!(inventory.gpu_types(), ["nvidia-h100-80gb-hbm3"]);
    }

    #[test]
    fn a_node_that_is_not_ready_offers_nothing() {
        let mut n = gpu_node("x", serde_json::json!({}));
        n.status.as_mut().unwrap().conditions = Some(vec![]);
        assert!(!schedulable(&n));
    }
}
