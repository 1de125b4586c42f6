//! Lineage: which jobs read and wrote which dataset versions, which artefacts they produced, and
//! which jobs ran which again, walked upstream (where a thing came from) and downstream (what
//! came of it) from one job or one dataset version. `yard lineage` and the lineage page show it.
//!
//! The walk's bookkeeping is here and pure ([`Walk`]): the server reads each level's neighbours
//! from the store and reports them with [`Walk::reach`]; a node is kept once, at the depth it was
//! first reached, under the node it was reached from (that makes the tree the CLI and the page
//! draw), while every edge found is kept for the graph.

use std::collections::HashMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// How many levels a walk goes each way when the caller does not say.
pub const DEFAULT_DEPTH: u32 = 5;
/// The most levels a walk may go each way.
pub const MAX_DEPTH: u32 = 50;
/// The most nodes one answer holds; a walk that found more says `truncated`.
pub const MAX_NODES: usize = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Job,
    Dataset,
    Artifact,
}

/// How two nodes are related; an edge always points the way data flowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// A job read a dataset version through a parameter: dataset -> job.
    Consumed,
    /// A job wrote a dataset version (registered from its output) or uploaded an artefact:
    /// job -> dataset or artefact.
    Produced,
    /// A job was run again (`yard rerun`): original -> rerun.
    Reran,
    /// A run started its weights from a job's checkpoint (`init_from`): source -> fine-tune.
    FineTuned,
}

/// Which way a walk goes from its root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Towards what the root came from.
    Upstream,
    /// Towards what came of the root.
    Downstream,
}

impl Relation {
    /// The words for the step from a node nearer the root to one further away, as the tree
    /// reads: "photos@1 / produced by job ..." upstream, "job ... / produced artefact ..."
    /// downstream.
    pub fn words(self, direction: Direction) -> &'static str {
        match (direction, self) {
            (Direction::Upstream, Relation::Produced) => "produced by",
            (Direction::Upstream, Relation::Consumed) => "read",
            (Direction::Upstream, Relation::Reran) => "rerun of",
            (Direction::Downstream, Relation::Produced) => "produced",
            (Direction::Downstream, Relation::Consumed) => "read by",
            (Direction::Downstream, Relation::Reran) => "rerun as",
            (Direction::Upstream, Relation::FineTuned) => "fine-tuned from",
            (Direction::Downstream, Relation::FineTuned) => "fine-tuned as",
        }
    }
}

/// A job, a dataset version or an artefact, with what identifies it to a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LineageNode {
    /// `job:<id>`, `dataset:<name>@<version>` or `artifact:<job id>/<path>`.
    pub key: String,
    pub kind: NodeKind,
    /// The job's id and name, the dataset's `name@version`, the artefact's path.
    pub label: String,
    /// The job's template and state, the dataset's content hash and URI, the artefact's size and
    /// hash.
    pub detail: String,
    /// Levels from the root: 0 the root, negative upstream, positive downstream.
    pub depth: i32,
    /// The node one level nearer the root it was first reached from, and how (none for the root).
    pub via: Option<Via>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Via {
    pub key: String,
    pub relation: Relation,
    /// The parameter a dataset was read through; a rerun's changed parameters.
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LineageEdge {
    pub from: String,
    pub to: String,
    pub relation: Relation,
    pub note: Option<String>,
}

/// A walk from one job or dataset version (`GET /api/v1/jobs/{id}/lineage`,
/// `GET /api/v1/datasets/{name}/{version}/lineage`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Lineage {
    /// The key of the node walked from.
    pub root: String,
    /// How many levels it went each way.
    pub depth: u32,
    /// The root first, then in the order found.
    pub nodes: Vec<LineageNode>,
    pub edges: Vec<LineageEdge>,
    /// More was there than this answer holds ([`MAX_NODES`], or a node with more readers,
    /// reruns or artefacts than one level lists): walk again from a node further out.
    pub truncated: bool,
}

/// What the store says of a node, before the walk places it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub key: String,
    pub kind: NodeKind,
    pub label: String,
    pub detail: String,
}

impl NodeFacts {
    pub fn job(id: Uuid, name: &str, template: Option<&str>, state: &str) -> NodeFacts {
        let detail = match template {
            Some(template) => format!("{template}, {state}"),
            None => state.to_string(),
        };
        NodeFacts { key: job_key(id), kind: NodeKind::Job, label: format!("{id} {name}"), detail }
    }

    pub fn dataset(name: &str, version: &str, content_hash: &str, uri: &str) -> NodeFacts {
        NodeFacts {
            key: dataset_key(name, version),
            kind: NodeKind::Dataset,
            label: format!("{name}@{version}"),
            detail: format!("{content_hash} at {uri}"),
        }
    }

    pub fn artifact(job: Uuid, path: &str, size: &str, sha256: &str) -> NodeFacts {
        NodeFacts {
            key: format!("artifact:{job}/{path}"),
            kind: NodeKind::Artifact,
            label: path.to_string(),
            detail: format!("{size}, sha256:{sha256}"),
        }
    }
}

pub fn job_key(id: Uuid) -> String {
    format!("job:{id}")
}

pub fn dataset_key(name: &str, version: &str) -> String {
    format!("dataset:{name}@{version}")
}

/// A walk in progress.
#[derive(Debug)]
pub struct Walk {
    depth: u32,
    nodes: Vec<LineageNode>,
    index: HashMap<String, usize>,
    edges: Vec<LineageEdge>,
    truncated: bool,
}

impl Walk {
    /// A walk of up to `depth` levels each way from `root`.
    pub fn new(root: NodeFacts, depth: u32) -> Walk {
        let mut walk = Walk {
            depth: depth.min(MAX_DEPTH),
            nodes: Vec::new(),
            index: HashMap::new(),
            edges: Vec::new(),
            truncated: false,
        };
        walk.place(root, 0, None);
        walk
    }

    /// How many levels it goes each way.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Reports that walking `direction` from `near` (already in the walk) found `far`, related
    /// by `relation`. Keeps the edge (once); returns true when `far` is new, so that the next
    /// level walks on from it. At [`MAX_NODES`] a new node is left out and the walk says
    /// `truncated`.
    pub fn reach(
        &mut self,
        direction: Direction,
        near: &str,
        far: NodeFacts,
        relation: Relation,
        note: Option<String>,
    ) -> bool {
        let Some(&at) = self.index.get(near) else { return false };
        let (from, to) = match direction {
            Direction::Upstream => (far.key.clone(), near.to_string()),
            Direction::Downstream => (near.to_string(), far.key.clone()),
        };
        let known = self.index.contains_key(&far.key);
        if !known && self.nodes.len() >= MAX_NODES {
            self.truncated = true;
            return false;
        }
        if !self.edges.iter().any(|e| e.from == from && e.to == to && e.relation == relation) {
            self.edges.push(LineageEdge { from, to, relation, note: note.clone() });
        }
        if known {
            return false;
        }
        let step = match direction {
            Direction::Upstream => -1,
            Direction::Downstream => 1,
        };
        let depth = self.nodes[at].depth + step;
        let via = Via { key: near.to_string(), relation, note };
        self.place(far, depth, Some(via));
        true
    }

    /// Says that more was there than is kept (a level's list was cut at its limit).
    pub fn truncate(&mut self) {
        self.truncated = true;
    }

    fn place(&mut self, facts: NodeFacts, depth: i32, via: Option<Via>) {
        self.index.insert(facts.key.clone(), self.nodes.len());
        self.nodes.push(LineageNode {
            key: facts.key,
            kind: facts.kind,
            label: facts.label,
            detail: facts.detail,
            depth,
            via,
        });
    }

    pub fn finish(self) -> Lineage {
        Lineage {
            root: self.nodes[0].key.clone(),
            depth: self.depth,
            nodes: self.nodes,
            edges: self.edges,
            truncated: self.truncated,
        }
    }
}

impl Lineage {
    /// The nodes first reached from `key` going `direction`, in the order found: a node's
    /// children in the tree.
    fn children<'a>(&'a self, key: &'a str, direction: Direction) -> impl Iterator<Item = &'a LineageNode> + 'a {
        self.nodes.iter().filter(move |n| {
            n.via.as_ref().is_some_and(|v| v.key == key)
                && match direction {
                    Direction::Upstream => n.depth < 0,
                    Direction::Downstream => n.depth > 0,
                }
        })
    }

    /// The walk as two trees, upstream then downstream, a node a line: what `yard lineage`
    /// prints.
    pub fn render(&self) -> String {
        let root = &self.nodes[0];
        let mut out = format!("{} {} ({})\n", root.kind.word(), root.label, root.detail);
        for (direction, title) in [(Direction::Upstream, "upstream"), (Direction::Downstream, "downstream")] {
            let _ = writeln!(out, "{title}:");
            let rows = self.tree(direction);
            if rows.is_empty() {
                let _ = writeln!(out, "  (nothing recorded)");
            }
            for row in rows {
                let note = row.note.map(|n| format!(" [{n}]")).unwrap_or_default();
                let (node, words) = (row.node, row.words);
                let _ = writeln!(
                    out,
                    "  {}{words} {} {} ({}){note}",
                    row.prefix,
                    node.kind.word(),
                    node.label,
                    node.detail
                );
            }
        }
        if self.truncated {
            let _ = writeln!(out, "(more than shown: walk again from a node further out, or with --depth)");
        }
        out
    }

    /// One direction's tree, depth first, each row with the branch drawing before it
    /// (`├─ `, `│  └─ `): the CLI's lines and the page's rows.
    pub fn tree(&self, direction: Direction) -> Vec<TreeRow<'_>> {
        let mut rows = Vec::new();
        self.tree_below(&self.nodes[0].key, direction, "", &mut rows);
        rows
    }

    fn tree_below<'a>(&'a self, key: &'a str, direction: Direction, indent: &str, rows: &mut Vec<TreeRow<'a>>) {
        let children: Vec<&LineageNode> = self.children(key, direction).collect();
        for (i, child) in children.iter().enumerate() {
            let last = i + 1 == children.len();
            let via = child.via.as_ref().expect("a child has the node it was reached from");
            rows.push(TreeRow {
                prefix: format!("{indent}{}", if last { "└─ " } else { "├─ " }),
                words: via.relation.words(direction),
                note: via.note.as_deref(),
                node: child,
            });
            let deeper = format!("{indent}{}", if last { "   " } else { "│  " });
            self.tree_below(&child.key, direction, &deeper, rows);
        }
    }
}

/// A line of a drawn tree.
#[derive(Debug)]
pub struct TreeRow<'a> {
    /// The branch drawing, `│  ├─ `.
    pub prefix: String,
    /// How it relates to the line it hangs from: "produced by", "read by", "rerun as", ...
    pub words: &'static str,
    pub note: Option<&'a str>,
    pub node: &'a LineageNode,
}

impl NodeKind {
    pub fn word(self) -> &'static str {
        match self {
            NodeKind::Job => "job",
            NodeKind::Dataset => "dataset",
            NodeKind::Artifact => "artefact",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(n: u128, name: &str) -> NodeFacts {
        NodeFacts::job(Uuid::from_u128(n), name, Some("pytorch-ddp 1.5.0"), "succeeded")
    }

    /// raw@1 -> pack (job 1) -> photos@1 -> train (job 2) -> model.bin, and train rerun as job 3.
    fn walk_from_photos() -> Lineage {
        let photos = NodeFacts::dataset("photos", "1", "sha256:ab", "/d/photos");
        let mut walk = Walk::new(photos.clone(), 5);
        assert!(walk.reach(Direction::Upstream, &photos.key, job(1, "pack"), Relation::Produced, None));
        let raw = NodeFacts::dataset("raw", "1", "sha256:cd", "/d/raw");
        assert!(walk.reach(
            Direction::Upstream,
            &job_key(Uuid::from_u128(1)),
            raw,
            Relation::Consumed,
            Some("source".into())
        ));
        assert!(walk.reach(
            Direction::Downstream,
            &photos.key,
            job(2, "train"),
            Relation::Consumed,
            Some("data".into())
        ));
        let train = job_key(Uuid::from_u128(2));
        let model = NodeFacts::artifact(Uuid::from_u128(2), "model.bin", "7 B", "ef");
        assert!(walk.reach(Direction::Downstream, &train, model, Relation::Produced, None));
        assert!(walk.reach(Direction::Downstream, &train, job(3, "train"), Relation::Reran, Some("lr=0.01".into())));
        // The rerun read photos@1 too: an edge to a node already placed, not a second node.
        let rerun = job_key(Uuid::from_u128(3));
        let again = NodeFacts::dataset("photos", "1", "sha256:ab", "/d/photos");
        assert!(!walk.reach(Direction::Upstream, &rerun, again, Relation::Consumed, Some("data".into())));
        walk.finish()
    }

    #[test]
    fn a_node_is_placed_once_at_the_depth_first_reached_and_every_edge_points_the_way_data_flowed() {
        let lineage = walk_from_photos();
        assert_eq!(lineage.root, "dataset:photos@1");
        let depth: Vec<(String, i32)> = lineage.nodes.iter().map(|n| (n.label.clone(), n.depth)).collect();
        let id = |n: u128| Uuid::from_u128(n).to_string();
        assert_eq!(
            depth,
            [
                ("photos@1".to_string(), 0),
                (format!("{} pack", id(1)), -1),
                ("raw@1".into(), -2),
                (format!("{} train", id(2)), 1),
                ("model.bin".into(), 2),
                (format!("{} train", id(3)), 2),
            ]
        );
        let edges: Vec<(String, String, Relation)> =
            lineage.edges.iter().map(|e| (e.from.clone(), e.to.clone(), e.relation)).collect();
        let job = |n: u128| job_key(Uuid::from_u128(n));
        assert_eq!(
            edges,
            [
                (job(1), "dataset:photos@1".into(), Relation::Produced),
                ("dataset:raw@1".into(), job(1), Relation::Consumed),
                ("dataset:photos@1".into(), job(2), Relation::Consumed),
                (job(2), format!("artifact:{}/model.bin", id(2)), Relation::Produced),
                (job(2), job(3), Relation::Reran),
                ("dataset:photos@1".into(), job(3), Relation::Consumed),
            ]
        );
        assert!(!lineage.truncated);
    }

    #[test]
    fn the_tree_reads_upstream_then_downstream_with_the_relation_in_words() {
        let text = walk_from_photos().render();
        let id = |n: u128| Uuid::from_u128(n).to_string();
        let expected = format!(
            "dataset photos@1 (sha256:ab at /d/photos)\n\
             upstream:\n  \
               └─ produced by job {0} pack (pytorch-ddp 1.5.0, succeeded)\n     \
                  └─ read dataset raw@1 (sha256:cd at /d/raw) [source]\n\
             downstream:\n  \
               └─ read by job {1} train (pytorch-ddp 1.5.0, succeeded) [data]\n     \
                  ├─ produced artefact model.bin (7 B, sha256:ef)\n     \
                  └─ rerun as job {2} train (pytorch-ddp 1.5.0, succeeded) [lr=0.01]\n",
            id(1),
            id(2),
            id(3)
        );
        assert_eq!(text, expected);
    }

    #[test]
    fn a_lone_node_says_nothing_was_recorded_and_a_full_walk_says_it_was_cut() {
        let root = job(1, "alone");
        let text = Walk::new(root.clone(), 3).finish().render();
        assert!(text.contains("upstream:\n  (nothing recorded)\ndownstream:\n  (nothing recorded)\n"), "{text}");

        let mut walk = Walk::new(root.clone(), 3);
        for n in 0..MAX_NODES as u128 + 10 {
            walk.reach(Direction::Downstream, &root.key, job(100 + n, "rerun"), Relation::Reran, None);
        }
        let lineage = walk.finish();
        assert_eq!(lineage.nodes.len(), MAX_NODES);
        assert!(lineage.truncated);
        assert!(lineage.render().ends_with("(more than shown: walk again from a node further out, or with --depth)\n"));
    }

    #[test]
    fn a_walk_goes_no_deeper_than_the_limit() {
        assert_eq!(Walk::new(job(1, "a"), 1_000).depth(), MAX_DEPTH);
        assert_eq!(Walk::new(job(1, "a"), 2).depth(), 2);
    }
}
