//! What the platform team reads: the audit log and usage (GPU- and CPU-hours from the
//! allocation ledger, with the decayed figure fair share could use).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Deserialize;
use trainyard_core::api::{AuditPage, UsageReport, UsageRow, UsageSeries};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use trainyard_scheduler::usage::{Hold, bucketed_hours, decayed_hours, held_hours};
use trainyard_store::audit::AuditFilter;
use trainyard_store::usage::LedgerRow;
use uuid::Uuid;

use super::App;

/// What to list of the audit log (`GET /api/v1/audit`, `yard audit`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this tenant's entries (platform admins; a tenant admin always sees only their own).
    pub tenant: Option<String>,
    /// Only this actor's entries: a user name, or `user:<name>`, `local:<command>`.
    pub actor: Option<String>,
    /// Only this action (`job.submit`), or a family ending in `.` (`job.`).
    pub action: Option<String>,
    /// Only entries at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// The `next_before` of the previous page.
    pub before: Option<i64>,
    /// Entries per page, 1 to 1000 (default 100).
    pub limit: Option<u32>,
}

/// What a usage report covers (`GET /api/v1/usage`, `yard usage`).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// Start of the window (RFC 3339); default 30 days before `to`.
    pub from: Option<DateTime<Utc>>,
    /// End of the window (RFC 3339); default now.
    pub to: Option<DateTime<Utc>>,
    /// Group by these keys, comma-separated: `tenant`, `user`, `gpu-type`, `template` (default
    /// `tenant`).
    pub by: Option<String>,
    /// Only this tenant (platform admins; members always see only their own tenant).
    pub tenant: Option<String>,
    /// The half-life of the decayed usage, in hours (default 168: seven days, as Slurm's).
    pub half_life_hours: Option<f64>,
}

/// The keys a usage report may group by.
const USAGE_KEYS: [&str; 4] = ["tenant", "user", "gpu-type", "template"];
/// The longest window a report covers, in days.
const MAX_USAGE_DAYS: i64 = 3660;

impl App {
    /// A page of the audit log: every tenant's for platform admins, the tenant's own for its
    /// admins, nothing for others (403).
    pub async fn audit_list(&self, caller: &Caller, query: &AuditQuery) -> Result<AuditPage> {
        let tenant_id = if caller.platform_admin {
            match &query.tenant {
                Some(name) => Some(self.tenant_id_by_name(name).await?),
                None => None,
            }
        } else {
            caller.authorize(Action::ManageTenant)?;
            if query.tenant.as_deref().is_some_and(|name| name != caller.tenant) {
                return Err(Error::Forbidden("a tenant admin reads only their own tenant's audit log".into()));
            }
            Some(caller.tenant_id)
        };
        let limit = query.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(Error::invalid("limit", "must be between 1 and 1000"));
        }
        self.store
            .audit_list(&AuditFilter {
                tenant_id,
                actor: query.actor.clone(),
                action: query.action.clone(),
                since: query.since,
                before: query.before,
                limit,
            })
            .await
    }

    /// GPU- and CPU-hours per group in a window: every tenant's for platform admins, the
    /// caller's tenant's for its members and viewers.
    pub async fn usage_report(&self, caller: &Caller, query: &UsageQuery) -> Result<UsageReport> {
        caller.authorize(Action::ReadJobs)?;
        let now = Utc::now();
        let to = query.to.unwrap_or(now);
        let from = query.from.unwrap_or(to - Duration::days(30));
        if from >= to {
            return Err(Error::invalid("from", "must be before `to`"));
        }
        if to - from > Duration::days(MAX_USAGE_DAYS) {
            return Err(Error::invalid("from", format!("a report covers at most {MAX_USAGE_DAYS} days")));
        }
        let by = usage_keys(query.by.as_deref())?;
        let half_life_hours = query.half_life_hours.unwrap_or(168.0);
        if !(half_life_hours.is_finite() && half_life_hours > 0.0 && half_life_hours <= 100_000.0) {
            return Err(Error::invalid("half_life_hours", "must be more than 0 and at most 100000"));
        }
        let tenant_id = match (&query.tenant, caller.platform_admin) {
            (None, true) => None,
            (Some(name), true) => Some(self.tenant_id_by_name(name).await?),
            (Some(name), false) if *name != caller.tenant => return Err(Error::not_found(ObjectKind::Tenant)),
            _ => Some(caller.tenant_id),
        };
        // The decayed figure looks further back than the window: ten half-lives (0.1%).
        let half_life = Duration::seconds((half_life_hours * 3600.0) as i64);
        let decay_from = (now - half_life * 10).min(from);
        let rows = self.store.usage_ledger(tenant_id, decay_from, to.max(now)).await?;
        Ok(usage_report(&rows, from, to, now, &by, half_life_hours))
    }

    /// The server's metrics in Prometheus' text format, for the scraper holding the metrics
    /// token or a platform admin; anyone else is refused (401 without a credential, 403 with
    /// another one).
    pub async fn metrics_exposition(&self, bearer: Option<&str>, client: Option<std::net::IpAddr>) -> Result<String> {
        let bearer = bearer.ok_or_else(|| {
            Error::Unauthenticated("send the metrics token (or a platform admin's API token) as a bearer token".into())
        })?;
        let scraper = self
            .metrics_token
            .as_deref()
            .is_some_and(|token| bool::from(subtle::ConstantTimeEq::ct_eq(token.as_bytes(), bearer.as_bytes())));
        if !scraper {
            let caller = self.token_authenticate(bearer, client).await?;
            caller.require_platform_admin()?;
        }
        Ok(self.monitoring.encode())
    }

    pub(crate) fn monitoring(&self) -> std::sync::Arc<crate::monitoring::Monitoring> {
        std::sync::Arc::clone(&self.monitoring)
    }

    pub(crate) fn metrics_token_set(&mut self, token: Option<String>) {
        self.metrics_token = token.map(std::sync::Arc::from);
    }

    async fn tenant_id_by_name(&self, name: &str) -> Result<Uuid> {
        let tenants = self.store.tenants_list().await?;
        tenants.into_iter().find(|t| t.name == name).map(|t| t.id).ok_or_else(|| Error::not_found(ObjectKind::Tenant))
    }
}

/// The `by` of a usage query, checked: known keys, each once.
fn usage_keys(by: Option<&str>) -> Result<Vec<String>> {
    let keys: Vec<String> = by.unwrap_or("tenant").split(',').map(|k| k.trim().replace('_', "-")).collect();
    for (i, key) in keys.iter().enumerate() {
        if !USAGE_KEYS.contains(&key.as_str()) {
            return Err(Error::invalid("by", format!("{key:?} is not one of {}", USAGE_KEYS.join(", "))));
        }
        if keys[..i].contains(key) {
            return Err(Error::invalid("by", format!("{key} is given twice")));
        }
    }
    Ok(keys)
}

/// The report from the ledger's rows: pure, so that clipping and grouping are tested alone.
/// Running attempts (no end) count up to `now`.
fn usage_report(
    rows: &[LedgerRow],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    by: &[String],
    half_life_hours: f64,
) -> UsageReport {
    let secs = |t: DateTime<Utc>| t.timestamp_micros() as f64 / 1e6;
    let (window_from, window_to, now_s) = (secs(from), secs(to), secs(now));
    let span = window_to - window_from;
    let bucket_seconds: i64 = if span > 2.0 * 86_400.0 { 86_400 } else { 3_600 };
    let buckets = (span / bucket_seconds as f64).ceil().max(1.0) as usize;
    let key = |row: &LedgerRow, name: &str| -> Option<String> {
        by.iter().any(|k| k == name).then(|| match name {
            "tenant" => row.tenant.clone(),
            "user" => row.user_name.clone(),
            "gpu-type" => row.gpu_type.clone().unwrap_or_else(|| "-".into()),
            _ => row.template.clone().unwrap_or_else(|| "-".into()),
        })
    };
    #[derive(Default)]
    struct Sums {
        gpu_hours: f64,
        cpu_hours: f64,
        attempts: i64,
        decayed: f64,
        used_gpu_hours: f64,
        reported_gpu_hours: f64,
    }
    let mut groups: BTreeMap<[Option<String>; 4], Sums> = BTreeMap::new();
    let mut series: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for row in rows {
        let end = row.ended_at.map_or(now_s, secs).min(now_s.max(secs(row.started_at)));
        let gpus = Hold { amount: f64::from(row.gpus), start: secs(row.started_at), end };
        let cpus = Hold { amount: row.cpu_millis as f64 / 1000.0, ..gpus };
        let sums = groups
            .entry([key(row, "tenant"), key(row, "user"), key(row, "gpu-type"), key(row, "template")])
            .or_default();
        let gpu_hours = held_hours(&gpus, window_from, window_to);
        let in_window = gpus.start < window_to && gpus.end > window_from;
        sums.gpu_hours += gpu_hours;
        sums.cpu_hours += held_hours(&cpus, window_from, window_to);
        sums.attempts += i64::from(in_window);
        sums.decayed += decayed_hours(&gpus, now_s, half_life_hours * 3600.0);
        if let Some(utilization) = row.gpu_utilization {
            sums.used_gpu_hours += gpu_hours * utilization.clamp(0.0, 1.0);
            sums.reported_gpu_hours += gpu_hours;
        }
        if in_window {
            let tenant = series.entry(row.tenant.clone()).or_insert_with(|| vec![0.0; buckets]);
            for (total, hours) in
                tenant.iter_mut().zip(bucketed_hours(&gpus, window_from, bucket_seconds as f64, buckets))
            {
                *total += hours;
            }
        }
    }
    let rows = groups
        .into_iter()
        .filter(|(_, sums)| sums.attempts > 0 || sums.decayed > 0.0)
        .map(|([tenant, user, gpu_type, template], sums)| UsageRow {
            tenant,
            user,
            gpu_type,
            template,
            gpu_hours: sums.gpu_hours,
            cpu_hours: sums.cpu_hours,
            attempts: sums.attempts,
            decayed_gpu_hours: sums.decayed,
            efficiency: (sums.reported_gpu_hours > 0.0).then(|| sums.used_gpu_hours / sums.reported_gpu_hours),
        })
        .collect();
    UsageReport {
        from,
        to,
        by: by.to_vec(),
        half_life_hours,
        rows,
        series: series.into_iter().map(|(tenant, gpu_hours)| UsageSeries { tenant, gpu_hours }).collect(),
        bucket_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hours: f64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + (hours * 3600.0) as i64, 0).expect("in range")
    }

    fn row(tenant: &str, user: &str, gpus: i32, start: f64, end: Option<f64>) -> LedgerRow {
        LedgerRow {
            job_id: Uuid::nil(),
            tenant: tenant.into(),
            user_name: user.into(),
            gpu_type: Some("h100".into()),
            template: None,
            gpus,
            cpu_millis: 2000,
            started_at: at(start),
            ended_at: end.map(at),
            gpu_utilization: None,
        }
    }

    #[test]
    fn hours_are_clipped_to_the_window_and_running_attempts_count_to_now() {
        let rows = [
            row("a", "ann", 2, 0.0, Some(10.0)), // 4 h inside [6, 16): 8 GPU-h
            row("a", "bob", 1, 12.0, None),      // running since 12, now is 14: 2 GPU-h
            row("b", "cy", 4, 20.0, Some(30.0)), // after the window
        ];
        let by = vec!["tenant".to_string()];
        let report = usage_report(&rows, at(6.0), at(16.0), at(14.0), &by, 1e9);
        let a = report.rows.iter().find(|r| r.tenant.as_deref() == Some("a")).expect("a");
        assert!((a.gpu_hours - 10.0).abs() < 1e-9, "{}", a.gpu_hours);
        assert!((a.cpu_hours - 12.0).abs() < 1e-9, "{}", a.cpu_hours);
        assert_eq!(a.attempts, 2);
        assert_eq!(a.user, None);
        // b used nothing in the window, and nothing before now either: no row.
        assert!(report.rows.iter().all(|r| r.tenant.as_deref() != Some("b")));
        // Hourly buckets over ten hours, summing to the total.
        assert_eq!(report.bucket_seconds, 3600);
        assert_eq!(report.series[0].gpu_hours.len(), 10);
        assert!((report.series[0].gpu_hours.iter().sum::<f64>() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn grouping_by_user_splits_a_tenant() {
        let rows = [row("a", "ann", 2, 0.0, Some(1.0)), row("a", "bob", 1, 0.0, Some(1.0))];
        let by = vec!["tenant".to_string(), "user".to_string()];
        let report = usage_report(&rows, at(0.0), at(1.0), at(1.0), &by, 168.0);
        let users: Vec<_> = report.rows.iter().map(|r| (r.user.clone().unwrap_or_default(), r.gpu_hours)).collect();
        assert_eq!(users, vec![("ann".to_string(), 2.0), ("bob".to_string(), 1.0)]);
    }

    #[test]
    fn efficiency_is_used_over_held_where_reported() {
        let mut reported = row("a", "ann", 2, 0.0, Some(1.0));
        reported.gpu_utilization = Some(0.5);
        let silent = row("a", "ann", 2, 0.0, Some(1.0));
        let by = vec!["tenant".to_string()];
        let report = usage_report(&[reported, silent], at(0.0), at(1.0), at(1.0), &by, 168.0);
        assert_eq!(report.rows[0].efficiency, Some(0.5));
        let report = usage_report(&[row("a", "ann", 2, 0.0, Some(1.0))], at(0.0), at(1.0), at(1.0), &by, 168.0);
        assert_eq!(report.rows[0].efficiency, None);
    }

    #[test]
    fn usage_keys_are_checked() {
        assert_eq!(usage_keys(Some("tenant,gpu_type")).expect("ok"), vec!["tenant", "gpu-type"]);
        assert!(matches!(usage_keys(Some("team")), Err(Error::InvalidInput { field, .. }) if field == "by"));
        assert!(usage_keys(Some("user,user")).is_err());
    }
}
