//! Usage (everyone: GPU-hours over time, one line per tenant, and the hours per group) and the
//! audit log (platform admins and tenant admins), on the same operations as `GET /api/v1/usage`
//! and `GET /api/v1/audit`.

use askama::Template;
use axum::extract::{Query, State};
use axum::response::Response;
use chrono::{Duration, Utc};
use serde::{Deserialize, Serialize};
use trainyard_core::Error;
use trainyard_core::api::{AuditEntry, UsageRow, UsageSeries};

use super::{Nav, WebAuth, WebResult, render, when};
use crate::app::accounting::{AuditQuery, UsageQuery};
use crate::http::AppState;

/// A window the usage page offers: its `from` value, its words, and its length in hours.
pub struct Window {
    pub from: &'static str,
    pub label: &'static str,
    hours: i64,
}

const WINDOWS: [Window; 4] = [
    Window { from: "24h", label: "last 24 hours", hours: 24 },
    Window { from: "7d", label: "last 7 days", hours: 7 * 24 },
    Window { from: "30d", label: "last 30 days", hours: 30 * 24 },
    Window { from: "90d", label: "last 90 days", hours: 90 * 24 },
];

/// The window when the page is opened without one: the API's default.
const DEFAULT_WINDOW: usize = 2;

/// The keys the page groups by, as `by` names them, and their column headings.
const GROUP_KEYS: [(&str, &str); 4] =
    [("tenant", "Tenant"), ("user", "User"), ("gpu-type", "GPU type"), ("template", "Template")];

/// The usage page's choices as its GET form sends them: `from` (a window back from now) and
/// `by` once per key ticked (none ticked: by tenant).
struct UsageChoices {
    window: &'static Window,
    by: Vec<&'static str>,
}

impl UsageChoices {
    fn parse(pairs: &[(String, String)]) -> Result<UsageChoices, Error> {
        let mut window = &WINDOWS[DEFAULT_WINDOW];
        let mut by = Vec::new();
        for (name, value) in pairs {
            match name.as_str() {
                "from" => {
                    window = WINDOWS.iter().find(|w| w.from == value).ok_or_else(|| {
                        let choices: Vec<_> = WINDOWS.iter().map(|w| w.from).collect();
                        Error::invalid("from", format!("one of {}", choices.join(", ")))
                    })?;
                }
                "by" => {
                    let (key, _) = GROUP_KEYS.iter().find(|(key, _)| key == value).ok_or_else(|| {
                        let keys: Vec<_> = GROUP_KEYS.iter().map(|(key, _)| *key).collect();
                        Error::invalid("by", format!("one of {}", keys.join(", ")))
                    })?;
                    if !by.contains(key) {
                        by.push(*key);
                    }
                }
                _ => {}
            }
        }
        if by.is_empty() {
            by.push("tenant");
        }
        // In the order of the table's columns, whatever the order of the query.
        by.sort_by_key(|key| GROUP_KEYS.iter().position(|(k, _)| k == key));
        Ok(UsageChoices { window, by })
    }
}

/// A grouping choice of the form: its key, heading, and whether it is ticked.
pub struct GroupChoice {
    pub key: &'static str,
    pub label: &'static str,
    pub checked: bool,
}

/// One row of the usage table, formatted.
pub struct UsageTableRow {
    pub keys: Vec<String>,
    pub gpu_hours: String,
    pub cpu_hours: String,
    pub attempts: i64,
    pub decayed_gpu_hours: String,
    pub efficiency: String,
}

impl UsageTableRow {
    fn of(row: &UsageRow, by: &[&str]) -> UsageTableRow {
        let key = |key: &str| match key {
            "tenant" => row.tenant.clone(),
            "user" => row.user.clone(),
            "gpu-type" => row.gpu_type.clone(),
            _ => row.template.clone(),
        };
        UsageTableRow {
            keys: by.iter().map(|k| key(k).unwrap_or_else(|| "-".into())).collect(),
            gpu_hours: hours(row.gpu_hours),
            cpu_hours: hours(row.cpu_hours),
            attempts: row.attempts,
            decayed_gpu_hours: hours(row.decayed_gpu_hours),
            efficiency: row.efficiency.map(|e| format!("{:.0} %", e * 100.0)).unwrap_or_else(|| "—".into()),
        }
    }
}

/// What the page's script draws: one line of GPU-hours per tenant, a point per bucket, the
/// first bucket starting at `from` (Unix seconds).
#[derive(Serialize)]
struct UsageChart<'a> {
    from: i64,
    bucket_seconds: i64,
    series: &'a [UsageSeries],
}

#[derive(Template)]
#[template(path = "usage.html")]
struct UsagePage {
    nav: Nav,
    windows: &'static [Window],
    window: &'static Window,
    groups: Vec<GroupChoice>,
    headings: Vec<&'static str>,
    rows: Vec<UsageTableRow>,
    half_life: String,
    /// The chart's data as JSON, for the page's script; none when no GPU was held.
    chart: Option<String>,
    /// The bucket in words: `hour` or `day`.
    bucket: &'static str,
    any_efficiency: bool,
}

/// GPU-hours over time, one line per tenant the caller may see, and the table of hours per
/// group.
pub async fn usage(
    State(state): State<AppState>,
    auth: WebAuth,
    Query(pairs): Query<Vec<(String, String)>>,
) -> WebResult<Response> {
    let choices = UsageChoices::parse(&pairs)?;
    let now = Utc::now();
    let query = UsageQuery {
        from: Some(now - Duration::hours(choices.window.hours)),
        to: Some(now),
        by: Some(choices.by.join(",")),
        ..UsageQuery::default()
    };
    let report = state.app.usage_report(&auth.caller, &query).await?;
    let held_gpus = report.series.iter().any(|s| s.gpu_hours.iter().any(|h| *h > 0.0));
    let chart = held_gpus.then(|| {
        let chart =
            UsageChart { from: report.from.timestamp(), bucket_seconds: report.bucket_seconds, series: &report.series };
        serde_json::to_string(&chart).expect("numbers and names serialise")
    });
    let headings = choices
        .by
        .iter()
        .filter_map(|key| GROUP_KEYS.iter().find(|(k, _)| k == key).map(|(_, label)| *label))
        .collect();
    let groups =
        GROUP_KEYS.iter().map(|(key, label)| GroupChoice { key, label, checked: choices.by.contains(key) }).collect();
    Ok(render(&UsagePage {
        nav: Nav::new(&auth, "usage"),
        windows: &WINDOWS,
        window: choices.window,
        groups,
        headings,
        rows: report.rows.iter().map(|row| UsageTableRow::of(row, &choices.by)).collect(),
        half_life: half_life(report.half_life_hours),
        chart,
        bucket: if report.bucket_seconds >= 86_400 { "day" } else { "hour" },
        any_efficiency: report.rows.iter().any(|r| r.efficiency.is_some()),
    }))
}

/// Hours with the precision their size needs: a few seconds on one GPU is not "0.00".
fn hours(h: f64) -> String {
    if h == 0.0 {
        "0".into()
    } else if h >= 100.0 {
        format!("{h:.0}")
    } else if h >= 1.0 {
        format!("{h:.2}")
    } else {
        format!("{h:.4}")
    }
}

fn half_life(hours: f64) -> String {
    if hours >= 24.0 && hours % 24.0 == 0.0 { format!("{} days", hours / 24.0) } else { format!("{hours} hours") }
}

/// The audit page's filters as its GET form sends them; empty means "any".
#[derive(Debug, Default, Deserialize)]
pub struct AuditFilter {
    #[serde(default)]
    pub actor: String,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub before: String,
}

impl AuditFilter {
    fn query(&self) -> Result<AuditQuery, Error> {
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_string());
        let before = some(&self.before)
            .map(|b| b.parse::<i64>().map_err(|_| Error::invalid("before", "must be a whole number")))
            .transpose()?;
        Ok(AuditQuery { actor: some(&self.actor), action: some(&self.action), before, ..AuditQuery::default() })
    }

    /// The page's address with these filters and another `before`.
    fn url(&self, before: Option<i64>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [("actor", &self.actor), ("action", &self.action)] {
            if !value.trim().is_empty() {
                query.append_pair(key, value.trim());
            }
        }
        if let Some(before) = before {
            query.append_pair("before", &before.to_string());
        }
        format!("/audit?{}", query.finish())
    }
}

/// One entry of the audit log, formatted.
pub struct AuditRow {
    pub at: String,
    pub tenant: String,
    pub actor: String,
    pub credential: String,
    pub action: String,
    pub target: String,
    pub outcome: String,
    pub refused: bool,
    pub source: String,
    pub detail: String,
}

impl AuditRow {
    fn of(entry: AuditEntry) -> AuditRow {
        AuditRow {
            at: when(&entry.at),
            tenant: entry.tenant.unwrap_or_else(|| "—".into()),
            actor: entry.actor,
            credential: entry.credential.unwrap_or_default(),
            action: entry.action,
            target: entry.target,
            refused: entry.outcome != "ok",
            outcome: entry.outcome,
            source: entry.source.unwrap_or_else(|| "—".into()),
            detail: entry.detail.unwrap_or_default(),
        }
    }
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    nav: Nav,
    filter: AuditFilter,
    rows: Vec<AuditRow>,
    /// The tenant whose log this is, for a tenant admin; none for a platform admin (all).
    tenant: Option<String>,
    older_url: Option<String>,
    newest_url: Option<String>,
}

/// The newest 100 entries of the audit log the caller may read, filtered by actor and action,
/// with a link to older ones.
pub async fn audit(
    State(state): State<AppState>,
    auth: WebAuth,
    Query(filter): Query<AuditFilter>,
) -> WebResult<Response> {
    let page = state.app.audit_list(&auth.caller, &filter.query()?).await?;
    let older_url = page.next_before.map(|before| filter.url(Some(before)));
    let newest_url = (!filter.before.trim().is_empty()).then(|| filter.url(None));
    Ok(render(&AuditPage {
        tenant: (!auth.caller.platform_admin).then(|| auth.caller.tenant.clone()),
        nav: Nav::new(&auth, "audit"),
        rows: page.items.into_iter().map(AuditRow::of).collect(),
        filter,
        older_url,
        newest_url,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn usage_choices_default_to_thirty_days_by_tenant_and_keep_the_column_order() {
        let choices = UsageChoices::parse(&[]).expect("no choices");
        assert_eq!((choices.window.from, choices.by), ("30d", vec!["tenant"]));
        let choices = UsageChoices::parse(&pairs(&[("from", "24h"), ("by", "template"), ("by", "tenant")]))
            .expect("valid choices");
        assert_eq!((choices.window.hours, choices.by), (24, vec!["tenant", "template"]));
    }

    #[test]
    fn unknown_usage_choices_name_their_field() {
        let err = UsageChoices::parse(&pairs(&[("from", "1y")])).err().expect("refused");
        assert!(matches!(err, Error::InvalidInput { ref field, .. } if field == "from"), "{err}");
        let err = UsageChoices::parse(&pairs(&[("by", "team")])).err().expect("refused");
        assert!(matches!(err, Error::InvalidInput { ref field, .. } if field == "by"), "{err}");
    }

    #[test]
    fn small_hours_keep_their_digits() {
        assert_eq!(hours(0.0), "0");
        assert_eq!(hours(2.0 / 3600.0), "0.0006");
        assert_eq!(hours(12.345), "12.35");
        assert_eq!(hours(1234.4), "1234");
    }
}
