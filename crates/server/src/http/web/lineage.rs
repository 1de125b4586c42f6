//! The lineage page: where a job or dataset version came from and what came of it, as two trees
//! (the rows `yard lineage` prints), each node a link: a job to its page, a dataset version to
//! its own lineage, an artefact to its download. The same walk as `GET /api/v1/jobs/{id}/lineage`.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;
use trainyard_core::lineage::{Direction, Lineage, LineageNode, NodeKind};

use super::{Nav, WebAuth, WebResult, render};
use crate::app::lineage::LineageRoot;
use crate::http::AppState;
use crate::http::extract::parse_id;
use trainyard_core::error::ObjectKind;

#[derive(Debug, Default, Deserialize)]
pub struct LineageParams {
    depth: Option<u32>,
}

/// A node as the page shows it.
pub struct NodeView {
    kind: &'static str,
    label: String,
    detail: String,
    /// Where its name leads.
    href: String,
    /// Its own lineage, for a job (a dataset's link is its lineage already).
    walk_from: Option<String>,
}

pub struct RowView {
    prefix: String,
    words: &'static str,
    note: Option<String>,
    node: NodeView,
}

/// Upstream or downstream.
pub struct SectionView {
    title: &'static str,
    id: &'static str,
    rows: Vec<RowView>,
}

#[derive(Template)]
#[template(path = "lineage.html")]
struct LineagePage {
    nav: Nav,
    root: NodeView,
    sections: Vec<SectionView>,
    depth: u32,
    truncated: bool,
}

pub async fn job(
    State(state): State<AppState>,
    auth: WebAuth,
    Path(id): Path<String>,
    Query(params): Query<LineageParams>,
) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let lineage = state.app.lineage(&auth.caller, LineageRoot::Job(job_id), params.depth).await?;
    Ok(page(&auth, "jobs", &lineage))
}

pub async fn dataset(
    State(state): State<AppState>,
    auth: WebAuth,
    Path((name, version)): Path<(String, String)>,
    Query(params): Query<LineageParams>,
) -> WebResult<Response> {
    let lineage = state.app.lineage(&auth.caller, LineageRoot::Dataset { name, version }, params.depth).await?;
    Ok(page(&auth, "datasets", &lineage))
}

fn page(auth: &WebAuth, current: &'static str, lineage: &Lineage) -> Response {
    let rows = |direction| -> Vec<RowView> {
        lineage
            .tree(direction)
            .into_iter()
            .map(|row| RowView {
                prefix: row.prefix,
                words: row.words,
                note: row.note.map(str::to_string),
                node: view(row.node),
            })
            .collect()
    };
    render(&LineagePage {
        nav: Nav::new(auth, current),
        root: view(&lineage.nodes[0]),
        sections: vec![
            SectionView { title: "Upstream", id: "upstream", rows: rows(Direction::Upstream) },
            SectionView { title: "Downstream", id: "downstream", rows: rows(Direction::Downstream) },
        ],
        depth: lineage.depth,
        truncated: lineage.truncated,
    })
}

fn view(node: &LineageNode) -> NodeView {
    // The key after its kind: `<id>`, `<name>@<version>`, `<job id>/<path>`.
    let rest = node.key.split_once(':').map_or(node.key.as_str(), |(_, rest)| rest);
    let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let (href, walk_from) = match node.kind {
        NodeKind::Job => (format!("/jobs/{rest}"), Some(format!("/jobs/{rest}/lineage"))),
        NodeKind::Dataset => {
            let (name, version) = rest.rsplit_once('@').unwrap_or((rest, ""));
            (format!("/datasets/{}/{}/lineage", encode(name), encode(version)), None)
        }
        NodeKind::Artifact => {
            let (job, path) = rest.split_once('/').unwrap_or((rest, ""));
            let path: Vec<String> = path.split('/').map(encode).collect();
            (format!("/jobs/{job}/artifacts/{}", path.join("/")), None)
        }
    };
    NodeView { kind: node.kind.word(), label: node.label.clone(), detail: node.detail.clone(), href, walk_from }
}
