//! How `yard` shows things: JSON for scripts, tables and short lines for people.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{CellAlignment, ContentArrangement, Table};
use serde::Serialize;
use trainyard_core::api::{
    Artifact, AuditPage, Job, JobAttempt, JobCheckpoints, JobEvent, JobMetrics, JobPage, Nodes, QuotaReport, Schedule,
    TemplateDetail, TemplateSummary, TokenInfo, UsageReport, UsageRow, Volume,
};

use std::io::Write;
use trainyard_core::job::JobState;

use crate::Output;
use trainyard_core::resources::{human_cpus, human_gpus, human_memory};

pub fn print<T: Serialize>(out: Output, value: &T, human: impl FnOnce(&T) -> String) -> anyhow::Result<ExitCode> {
    let text = match out {
        Output::Json => serde_json::to_string_pretty(value)? + "\n",
        // `-o csv` is refused before any command but `yard usage` (which writes its own) runs.
        Output::Table | Output::Wide | Output::Csv => human(value),
    };
    // Written, not `print!`ed: a reader that went away (`yard jobs ls | head`) is an error main
    // ends on quietly, not a panic.
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// `-o wide`: tables show every value whole, however wide (set once by `main`).
pub(crate) static WIDE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The width piped tables fit in, as `squeue`'s fixed columns do.
const PIPED_COLUMNS: u16 = 80;

/// Columns at most this wide (header and every value) are never cut or shrunk: ids, states,
/// counts and times stay whole; names and reasons give way.
const WHOLE_COLUMN_CHARS: usize = 20;

/// A table that fits where it is printed: see [`Fitted`].
pub(crate) fn table(header: &[&str]) -> Fitted {
    let mut table = Table::new();
    table.load_style(UTF8_BORDERS_ONLY).set_content_arrangement(ContentArrangement::Dynamic).set_header(header);
    Fitted { table, width: None, lines_per_row: 1 }
}

/// A table printed one line a row within the terminal's width: `$COLUMNS` when set (as `ls`
/// reads it), else the terminal's, else (piped) 80 columns of plain text without borders. Short
/// columns (ids, states, counts, times) stay whole; the longer ones are cut with `…`, never
/// wrapped inside a word. `-o wide` ([`WIDE`]) prints every value whole instead.
pub(crate) struct Fitted {
    table: Table,
    /// Overrides where it is printed (tests).
    width: Option<u16>,
    /// Lines a row may take, cut beyond (1: one line a row, as `squeue` prints).
    lines_per_row: usize,
}

impl Fitted {
    /// Fits `width` columns, wherever it is printed.
    pub fn fit_width(mut self, width: u16) -> Fitted {
        self.width = Some(width);
        self
    }

    /// Marks `columns` (by index) as the ones that give way first, however short: never
    /// narrower than their header (a header is not cut or broken either).
    pub fn flexible(mut self, columns: &[usize]) -> Fitted {
        let headers: Vec<u16> = self
            .table
            .header()
            .map(|h| h.cell_iter().map(|c| c.content().chars().count().max(4) as u16).collect())
            .unwrap_or_default();
        for &i in columns {
            let least = headers.get(i).copied().unwrap_or(4);
            if let Some(column) = self.table.column_mut(i) {
                column.set_constraint(comfy_table::ColumnConstraint::LowerBoundary(comfy_table::Width::Fixed(least)));
            }
        }
        self
    }

    /// Lets each row take up to `lines` lines (wrapped at spaces) before it is cut.
    pub fn lines_per_row(mut self, lines: usize) -> Fitted {
        self.lines_per_row = lines.max(1);
        self
    }

    fn fitted(&self) -> Table {
        let mut table = self.table.clone();
        if WIDE.load(std::sync::atomic::Ordering::Relaxed) {
            table.set_content_arrangement(ContentArrangement::Disabled);
            return table;
        }
        let columns = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<u16>().ok()).filter(|&c| c > 0);
        #[cfg(test)]
        let columns = tests::WIDTH.get().or(columns);
        let piped = !std::io::IsTerminal::is_terminal(&std::io::stdout());
        match self.width.or(columns) {
            Some(width) => {
                table.set_width(width);
            }
            None if piped => {
                table.load_style(comfy_table::presets::NOTHING);
                table.set_width(PIPED_COLUMNS);
            }
            // comfy-table reads the terminal's width itself.
            None => {}
        }
        table.set_truncation_indicator("…");
        let widest: Vec<usize> = (0..table.column_count())
            .map(|i| {
                let cells = table.column_cells_iter(i).flatten().map(|cell| cell.content().chars().count());
                let header =
                    table.header().and_then(|h| h.cell_iter().nth(i)).map_or(0, |c| c.content().chars().count());
                cells.chain([header]).max().unwrap_or(0)
            })
            .collect();
        // One space between columns, beside the separator: eight columns keep 8 more for values.
        let last = table.column_count().saturating_sub(1);
        for (i, column) in table.column_iter_mut().enumerate() {
            column.set_padding((1, u16::from(i == last)));
        }
        for (column, widest) in table.column_iter_mut().zip(widest) {
            // A table may say which columns give way (`flexible`); else the short ones stay.
            if column.constraint().is_none() && widest <= WHOLE_COLUMN_CHARS {
                column.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
            }
        }
        for row in table.row_iter_mut() {
            row.max_height(self.lines_per_row);
        }
        table
    }
}

impl std::ops::Deref for Fitted {
    type Target = Table;
    fn deref(&self) -> &Table {
        &self.table
    }
}

impl std::ops::DerefMut for Fitted {
    fn deref_mut(&mut self) -> &mut Table {
        &mut self.table
    }
}

impl std::fmt::Display for Fitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.fitted())
    }
}

/// A duration as people read it: 42s, 3m05s, 2h04m, 3d02h.
pub fn elapsed(duration: chrono::TimeDelta) -> String {
    let s = duration.num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

pub(crate) fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// A time in a narrow column: the time of day when it is today (UTC), else the date and minute.
pub(crate) fn when_short(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if at.date_naive() == now.date_naive() {
        at.format("%H:%M:%S").to_string()
    } else {
        at.format("%m-%d %H:%M").to_string()
    }
}

/// Jobs as `squeue` shows them: a short id (what every id argument takes), who, how long.
pub fn jobs_table(page: &JobPage) -> String {
    jobs_table_of(page, false)
}

/// Every tenant's jobs (`yard jobs ls --all-tenants`): the same table with a TENANT column.
pub fn jobs_table_every_tenant(page: &JobPage) -> String {
    jobs_table_of(page, true)
}

fn jobs_table_of(page: &JobPage, with_tenant: bool) -> String {
    if page.items.is_empty() {
        return "no jobs match\n".into();
    }
    // One line a job in 80 columns: names, users and reasons give way (-o wide has them whole).
    let mut t = if with_tenant {
        table(&["ID", "TENANT", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ELAPSED", "REASON"])
            .flexible(&[1, 2, 3, 8])
    } else {
        table(&["ID", "NAME", "USER", "STATE", "GPUS", "SUBMITTED", "ELAPSED", "REASON"]).flexible(&[1, 2, 7])
    };
    let tenant_column = |job: &Job, mut row: Vec<String>| {
        if with_tenant {
            row.insert(1, job.tenant.clone());
        }
        row
    };
    let now = Utc::now();
    // An array's queued jobs are one line, as squeue shows a pending array: `sweep[4-19]`.
    let mut queued_of_array: std::collections::HashMap<uuid::Uuid, Vec<&Job>> = Default::default();
    for job in page.items.iter().filter(|j| j.state == JobState::Queued) {
        if let Some(array) = job.array_id {
            queued_of_array.entry(array).or_default().push(job);
        }
    }
    for job in &page.items {
        let id = job.id.to_string();
        let grouped = job.array_id.and_then(|a| queued_of_array.get(&a)).filter(|group| group.len() > 1);
        if let Some(group) = grouped.filter(|_| job.state == JobState::Queued) {
            if !std::ptr::eq(group[0], job) {
                continue;
            }
            let indexes: Vec<u32> = group.iter().filter_map(|j| j.array_index).collect();
            let (low, high) = (indexes.iter().min().copied().unwrap_or(0), indexes.iter().max().copied().unwrap_or(0));
            t.add_row(tenant_column(
                job,
                vec![
                    id[..13].to_string(),
                    format!("{}[{low}-{high}] ({} jobs)", job.name, group.len()),
                    job.created_by.clone(),
                    job.state.to_string(),
                    (job.spec.resources.gpus * job.spec.replicas).to_string(),
                    when(job.created_at),
                    "-".into(),
                    job.reason.clone().unwrap_or_default(),
                ],
            ));
            continue;
        }
        let name = match job.array_index {
            Some(index) => format!("{}[{index}]", job.name),
            None => job.name.clone(),
        };
        t.add_row(tenant_column(
            job,
            vec![
                // The first 13 characters (the submit time to the millisecond): what `yard logs` takes.
                id[..13].to_string(),
                name,
                job.created_by.clone(),
                job.state.to_string(),
                (job.spec.resources.gpus * job.spec.replicas).to_string(),
                when_short(job.created_at, now),
                job.started_at
                    .map(|start| elapsed(job.finished_at.unwrap_or(now) - start))
                    .unwrap_or_else(|| "-".into()),
                job.reason.clone().unwrap_or_default(),
            ],
        ));
    }
    let mut text = format!("{t}\n");
    if let Some(cursor) = &page.next_cursor {
        let every = if with_tenant { "--all-tenants " } else { "" };
        text.push_str(&format!("more: yard jobs ls {every}--cursor {cursor}\n"));
    }
    text
}

/// The queue: position, short id, who, why, when. Empty: one line that says so.
pub fn queue_table(queue: &trainyard_core::api::Queue) -> String {
    let others = match queue.others_waiting {
        0 => String::new(),
        n => format!("(and {n} waiting jobs of other tenants)\n"),
    };
    // The server answers at once from its latest standings while it computes newer ones.
    let seconds_ago = (Utc::now() - queue.as_of).num_seconds().max(0);
    let as_of = format!("as of {} ({seconds_ago} s ago)\n", when(queue.as_of));
    if queue.items.is_empty() {
        return format!("no job of yours is waiting\n{others}{as_of}");
    }
    let mut t = table(&["POS", "ID", "NAME", "TENANT", "PRIORITY", "REASON", "EST. START"]).flexible(&[2, 3, 5]);
    let now = Utc::now();
    for entry in &queue.items {
        let s = &entry.schedule;
        let id = entry.id.to_string();
        t.add_row(vec![
            if s.admitted_now {
                "next".to_string()
            } else {
                s.cluster_position.map(|p| p.to_string()).unwrap_or_default()
            },
            // The first 13 characters (the submit time to the millisecond): what `yard logs` takes.
            id[..13].to_string(),
            entry.name.clone(),
            entry.tenant.clone(),
            entry.priority.to_string(),
            s.reason.clone().unwrap_or_else(|| "starts at the next admission".into()),
            s.estimated_start
                .map(|at| when_short(at, now))
                .unwrap_or_else(|| if s.admitted_now { "now".into() } else { "-".into() }),
        ]);
    }
    format!("{t}\n{others}{as_of}")
}

/// The most characters a value takes in a `yard diff` cell: beyond it a list shows only its items
/// that differ, and text is cut with `…` (`-o json` has every value whole).
const DIFF_CELL_CHARS: usize = 80;
/// The most differing items of a long list shown in a cell.
const DIFF_ITEMS_SHOWN: usize = 6;

/// Runs side by side, a table per section: the fields that differ (every field with --all, those
/// that differ marked `*`). Columns are the runs as given, A, B, C..., by their ids' first 13
/// characters. Tables fit the terminal (see [`diff_text`]).
pub fn diff_table(c: &trainyard_core::compare::Comparison) -> String {
    diff_text(c, None)
}

/// [`diff_table`] `width` columns wide (`None`: the terminal's width, as comfy-table finds it, or
/// unbounded when stdout is no terminal). Long values are summarised (see [`DIFF_CELL_CHARS`])
/// and the rest wrap, so that a pytorch-ddp run's twenty-odd `spec.args` shows as the one
/// argument that changed rather than a 900-column line.
fn diff_text(c: &trainyard_core::compare::Comparison, width: Option<u16>) -> String {
    if c.differ == 0 && !c.all {
        return format!("no differences ({} fields the same; ids and times not compared)\n", c.same);
    }
    let columns: Vec<String> = c
        .runs
        .iter()
        .enumerate()
        .map(|(i, run)| format!("{} {}", char::from(b'A' + i as u8), &run.id.to_string()[..13]))
        .collect();
    let mut header = vec!["FIELD"];
    header.extend(columns.iter().map(String::as_str));
    let mut text = String::new();
    let mut summarised = false;
    for section in c.sections.iter().filter(|s| !s.fields.is_empty()) {
        text.push_str(&format!("{} ({} differ, {} the same)\n", section.name, section.differ, section.same));
        // Rows wrap here (at spaces): a field's values side by side are what is read.
        let mut t = table(&header).lines_per_row(usize::MAX);
        if let Some(width) = width {
            t = t.fit_width(width);
        }
        for field in &section.fields {
            let name = if !c.all {
                field.field.clone()
            } else if field.differs {
                format!("* {}", field.field)
            } else {
                format!("  {}", field.field)
            };
            let (cells, cut) = diff_cells(&field.values);
            summarised |= cut;
            let mut row = vec![name];
            row.extend(cells);
            t.add_row(row);
        }
        text.push_str(&format!("{t}\n\n"));
    }
    text.push_str(&format!("{} fields differ, {} the same\n", c.differ, c.same));
    if summarised {
        text.push_str("long values are cut (…) or shown by the items that differ; -o json has them whole\n");
    }
    text
}

/// One field's values as cells, and whether any was summarised: a long list as the items at the
/// positions where the runs' lists differ (`[7] --lr=0.01`), other long values cut with `…`.
fn diff_cells(values: &[Option<serde_json::Value>]) -> (Vec<String>, bool) {
    let show = |v: Option<&serde_json::Value>| match v {
        None => "(absent)".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let whole: Vec<String> = values.iter().map(|v| show(v.as_ref())).collect();
    if whole.iter().all(|cell| cell.chars().count() <= DIFF_CELL_CHARS) {
        return (whole, false);
    }
    let lists: Option<Vec<&Vec<serde_json::Value>>> =
        values.iter().map(|v| v.as_ref().and_then(serde_json::Value::as_array)).collect();
    let differing: Vec<usize> = match &lists {
        Some(lists) => {
            let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
            (0..longest).filter(|&i| lists.iter().any(|l| l.get(i) != lists[0].get(i))).collect()
        }
        None => Vec::new(),
    };
    let cells = match lists {
        Some(lists) if !differing.is_empty() => lists
            .iter()
            .map(|list| {
                let mut lines: Vec<String> = differing
                    .iter()
                    .take(DIFF_ITEMS_SHOWN)
                    .map(|&i| format!("[{i}] {}", cut(&show(list.get(i)), DIFF_CELL_CHARS)))
                    .collect();
                if differing.len() > DIFF_ITEMS_SHOWN {
                    lines.push(format!("… {} more differ", differing.len() - DIFF_ITEMS_SHOWN));
                }
                lines.push(format!("({} items, the rest the same)", list.len()));
                lines.join("\n")
            })
            .collect(),
        _ => whole.iter().map(|cell| cut(cell, DIFF_CELL_CHARS)).collect(),
    };
    (cells, true)
}

/// `text` at most `chars` characters long, cut with `…` where it was longer.
pub(crate) fn cut(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_string();
    }
    let mut kept: String = text.chars().take(chars.saturating_sub(1)).collect();
    kept.push('…');
    kept
}

/// The tenant's datasets, one version a row (the content hash cut to what tells them apart).
pub fn datasets_table(list: &[trainyard_core::api::Dataset]) -> String {
    if list.is_empty() {
        return "no datasets yet: `yard datasets push NAME FOLDER`, or `yard datasets register NAME@VERSION --from-job ID`\n".into();
    }
    let mut t = table(&["DATASET", "SAMPLES", "SIZE", "CONTENT HASH", "URI", "REGISTERED"]);
    for d in list {
        t.add_row(vec![
            format!("{}@{}", d.name, d.version),
            d.samples.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            d.size_bytes.map(|b| human_memory(b.max(0) as u64)).unwrap_or_else(|| "-".into()),
            d.content_hash.chars().take(19).collect(),
            d.uri.clone(),
            when(d.created_at),
        ]);
    }
    format!("{t}\n")
}

/// One dataset version, a field a line.
pub fn dataset_detail(d: &trainyard_core::api::Dataset) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    format!(
        "dataset:      {}@{}\nuri:          {}\n{}format:       {}\nsamples:      {}\nsize:         {}\ncontent hash: {}\ncached on:    {}\nfrom job:     {}\nregistered:   {} by {}\n",
        d.name,
        d.version,
        d.uri,
        d.store_prefix.as_ref().map(|p| format!("stored at:    {p} (Trainyard's object store)\n")).unwrap_or_default(),
        d.format,
        or_dash(d.samples.map(|s| s.to_string())),
        or_dash(d.size_bytes.map(|b| human_memory(b.max(0) as u64))),
        d.content_hash,
        if d.cached_on.is_empty() { "no node's shard cache".to_string() } else { d.cached_on.join(", ") },
        or_dash(d.source_job.map(|j| j.to_string())),
        when(d.created_at),
        d.created_by
    )
}

/// A job's artefacts, one a row: path, size, the SHA-256's first 12 hex digits (`-o json` has it
/// whole), when it was written.
pub fn artifacts_table(list: &[Artifact]) -> String {
    if list.is_empty() {
        return "no artefacts yet: `yard artifacts put JOB PATH FILE`, or the job's engine uploads them\n".into();
    }
    let mut t = table(&["PATH", "SIZE", "SHA-256", "CREATED"]);
    for a in list {
        t.add_row(vec![
            a.path.clone(),
            human_memory(a.size_bytes),
            a.sha256.as_deref().map_or_else(|| "-".to_string(), |sha| sha.chars().take(12).collect()),
            when(a.modified_at),
        ]);
    }
    if let Some(size) = t.column_mut(1) {
        size.set_cell_alignment(CellAlignment::Right);
    }
    format!("{t}\n")
}

/// A job's checkpoints, oldest step first, under the folder they are in.
pub fn checkpoints_table(list: &JobCheckpoints) -> String {
    let mut text = String::new();
    if let Some(folder) = &list.folder {
        text.push_str(&format!("folder: {folder}\n"));
    }
    if let Some(note) = &list.note {
        text.push_str(&format!("{note}\n"));
    }
    if list.checkpoints.is_empty() {
        if list.folder.is_some() {
            text.push_str("no checkpoints yet\n");
        } else if list.note.is_none() {
            text.push_str("this job writes no checkpoints\n");
        }
        return text;
    }
    let mut t = table(&["STEP", "SIZE", "SAVED", "PATH"]);
    for c in &list.checkpoints {
        t.add_row(vec![c.step.to_string(), human_memory(c.size_bytes), when(c.saved_at), c.path.clone()]);
    }
    for column in [0, 1] {
        if let Some(col) = t.column_mut(column) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    format!("{text}{t}\n")
}

/// `yard jobs show`'s lines on checkpoints: where, and each step with its size and time (none
/// for a job that writes none).
pub fn checkpoints_brief(list: &JobCheckpoints) -> String {
    let Some(folder) = &list.folder else {
        return list.note.as_ref().map(|note| format!("checkpoints: {note}\n")).unwrap_or_default();
    };
    let mut text = format!("checkpoints: {folder}\n");
    if list.checkpoints.is_empty() {
        text.push_str(&format!("  {}\n", list.note.as_deref().unwrap_or("none yet")));
    }
    for c in &list.checkpoints {
        text.push_str(&format!(
            "  step {:>8}  {:>9}  saved {}\n",
            c.step,
            human_memory(c.size_bytes),
            when(c.saved_at)
        ));
    }
    text
}

/// The tenant's volumes, one a row; one that jobs cannot use yet says why.
pub fn volumes_table(list: &[Volume]) -> String {
    if list.is_empty() {
        return "no volumes yet: `yard volumes create NAME --size 10Gi`\n".into();
    }
    let mut t = table(&["NAME", "SIZE", "ACCESS MODE", "STORAGE CLASS", "PATH", "CREATED", "STATUS"]);
    for v in list {
        t.add_row(vec![
            v.name.clone(),
            human_memory(v.size_bytes),
            v.access_mode.as_str().to_string(),
            v.storage_class.clone().unwrap_or_else(|| "-".into()),
            v.path.clone(),
            when(v.created_at),
            v.pending_reason.as_deref().map_or_else(|| "ready".to_string(), |r| format!("not ready: {r}")),
        ]);
    }
    format!("{t}\n")
}

/// Each node's GPUs, CPU and memory as "allocated/total", and what is free.
pub fn nodes_table(nodes: &trainyard_core::api::Nodes) -> String {
    if nodes.items.is_empty() {
        return "no nodes: the executor has not reported any yet\n".into();
    }
    let mut t =
        table(&["NODE", "GPU TYPE", "GPUS", "CPU", "MEMORY", "REPLICAS", "FREE", "CACHED"]).flexible(&[0, 6, 7]);
    // Drained nodes below the table, each on a line with its reason, whole (a column would not
    // fit 80 columns beside the rest).
    let mut drains = String::new();
    for n in &nodes.items {
        if let Some(drain) = &n.drained {
            let reason = if drain.reason.is_empty() { "no reason given".to_string() } else { drain.reason.clone() };
            drains.push_str(&format!(
                "{} is DRAINED (no new jobs): {reason}; by {} at {}\n",
                n.name,
                drain.drained_by,
                when(drain.drained_at)
            ));
        }
        let cores = |millis: u64| format!("{:.1}", millis as f64 / 1000.0);
        let free_gpus = n.gpus.saturating_sub(n.gpus_allocated);
        let free_cpu = n.cpu_millis.saturating_sub(n.cpu_millis_allocated);
        let free_memory = n.memory_bytes.saturating_sub(n.memory_bytes_allocated);
        t.add_row(vec![
            n.name.clone(),
            n.gpu_type.clone().unwrap_or_else(|| "-".into()),
            format!("{}/{}", n.gpus_allocated, n.gpus),
            format!("{}/{}", cores(n.cpu_millis_allocated), cores(n.cpu_millis)),
            format!("{}/{}", human_memory(n.memory_bytes_allocated), human_memory(n.memory_bytes)),
            n.replicas.to_string(),
            format!(
                "{}, {}, {}",
                human_gpus(u64::from(free_gpus), None),
                human_cpus(free_cpu),
                human_memory(free_memory)
            ),
            if n.cached_datasets.is_empty() { "-".into() } else { n.cached_datasets.join(", ") },
        ]);
    }
    format!("{t}\n{drains}")
}

/// The jobs that run this one again, for `yard jobs show`.
pub fn reruns(reruns: &[Job]) -> String {
    if reruns.is_empty() {
        return String::new();
    }
    let ids: Vec<String> = reruns.iter().map(|j| format!("{} ({})", j.id, j.state)).collect();
    format!("rerun as:  {}\n", ids.join(", "))
}

/// A parameter value as a person would type it: strings without quotes.
fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn job_detail(job: &Job, attempts: &[JobAttempt], events: &[JobEvent], outputs: &serde_json::Value) -> String {
    let spec = &job.spec;
    let mut text = format!(
        "{id}  {name}\nstate:     {state}{reason}\ncommand:   {argv}\nreplicas:  {replicas} x ({cpu}, {memory}, {gpus})\npriority:  {priority}   restarts: {restarts} of {max}\nsubmitted: {submitted} by {by}\n",
        id = job.id,
        name = job.name,
        state = job.state,
        reason = job.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
        argv = serde_json::to_string(&spec.argv()).unwrap_or_default(),
        replicas = spec.replicas,
        cpu = human_cpus(spec.resources.cpu.millis()),
        memory = human_memory(spec.resources.memory.bytes()),
        gpus = human_gpus(u64::from(spec.resources.gpus), spec.resources.gpu_type.as_deref()),
        priority = job.priority,
        restarts = job.restart_count,
        max = job.max_restarts,
        submitted = when(job.created_at),
        by = job.created_by,
    );
    if let Some(code) = &spec.code {
        text.push_str(&format!("code:      {} ({})\n", code.digest, human_memory(code.size_bytes)));
    }
    if let Some(t) = &spec.template {
        text.push_str(&format!("template:  {} {} ({})\n", t.name, t.version, t.digest));
    }
    if let Some(original) = job.rerun_of {
        let changed = match &job.rerun_overrides {
            Some(serde_json::Value::Object(set)) if !set.is_empty() => {
                let set: Vec<String> = set.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
                format!(" with {}", set.join(" "))
            }
            _ => " exactly".to_string(),
        };
        text.push_str(&format!("rerun of:  {original}{changed}\n"));
        for input in &job.rerun_unpinned {
            text.push_str(&format!("unpinned:  {input} (accepted)\n"));
        }
    }
    if let Some(source) = &job.init_from {
        text.push_str(&format!(
            "init from: job {} checkpoint step {} (weights only: fine-tuned)\n",
            source.job_id, source.step
        ));
    }
    if !attempts.is_empty() {
        let mut t = table(&["ATTEMPT", "STARTED", "ENDED", "EXIT CODES", "REASON"]);
        for a in attempts {
            let codes: Vec<String> =
                a.exit_codes.iter().map(|c| c.map(|c| c.to_string()).unwrap_or_else(|| "-".into())).collect();
            t.add_row(vec![
                a.attempt.to_string(),
                when(a.started_at),
                a.ended_at.map(when).unwrap_or_default(),
                codes.join(","),
                a.reason.clone().unwrap_or_default(),
            ]);
        }
        text.push_str(&format!("\n{t}\n"));
    }
    if let Some(outputs) = outputs.as_object().filter(|o| !o.is_empty()) {
        text.push_str("\noutputs:\n");
        for (name, value) in outputs {
            text.push_str(&format!("  {name}: {value}\n"));
        }
    }
    let mut t = table(&["#", "AT", "FROM", "TO", "BY", "WHY"]);
    for e in events {
        t.add_row(vec![
            e.seq.to_string(),
            when(e.at),
            e.from_state.map(|s| s.to_string()).unwrap_or_default(),
            e.to_state.to_string(),
            e.actor.clone(),
            e.reason.clone().unwrap_or_default(),
        ]);
    }
    text.push_str(&format!("\n{t}\n"));
    text
}

pub fn tokens_table(tokens: &Vec<TokenInfo>) -> String {
    let mut t = table(&["ID", "NAME", "CREATED", "EXPIRES", "LAST USED", "REVOKED"]);
    for token in tokens {
        t.add_row(vec![
            token.id.to_string(),
            token.name.clone(),
            when(token.created_at),
            token.expires_at.map(when).unwrap_or_else(|| "never".into()),
            token.last_used_at.map(when).unwrap_or_default(),
            token.revoked_at.map(when).unwrap_or_default(),
        ]);
    }
    format!("{t}\n")
}

pub fn templates_table(list: &Vec<TemplateSummary>) -> String {
    let mut t = table(&["NAME", "SOURCE", "LATEST", "VERSIONS", "DESCRIPTION"]);
    for template in list {
        let source = serde_json::to_value(template.source).ok().and_then(|v| v.as_str().map(str::to_string));
        t.add_row(vec![
            template.name.clone(),
            source.unwrap_or_default(),
            template.latest.clone(),
            template.versions.len().to_string(),
            template.description.clone(),
        ]);
    }
    format!("{t}\n")
}

pub fn template_detail(detail: &TemplateDetail) -> String {
    let m = &detail.manifest;
    let mut text = format!(
        "{}@{}  ({})\n{}\ndigest:   {}\nversions: {}\n",
        detail.name,
        detail.version,
        serde_json::to_value(detail.source).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        m["description"].as_str().unwrap_or_default(),
        detail.digest,
        detail.versions.join(", "),
    );
    let mut t = table(&["PARAMETER", "TYPE", "DEFAULT", "RULES", "HELP"]);
    if let Some(params) = m["parameters"].as_object() {
        for (name, spec) in params {
            let default = match (&spec["default"], spec["required"].as_bool().unwrap_or(false)) {
                (_, true) => "(required)".to_string(),
                (serde_json::Value::Null, false) => String::new(),
                (value, false) => value.to_string(),
            };
            let mut rules = Vec::new();
            if let Some(min) = spec["min"].as_f64() {
                rules.push(format!(">= {min}"));
            }
            if let Some(max) = spec["max"].as_f64() {
                rules.push(format!("<= {max}"));
            }
            if let Some(pattern) = spec["pattern"].as_str() {
                rules.push(format!("matches {pattern}"));
            }
            if let Some(choices) = spec["choices"].as_array() {
                let choices: Vec<&str> = choices.iter().filter_map(|c| c.as_str()).collect();
                rules.push(format!("one of {}", choices.join("|")));
            }
            t.add_row(vec![
                name.clone(),
                spec["type"].as_str().unwrap_or_default().to_string(),
                default,
                rules.join(", "),
                spec["help"].as_str().unwrap_or_default().to_string(),
            ]);
        }
    }
    text.push_str(&format!("\n{t}\n"));
    text.push_str(&format!("\ncommand:  {}\n", m["command"]));
    if !detail.files.is_empty() {
        text.push_str(&format!("files:    {}\n", detail.files.join(", ")));
    }
    text
}

/// Per series: points, last value, range and a sparkline; with `points`, every point.
pub fn metrics(metrics: &JobMetrics, points: bool) -> String {
    if points {
        let mut text = String::from("SERIES\tSTEP\tVALUE\n");
        for series in &metrics.series {
            for (step, value) in series.steps.iter().zip(&series.values) {
                text.push_str(&format!("{}\t{step}\t{value}\n", series.name));
            }
        }
        return text;
    }
    let mut t = table(&["SERIES", "POINTS", "LAST STEP", "LAST", "MIN", "MAX", "TREND"]);
    for series in &metrics.series {
        let min = series.values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = series.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        t.add_row(vec![
            series.name.clone(),
            series.values.len().to_string(),
            series.steps.last().map(i64::to_string).unwrap_or_default(),
            series.values.last().map(|v| format!("{v:.6}")).unwrap_or_default(),
            format!("{min:.6}"),
            format!("{max:.6}"),
            sparkline(&series.values, 40),
        ]);
    }
    format!("{t}\n")
}

/// The values squeezed into `width` bars of eight heights (bucket means).
pub fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.is_empty() {
        return String::new();
    }
    let buckets = width.min(values.len());
    let means: Vec<f64> = (0..buckets)
        .map(|b| {
            let chunk = &values
                [b * values.len() / buckets..((b + 1) * values.len() / buckets).max(b * values.len() / buckets + 1)];
            chunk.iter().sum::<f64>() / chunk.len() as f64
        })
        .collect();
    let (lo, hi) = means.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    means
        .iter()
        .map(|v| if hi > lo { BARS[(((v - lo) / (hi - lo)) * 7.0).round() as usize] } else { BARS[3] })
        .collect()
}

/// "Would start now", or why it waits, where, and until when.
pub fn schedule(schedule: &Schedule) -> String {
    let data = schedule.cached_on.map(|c| format!("data:     {c}\n")).unwrap_or_default();
    if schedule.admitted_now {
        return format!("would start now\n{data}");
    }
    let mut text = String::new();
    if let Some(reason) = &schedule.reason {
        text.push_str(&format!("waiting:  {reason}\n"));
    }
    if let (Some(tenant), Some(cluster)) = (schedule.tenant_position, schedule.cluster_position) {
        text.push_str(&format!("position: {tenant} in your tenant's queue, {cluster} in the cluster's"));
        if schedule.behind_higher_priority > 0 {
            text.push_str(&format!(" (behind {} of higher priority)", schedule.behind_higher_priority));
        }
        text.push('\n');
    }
    match schedule.estimated_start {
        Some(at) if schedule.would_preempt > 0 => text.push_str(&format!(
            "estimate: starts around {}, once the {} stopped\n",
            when(at),
            match schedule.would_preempt {
                1 => "job it preempts has".to_string(),
                n => format!("{n} jobs it preempts have"),
            }
        )),
        Some(at) => text.push_str(&format!("estimate: starts around {}\n", when(at))),
        None => text.push_str("estimate: no start within the horizon of running jobs' expected ends\n"),
    }
    for (i, blocker) in schedule.waits_for.iter().enumerate() {
        let label = if i == 0 { "after:   " } else { "         " };
        text.push_str(&format!("{label} {blocker}\n"));
    }
    if schedule.waits_for_more > 0 {
        text.push_str(&format!("          and {} more ending then\n", schedule.waits_for_more));
    }
    if let Some(assumed) = &schedule.runtime_assumed {
        text.push_str(&format!("runtime:  {assumed}\n"));
    }
    text + &data
}

/// The tenant's quota and use per GPU type. A tenant without any gets what is true instead of an
/// empty table: the cluster has no GPUs, or which types it has and who sets a quota for them
/// (`nodes`: the cluster's, read for that case).
pub fn quota(report: &QuotaReport, nodes: Option<&Nodes>) -> String {
    let text = format!(
        "tenant {} (cohort {}, weight {})\n",
        report.tenant,
        report.cohort.as_deref().unwrap_or("none"),
        report.weight
    );
    if report.flavors.is_empty() {
        let mut types: Vec<&str> =
            nodes.iter().flat_map(|n| &n.items).filter(|n| n.gpus > 0).filter_map(|n| n.gpu_type.as_deref()).collect();
        types.sort_unstable();
        types.dedup();
        let no_gpus = nodes.is_some() && types.is_empty();
        let why = if no_gpus {
            "no GPU quotas: this cluster has no GPUs.\n".to_string()
        } else {
            let has = if types.is_empty() { String::new() } else { format!(" This cluster has {}.", types.join(", ")) };
            format!(
                "no GPU quota yet: GPU jobs wait until a platform admin sets one (`yard admin quota set {} GPU-TYPE --nominal N`).{has}\n",
                report.tenant
            )
        };
        return format!("{text}{why}Jobs without GPUs need no quota; `yard nodes` shows the CPUs and memory free.\n");
    }
    let mut t = table(&["GPU TYPE", "NOMINAL", "USED", "BORROWED", "LENT", "BORROW LIMIT", "LEND LIMIT", "USE"]);
    for f in &report.flavors {
        let limit = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        t.add_row(vec![
            f.flavor.clone(),
            f.nominal.to_string(),
            f.used.to_string(),
            f.borrowed.to_string(),
            f.lent.to_string(),
            limit(f.borrowing_limit),
            limit(f.lending_limit),
            bar(f.used, f.nominal.max(f.used).max(1), 20),
        ]);
    }
    let mut text = format!("{text}{t}\n");
    for f in report.flavors.iter().filter(|f| f.spare > 0) {
        text += &format!(
            "{}: also {} GPUs on spare room, outside the quota (stopped first when needed)\n",
            f.flavor, f.spare
        );
    }
    text
}

/// `used` of `total` as a bar of `width` cells.
fn bar(used: u64, total: u64, width: usize) -> String {
    let filled = ((used as f64 / total as f64) * width as f64).round() as usize;
    format!("{}{}", "█".repeat(filled.min(width)), "░".repeat(width - filled.min(width)))
}

/// The window of a usage report, then its rows (see [`usage_grid`]).
pub fn usage_table(report: &UsageReport) -> String {
    let minute = |at: DateTime<Utc>| at.format("%Y-%m-%d %H:%M UTC");
    let window = format!("usage from {} to {}\n", minute(report.from), minute(report.to));
    if report.rows.is_empty() {
        return format!("{window}no usage in this window\n");
    }
    format!("{window}{}\n", usage_grid(report))
}

/// A column per key grouped by, in the order asked, then the hours; most GPU-hours first, a
/// total when there are several rows, efficiency only when some group reported it.
fn usage_grid(report: &UsageReport) -> Fitted {
    let rows = usage_rows_by_gpu_hours(report);
    let efficiency = rows.iter().any(|r| r.efficiency.is_some());
    let mut header: Vec<String> = report.by.iter().map(|key| key.replace(['-', '_'], " ").to_uppercase()).collect();
    header.extend(["GPU-HOURS".into(), "CPU-HOURS".into(), "ATTEMPTS".into()]);
    header.push(format!("DECAYED GPU-H ({} half-life)", half_life(report.half_life_hours)));
    if efficiency {
        header.push("EFFICIENCY".into());
    }
    let mut t = table(&header.iter().map(String::as_str).collect::<Vec<_>>());
    let hours = |h: f64| format!("{h:.2}");
    for row in &rows {
        let mut cells: Vec<String> =
            report.by.iter().map(|key| usage_key(row, key).unwrap_or("-").to_string()).collect();
        cells.extend([hours(row.gpu_hours), hours(row.cpu_hours), row.attempts.to_string()]);
        cells.push(hours(row.decayed_gpu_hours));
        if efficiency {
            cells.push(row.efficiency.map(|e| format!("{:.1}%", e * 100.0)).unwrap_or_default());
        }
        t.add_row(cells);
    }
    if rows.len() > 1 {
        // Efficiency has no total: the rows do not say how many of their hours reported it.
        let mut cells: Vec<String> = report.by.iter().map(|_| String::new()).collect();
        if let Some(first) = cells.first_mut() {
            *first = "TOTAL".into();
        }
        cells.push(hours(rows.iter().map(|r| r.gpu_hours).sum()));
        cells.push(hours(rows.iter().map(|r| r.cpu_hours).sum()));
        cells.push(rows.iter().map(|r| r.attempts).sum::<i64>().to_string());
        cells.push(hours(rows.iter().map(|r| r.decayed_gpu_hours).sum()));
        t.add_row(cells);
    }
    for index in report.by.len()..header.len() {
        if let Some(column) = t.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// A usage report as CSV: the keys grouped by, then the figures at full precision, written as
/// `-o json` writes them; most GPU-hours first; no efficiency is an empty cell.
pub fn usage_csv(report: &UsageReport) -> String {
    let mut header: Vec<String> = report.by.iter().map(|key| key.replace('-', "_")).collect();
    header.extend(["gpu_hours", "cpu_hours", "attempts", "decayed_gpu_hours", "efficiency"].map(String::from));
    let mut text = csv_record(&header);
    let number = |n: f64| serde_json::to_string(&n).unwrap_or_default();
    for row in usage_rows_by_gpu_hours(report) {
        let mut cells: Vec<String> =
            report.by.iter().map(|key| usage_key(row, key).unwrap_or_default().to_string()).collect();
        cells.extend([number(row.gpu_hours), number(row.cpu_hours), row.attempts.to_string()]);
        cells.push(number(row.decayed_gpu_hours));
        cells.push(row.efficiency.map(number).unwrap_or_default());
        text.push_str(&csv_record(&cells));
    }
    text
}

/// One CSV line (RFC 4180): a field holding a comma, a quote or a line break is quoted, its
/// quotes doubled.
fn csv_record(fields: &[String]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|field| {
            if field.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", field.replace('"', "\"\""))
            } else {
                field.clone()
            }
        })
        .collect();
    format!("{}\n", quoted.join(","))
}

fn usage_rows_by_gpu_hours(report: &UsageReport) -> Vec<&UsageRow> {
    let mut rows: Vec<&UsageRow> = report.rows.iter().collect();
    rows.sort_by(|a, b| b.gpu_hours.total_cmp(&a.gpu_hours));
    rows
}

/// A row's value for a key of the report's `by`.
fn usage_key<'a>(row: &'a UsageRow, key: &str) -> Option<&'a str> {
    match key {
        "tenant" => row.tenant.as_deref(),
        "user" => row.user.as_deref(),
        "gpu-type" | "gpu_type" => row.gpu_type.as_deref(),
        "template" => row.template.as_deref(),
        _ => None,
    }
}

/// A half-life in hours as people say it: 7d, 12h, 1.5h.
fn half_life(hours: f64) -> String {
    if hours >= 24.0 && hours % 24.0 == 0.0 { format!("{}d", hours / 24.0) } else { format!("{hours}h") }
}

/// The audit log, newest first (see [`audit_grid`]), and whether older entries are left.
pub fn audit_table(page: &AuditPage) -> String {
    if page.items.is_empty() {
        return "no audit entries match\n".into();
    }
    let mut text = format!("{}\n", audit_grid(page));
    if page.next_before.is_some() {
        text.push_str("older entries left: raise --limit, or narrow with --since, --actor, --action\n");
    }
    text
}

/// An entry a row, at most two lines high: a long refusal message is cut to fit (`-o json` has
/// it whole).
fn audit_grid(page: &AuditPage) -> Fitted {
    let mut t = table(&["TIME", "TENANT", "ACTOR", "ACTION", "TARGET", "OUTCOME", "SOURCE", "DETAIL"]);
    for entry in &page.items {
        t.add_row(vec![
            when(entry.at),
            entry.tenant.clone().unwrap_or_else(|| "-".into()),
            entry.actor.clone(),
            entry.action.clone(),
            entry.target.clone(),
            entry.outcome.clone(),
            entry.source.clone().unwrap_or_default(),
            entry.detail.clone().unwrap_or_default(),
        ]);
    }
    t.lines_per_row(2)
}

#[cfg(test)]
mod tests {
    use super::Fitted;
    use chrono::{TimeZone, Utc};
    use trainyard_core::api::{AuditEntry, AuditPage, UsageReport, UsageRow};

    thread_local! {
        /// The terminal width tables fit in this test thread (see [`at_width`]).
        pub(super) static WIDTH: std::cell::Cell<Option<u16>> = const { std::cell::Cell::new(None) };
    }

    /// Runs `f` as if printed to a terminal `width` columns wide.
    pub(super) fn at_width<T>(width: u16, f: impl FnOnce() -> T) -> T {
        WIDTH.set(Some(width));
        let out = f();
        WIDTH.set(None);
        out
    }

    use super::{
        artifacts_table, audit_grid, audit_table, dataset_detail, datasets_table, diff_text, elapsed, quota, sparkline,
        usage_csv, usage_grid, usage_table, volumes_table,
    };

    fn usage_row(user: &str, tenant: &str, gpu_hours: f64, efficiency: Option<f64>) -> UsageRow {
        UsageRow {
            tenant: Some(tenant.into()),
            user: Some(user.into()),
            gpu_type: None,
            template: None,
            gpu_hours,
            cpu_hours: gpu_hours * 8.0,
            attempts: 2,
            decayed_gpu_hours: gpu_hours * 0.4,
            efficiency,
        }
    }

    fn usage_report(by: &[&str], rows: Vec<UsageRow>) -> UsageReport {
        UsageReport {
            from: Utc.with_ymd_and_hms(2026, 10, 25, 0, 0, 0).unwrap(),
            to: Utc.with_ymd_and_hms(2026, 11, 24, 4, 50, 13).unwrap(),
            by: by.iter().map(|k| k.to_string()).collect(),
            half_life_hours: 168.0,
            rows,
            series: Vec::new(),
            bucket_seconds: 86_400,
        }
    }

    /// The table's lines as a terminal `width` wide shows them.
    fn lines(table: Fitted, width: u16) -> Vec<String> {
        table.fit_width(width).to_string().lines().map(str::to_string).collect()
    }

    fn line_with<'a>(lines: &'a [String], text: &str) -> &'a str {
        lines.iter().find(|l| l.contains(text)).unwrap_or_else(|| panic!("no line with {text}: {lines:#?}"))
    }

    #[test]
    fn usage_table_groups_in_the_order_asked_most_gpu_hours_first_with_a_total() {
        // The server sends the groups in key order.
        let rows = vec![
            usage_row("alice", "ml", 1.5, None),
            usage_row("bob", "ml", 10.25, None),
            usage_row("carol", "vision", 3.0, None),
        ];
        let report = usage_report(&["user", "tenant"], rows);
        let text = usage_table(&report);
        assert!(text.starts_with("usage from 2026-10-25 00:00 UTC to 2026-11-24 04:50 UTC\n"), "{text}");

        let lines = lines(usage_grid(&report), 200);
        let header = line_with(&lines, "GPU-HOURS");
        let at = |name: &str| header.find(name).unwrap_or_else(|| panic!("no {name} in {header}"));
        assert!(at("USER") < at("TENANT") && at("TENANT") < at("GPU-HOURS"), "{header}");
        assert!(at("CPU-HOURS") < at("ATTEMPTS") && at("ATTEMPTS") < at("DECAYED GPU-H (7d half-life)"), "{header}");
        assert!(!header.contains("EFFICIENCY"), "no group reported efficiency: {header}");

        let order: Vec<usize> = ["bob", "carol", "alice", "TOTAL"]
            .iter()
            .map(|name| lines.iter().position(|l| l.contains(name)).unwrap())
            .collect();
        assert!(order.is_sorted(), "most GPU-hours first, the total last: {lines:#?}");
        assert!(line_with(&lines, "bob").contains("10.25") && line_with(&lines, "alice").contains("1.50"));
        let total = line_with(&lines, "TOTAL");
        for figure in ["14.75", "118.00", "6", "5.90"] {
            assert!(total.contains(figure), "{figure} in {total}");
        }
    }

    #[test]
    fn usage_table_shows_efficiency_only_when_a_group_reported_it_and_one_row_has_no_total() {
        let mut report = usage_report(&["tenant"], vec![usage_row("alice", "ml", 2.0, None)]);
        report.half_life_hours = 12.0;
        let lines = lines(usage_grid(&report), 200);
        assert!(!lines.iter().any(|l| l.contains("TOTAL") || l.contains("EFFICIENCY")), "{lines:#?}");
        assert!(line_with(&lines, "GPU-HOURS").contains("DECAYED GPU-H (12h half-life)"));

        let rows = vec![usage_row("alice", "ml", 2.0, Some(0.875)), usage_row("bob", "vision", 1.0, None)];
        let report = usage_report(&["tenant"], rows);
        let lines = super::tests::lines(usage_grid(&report), 200);
        assert!(line_with(&lines, "GPU-HOURS").contains("EFFICIENCY"));
        assert!(line_with(&lines, "ml").contains("87.5%"));
        assert!(!line_with(&lines, "vision").contains('%'), "no figure for a group that reported none");

        let empty = usage_report(&["tenant"], Vec::new());
        assert!(usage_table(&empty).ends_with("no usage in this window\n"));
    }

    #[test]
    fn usage_csv_quotes_what_needs_it_and_writes_the_numbers_json_writes() {
        let mut sweep = usage_row("alice", "ml", 0.1 + 0.2, Some(2.0 / 3.0));
        sweep.template = Some("sweep, \"big\"".into());
        sweep.gpu_type = Some("nvidia-h100-80gb".into());
        let mut shell = usage_row("bob", "ml", 1.0 / 3.0, None);
        shell.template = Some("shell".into());
        shell.gpu_type = Some("-".into());
        let report = usage_report(&["template", "gpu-type"], vec![sweep, shell]);
        let csv = usage_csv(&report);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "template,gpu_type,gpu_hours,cpu_hours,attempts,decayed_gpu_hours,efficiency");

        let json = serde_json::to_value(&report).unwrap();
        let figures = |i: usize| {
            let row = &json["rows"][i];
            ["gpu_hours", "cpu_hours", "attempts", "decayed_gpu_hours"].map(|k| row[k].to_string()).join(",")
        };
        assert_eq!(lines[1], format!("shell,-,{},", figures(1)), "no efficiency is an empty cell");
        let efficiency = json["rows"][0]["efficiency"].to_string();
        assert_eq!(lines[2], format!("\"sweep, \"\"big\"\"\",nvidia-h100-80gb,{},{efficiency}", figures(0)));
        assert!(lines[2].contains(",0.30000000000000004,") && efficiency == "0.6666666666666666", "{}", lines[2]);
        assert_eq!(lines.len(), 3);
    }

    fn audit_entry(seq: i64, hour: u32, tenant: Option<&str>, outcome: &str, detail: Option<&str>) -> AuditEntry {
        AuditEntry {
            seq,
            at: Utc.with_ymd_and_hms(2026, 11, 24, hour, 5, 9).unwrap(),
            tenant: tenant.map(str::to_string),
            actor: "user:alice".into(),
            credential: Some("token:7".into()),
            action: "quota.set".into(),
            target: "tenant:ml".into(),
            outcome: outcome.into(),
            detail: detail.map(str::to_string),
            source: Some("10.0.0.7".into()),
        }
    }

    #[test]
    fn audit_table_lists_newest_first_and_cuts_a_long_detail() {
        let long = "a tenant admin reads only their own tenant's audit log; ".repeat(6);
        let page = AuditPage {
            items: vec![audit_entry(42, 10, None, "ok", None), audit_entry(41, 9, Some("ml"), "denied", Some(&long))],
            next_before: None,
        };
        let lines = lines(audit_grid(&page), 200);
        let header = line_with(&lines, "TIME");
        let columns = ["TIME", "TENANT", "ACTOR", "ACTION", "TARGET", "OUTCOME", "SOURCE", "DETAIL"];
        let at: Vec<usize> = columns.iter().map(|c| header.find(c).unwrap()).collect();
        assert!(at.is_sorted(), "{header}");
        let newest = lines.iter().position(|l| l.contains("2026-11-24 10:05:09")).unwrap();
        let older = lines.iter().position(|l| l.contains("2026-11-24 09:05:09")).unwrap();
        assert!(newest < older, "newest first: {lines:#?}");
        assert!(lines[newest].contains(" - ") && lines[newest].contains("ok"), "no tenant: {}", lines[newest]);
        assert!(lines[older].contains("ml") && lines[older].contains("denied") && lines[older].contains("10.0.0.7"));

        // A 336-character refusal in a 120-column terminal: two lines, cut, not eight.
        let narrow = super::tests::lines(audit_grid(&page), 120);
        assert!(narrow.iter().all(|l| l.chars().count() <= 120), "{narrow:#?}");
        let rows = narrow.len() - 4; // top border, header, its rule, bottom border
        assert_eq!(rows, 1 + 2, "{narrow:#?}");
        assert!(narrow.iter().any(|l| l.contains('…')), "marked where it is cut: {narrow:#?}");

        assert!(!audit_table(&page).contains("older entries"));
        let more = AuditPage { next_before: Some(41), ..page };
        assert!(audit_table(&more).contains("older entries left"));
        let none = AuditPage { items: Vec::new(), next_before: None };
        assert_eq!(audit_table(&none), "no audit entries match\n");
    }

    fn flavor(name: &str, nominal: u64, used: u64) -> trainyard_core::api::FlavorUsage {
        trainyard_core::api::FlavorUsage {
            flavor: name.into(),
            nominal,
            borrowing_limit: None,
            lending_limit: None,
            used,
            borrowed: 0,
            lent: 0,
            spare: 0,
        }
    }

    fn node(gpus: u32, gpu_type: Option<&str>) -> trainyard_core::api::NodeUsage {
        trainyard_core::api::NodeUsage {
            name: "node-1".into(),
            gpu_type: gpu_type.map(str::to_string),
            gpus,
            gpus_allocated: 0,
            cpu_millis: 2000,
            cpu_millis_allocated: 0,
            memory_bytes: 8 << 30,
            memory_bytes_allocated: 0,
            replicas: 0,
            cached_datasets: Vec::new(),
            drained: None,
        }
    }

    #[test]
    fn quota_without_gpu_types_says_what_is_true_never_an_empty_table() {
        let report = trainyard_core::api::QuotaReport {
            tenant: "default".into(),
            cohort: None,
            weight: 1.0,
            flavors: Vec::new(),
        };
        let cpu_only = trainyard_core::api::Nodes { items: vec![node(0, None)] };
        let text = quota(&report, Some(&cpu_only));
        assert!(text.starts_with("tenant default (cohort none, weight 1)\n"), "{text}");
        assert!(text.contains("no GPU quotas: this cluster has no GPUs"), "{text}");
        assert!(text.contains("Jobs without GPUs need no quota"), "{text}");
        assert!(!text.contains('─') && !text.contains("GPU TYPE"), "no empty table: {text}");

        let with_gpus = trainyard_core::api::Nodes { items: vec![node(8, Some("h100")), node(0, None)] };
        let text = quota(&report, Some(&with_gpus));
        assert!(text.contains("no GPU quota yet") && text.contains("This cluster has h100."), "{text}");
        assert!(text.contains("yard admin quota set default GPU-TYPE --nominal N"), "{text}");
        assert!(!text.contains("GPU TYPE"), "{text}");

        let report = trainyard_core::api::QuotaReport { flavors: vec![flavor("h100", 4, 2)], ..report };
        let text = quota(&report, None);
        assert!(text.contains("GPU TYPE") && text.contains("h100"), "a quota is a table: {text}");
    }

    fn artifact(path: &str, size_bytes: u64, sha256: Option<&str>) -> trainyard_core::api::Artifact {
        trainyard_core::api::Artifact {
            path: path.into(),
            size_bytes,
            sha256: sha256.map(str::to_string),
            modified_at: Utc.with_ymd_and_hms(2026, 11, 24, 10, 5, 9).unwrap(),
        }
    }

    #[test]
    fn artifacts_list_as_a_table_with_human_sizes_and_short_hashes() {
        let sha = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let list = vec![artifact("weights/big.bin", 11_263_297, Some(sha)), artifact("notes.txt", 12, None)];
        let text = artifacts_table(&list);
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        let header = line_with(&lines, "PATH");
        let at: Vec<usize> = ["PATH", "SIZE", "SHA-256", "CREATED"].iter().map(|c| header.find(c).unwrap()).collect();
        assert!(at.is_sorted(), "{header}");
        let big = line_with(&lines, "weights/big.bin");
        assert!(big.contains("10.7 MiB") && big.contains("9f86d081884c ") && !big.contains(sha), "{big}");
        assert!(big.contains("2026-11-24 10:05:09"), "{big}");
        let small = line_with(&lines, "notes.txt");
        assert!(small.contains("12 B") && small.contains(" - "), "{small}");
        assert!(!text.contains('\t'), "a table, not TSV: {text}");
        assert!(artifacts_table(&[]).starts_with("no artefacts yet"));
    }

    #[test]
    fn volumes_list_as_a_table_with_human_sizes_and_why_one_is_not_ready() {
        let volume = |name: &str, size_bytes: u64, pending: Option<&str>| trainyard_core::api::Volume {
            name: name.into(),
            size_bytes,
            access_mode: trainyard_core::api::AccessMode::ReadWriteMany,
            storage_class: None,
            path: format!("/data/volumes/{name}"),
            created_by: "alice".into(),
            created_at: Utc.with_ymd_and_hms(2026, 11, 24, 10, 5, 9).unwrap(),
            pending_reason: pending.map(str::to_string),
        };
        let list = vec![volume("scratch", 25_276_502_016, None), volume("more", 5 << 30, Some("no storage class"))];
        let text = at_width(160, || volumes_table(&list));
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        assert!(line_with(&lines, "NAME").contains("ACCESS MODE"), "{text}");
        let scratch = line_with(&lines, "scratch");
        assert!(scratch.contains("23.5 GiB") && scratch.contains("ReadWriteMany") && scratch.contains("ready"));
        assert!(!text.contains("Ki") && !text.contains("5Gi"), "never Memory's exact text: {text}");
        assert!(line_with(&lines, "more").contains("5 GiB") && line_with(&lines, "more").contains("not ready"));
        assert!(volumes_table(&[]).starts_with("no volumes yet"));
    }

    #[test]
    fn dataset_sizes_read_in_human_units() {
        let dataset = trainyard_core::api::Dataset {
            name: "images".into(),
            version: "1".into(),
            uri: "/data/packed".into(),
            format: "trainyard-shards-v1".into(),
            size_bytes: Some(25_276_502_016),
            samples: Some(400),
            content_hash: "sha256:0123456789abcdef0123".into(),
            source_job: None,
            store_prefix: None,
            created_by: "alice".into(),
            created_at: Utc.with_ymd_and_hms(2026, 11, 24, 10, 5, 9).unwrap(),
            cached_on: vec!["node-2".into()],
        };
        assert!(dataset_detail(&dataset).contains("size:         23.5 GiB\n"), "{}", dataset_detail(&dataset));
        assert!(dataset_detail(&dataset).contains("cached on:    node-2\n"), "{}", dataset_detail(&dataset));
        let table = datasets_table(std::slice::from_ref(&dataset));
        assert!(line_with(&table.lines().map(str::to_string).collect::<Vec<_>>(), "images@1").contains("23.5 GiB"));
        assert!(!table.contains("24684084Ki"), "{table}");
    }

    /// Two pytorch-ddp-like runs: 22 arguments, one of them different, and a long reason.
    fn ddp_comparison(all: bool) -> trainyard_core::compare::Comparison {
        use trainyard_core::compare::{ComparedField, ComparedRun, Comparison, ComparisonSection};
        let args = |lr: &str| {
            let mut args: Vec<String> =
                (0..22).map(|i| format!("--option-{i}=/a/long/path/to/something/{i}")).collect();
            args[7] = format!("--lr={lr}");
            Some(serde_json::json!(args))
        };
        let run = |n: u128| ComparedRun { id: uuid::Uuid::from_u128(n), name: "train".into(), label: "train".into() };
        let reason = |why: &str| Some(serde_json::json!(format!("{why}: {}", "the loss went up and up ".repeat(8))));
        let field = |name: &str, values: Vec<Option<serde_json::Value>>| ComparedField {
            field: name.into(),
            differs: values.iter().any(|v| v != &values[0]),
            values,
        };
        let mut fields = vec![field("spec.args", vec![args("0.001"), args("0.01")])];
        if all {
            fields.push(field("spec.command", vec![args("1"), args("1")]));
        }
        let outcome = vec![field("outcome.reason", vec![reason("diverged"), reason("stopped")])];
        Comparison {
            runs: vec![run(1 << 100), run(2 << 100)],
            all,
            sections: vec![
                ComparisonSection { name: "spec".into(), differ: 1, same: 3, fields },
                ComparisonSection { name: "outcome".into(), differ: 1, same: 2, fields: outcome },
            ],
            differ: 2,
            same: 5,
            metrics: Vec::new(),
        }
    }

    #[test]
    fn diff_of_long_lists_shows_the_items_that_differ_and_fits_the_terminal() {
        let text = diff_text(&ddp_comparison(false), Some(100));
        assert!(text.lines().all(|l| l.chars().count() <= 100), "fits 100 columns:\n{text}");
        assert!(
            text.contains("[7] --lr=0.001") && text.contains("[7] --lr=0.01"),
            "the argument that differs:\n{text}"
        );
        assert!(!text.contains("--option-0"), "not the arguments that are the same:\n{text}");
        assert!(text.contains("(22 items, the rest the same)"), "{text}");
        assert!(text.contains("diverged") && text.contains('…'), "long text is cut, marked:\n{text}");
        assert!(text.contains("-o json has them whole"), "{text}");
        assert!(text.ends_with("2 fields differ, 5 the same\nlong values are cut (…) or shown by the items that differ; -o json has them whole\n"));

        // Unbounded (stdout no terminal): still no line anywhere near 900 columns.
        let wide = diff_text(&ddp_comparison(false), None);
        assert!(wide.lines().all(|l| l.chars().count() <= 200), "{wide}");

        // With --all, a long list that is the same everywhere is cut, not listed whole.
        let all = diff_text(&ddp_comparison(true), Some(120));
        assert!(all.lines().all(|l| l.chars().count() <= 120), "{all}");
        let same = &all[all.find("spec.command").unwrap()..all.find('└').unwrap()];
        assert!(same.contains('…') && !same.contains("--option-21"), "{all}");
    }

    #[test]
    fn elapsed_time_reads_like_squeue() {
        let secs = chrono::TimeDelta::seconds;
        assert_eq!(elapsed(secs(0)), "0s");
        assert_eq!(elapsed(secs(59)), "59s");
        assert_eq!(elapsed(secs(185)), "3m05s");
        assert_eq!(elapsed(secs(2 * 3600 + 4 * 60 + 59)), "2h04m");
        assert_eq!(elapsed(secs(3 * 86400 + 2 * 3600)), "3d02h");
        assert_eq!(elapsed(secs(-5)), "0s", "a clock step back is not negative time");
    }

    #[test]
    fn sparkline_follows_the_trend() {
        assert_eq!(sparkline(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 8), "▁▂▃▄▅▆▇█");
        assert_eq!(sparkline(&[5.0; 100], 10).chars().count(), 10);
        assert_eq!(sparkline(&[], 10), "");
        let falling = sparkline(&(0..1000).map(|i| 1000.0 - f64::from(i)).collect::<Vec<_>>(), 20);
        assert!(falling.starts_with('█') && falling.ends_with('▁'), "{falling}");
    }
}
