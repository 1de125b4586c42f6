//! `yard usage` and `yard audit`: the GPU- and CPU-hours the allocation ledger counts per
//! tenant, user, GPU type or template, and the audit log of who changed what.

use std::process::ExitCode;

use chrono::{DateTime, NaiveDate, SecondsFormat, TimeDelta, Utc};
use clap::ValueEnum;
use trainyard_core::api::{AuditPage, UsageReport};

use crate::Output;
use crate::client::Client;
use crate::output;

/// The most entries the server gives in one page of the audit log.
const AUDIT_PAGE_MAX: usize = 1000;

#[derive(clap::Args)]
pub struct UsageArgs {
    /// Start of the window: RFC 3339, a date (2026-11-01, midnight UTC) or an age before now
    /// (7d, 12h, 30m); default: 30 days before --to.
    #[arg(long, value_name = "TIME", value_parser = parse_instant)]
    from: Option<DateTime<Utc>>,
    /// End of the window, written as --from takes it; default: now.
    #[arg(long, value_name = "TIME", value_parser = parse_instant)]
    to: Option<DateTime<Utc>>,
    /// Group by these keys, comma-separated; the table's columns follow their order (default:
    /// tenant).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KEYS")]
    by: Vec<UsageKey>,
    /// Only this tenant (platform admins; everyone else sees their own tenant's usage).
    #[arg(long)]
    tenant: Option<String>,
    /// Half-life of the decayed GPU-hours, in hours: an hour that long ago counts half
    /// (default: 168, seven days, as Slurm's fair share).
    #[arg(long, value_name = "HOURS")]
    half_life: Option<f64>,
}

/// What a usage report may group by.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageKey {
    Tenant,
    User,
    #[value(alias = "gpu_type")]
    GpuType,
    Template,
}

impl UsageKey {
    /// The name the API takes in `by`: `tenant`, `user`, `gpu-type`, `template`.
    fn api_name(self) -> &'static str {
        match self {
            UsageKey::Tenant => "tenant",
            UsageKey::User => "user",
            UsageKey::GpuType => "gpu-type",
            UsageKey::Template => "template",
        }
    }
}

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Only this tenant's entries (platform admins; a tenant admin sees only their own).
    #[arg(long)]
    tenant: Option<String>,
    /// Only this actor's entries: a user name, `user:NAME` or `local:COMMAND`.
    #[arg(long, value_name = "USER")]
    actor: Option<String>,
    /// Only this action (job.submit), or a family of them ending in a dot (job.).
    #[arg(long)]
    action: Option<String>,
    /// Only entries at or after this time: RFC 3339, a date (2026-11-01, midnight UTC) or an
    /// age before now (7d, 12h, 30m).
    #[arg(long, value_name = "TIME", value_parser = parse_instant)]
    since: Option<DateTime<Utc>>,
    /// Show at most this many entries, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
}

/// `GET /api/v1/usage`, shown as a table, the report as JSON, or CSV.
pub async fn usage(client: &Client, out: Output, args: UsageArgs) -> anyhow::Result<ExitCode> {
    let mut query = Vec::new();
    query.extend(args.from.map(|t| ("from", rfc3339(t))));
    query.extend(args.to.map(|t| ("to", rfc3339(t))));
    if !args.by.is_empty() {
        let keys: Vec<&str> = args.by.iter().map(|k| k.api_name()).collect();
        query.push(("by", keys.join(",")));
    }
    query.extend(args.tenant.map(|v| ("tenant", v)));
    query.extend(args.half_life.map(|h| ("half_life_hours", h.to_string())));
    let query = serde_urlencoded::to_string(&query)?;
    let report: UsageReport = client.get(&format!("/api/v1/usage?{query}")).await?;
    match out {
        Output::Csv => {
            print!("{}", output::usage_csv(&report));
            Ok(ExitCode::SUCCESS)
        }
        Output::Table | Output::Wide | Output::Json => output::print(out, &report, output::usage_table),
    }
}

/// `GET /api/v1/audit`, page after page (older each time) until `--limit` entries or the end.
/// As JSON: one page holding them all, whose `next_before` says whether older ones are left.
pub async fn audit(client: &Client, out: Output, args: AuditArgs) -> anyhow::Result<ExitCode> {
    let limit = args.limit as usize;
    let mut filters = Vec::new();
    filters.extend(args.tenant.map(|v| ("tenant", v)));
    filters.extend(args.actor.map(|v| ("actor", v)));
    filters.extend(args.action.map(|v| ("action", v)));
    filters.extend(args.since.map(|t| ("since", rfc3339(t))));
    let mut items = Vec::new();
    let mut before = None;
    let next_before = loop {
        let mut query = filters.clone();
        query.push(("limit", (limit - items.len()).min(AUDIT_PAGE_MAX).to_string()));
        query.extend(before.map(|b: i64| ("before", b.to_string())));
        let query = serde_urlencoded::to_string(&query)?;
        let page: AuditPage = client.get(&format!("/api/v1/audit?{query}")).await?;
        let empty = page.items.is_empty();
        items.extend(page.items);
        match page.next_before {
            Some(next) if items.len() < limit && !empty => before = Some(next),
            last => break last,
        }
    };
    output::print(out, &AuditPage { items, next_before }, output::audit_table)
}

fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `--from`, `--to`, `--since`: a time as [`instant_of`] reads it, ages counted from now.
fn parse_instant(text: &str) -> Result<DateTime<Utc>, String> {
    instant_of(text, Utc::now())
}

/// A time written as RFC 3339 (2026-11-01T09:30:00Z), a date (2026-11-01: its midnight UTC),
/// or an age (7d, 12h, 30m, 1d 12h: that long before `now`).
fn instant_of(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(day.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    let age = humantime::parse_duration(text).map_err(|_| {
        "expected RFC 3339 (2026-11-01T09:30:00Z), a date (2026-11-01) or an age before now (7d, 12h, 30m)".to_string()
    })?;
    TimeDelta::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .ok_or_else(|| format!("{text} before now is too long ago"))
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta, TimeZone, Utc};
    use clap::Parser;

    use super::instant_of;
    use crate::{Cli, Command};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 24, 4, 50, 0).unwrap()
    }

    #[test]
    fn an_age_counts_back_from_now() {
        assert_eq!(instant_of("7d", now()), Ok(now() - TimeDelta::days(7)));
        assert_eq!(instant_of("12h", now()), Ok(now() - TimeDelta::hours(12)));
        assert_eq!(instant_of("30m", now()), Ok(now() - TimeDelta::minutes(30)), "m is minutes, not months");
        assert_eq!(instant_of("1d 12h", now()), Ok(now() - TimeDelta::hours(36)));
    }

    #[test]
    fn a_date_is_its_midnight_utc_and_rfc3339_keeps_its_offset() {
        assert_eq!(instant_of("2026-11-01", now()), Ok(Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap()));
        assert_eq!(
            instant_of("2026-11-01T09:30:00+02:00", now()),
            Ok(Utc.with_ymd_and_hms(2026, 11, 1, 7, 30, 0).unwrap())
        );
        assert_eq!(instant_of("2026-11-01T09:30:00Z", now()), Ok(Utc.with_ymd_and_hms(2026, 11, 1, 9, 30, 0).unwrap()));
    }

    #[test]
    fn a_bad_time_is_refused_naming_the_flag_and_the_forms_it_takes() {
        for (command, flag) in [("usage", "--from"), ("usage", "--to"), ("audit", "--since")] {
            let err = Cli::try_parse_from(["yard", command, flag, "last tuesday"]).err().expect("refused");
            let text = err.to_string();
            assert!(text.contains(flag) && text.contains("last tuesday"), "{text}");
            assert!(text.contains("2026-11-01") && text.contains("7d"), "says what it takes: {text}");
        }
        assert!(instant_of("2026-13-01", now()).is_err(), "no 13th month");
        assert!(instant_of("", now()).is_err());
        assert!(instant_of("-7d", now()).is_err(), "an age is not negative");
    }

    #[test]
    fn usage_keys_keep_the_order_asked() {
        let cli = Cli::try_parse_from(["yard", "usage", "--by", "template,gpu_type,user", "--from", "7d"]).unwrap();
        let Command::Usage(args) = cli.command else { panic!("not usage") };
        let keys: Vec<&str> = args.by.iter().map(|k| k.api_name()).collect();
        assert_eq!(keys, ["template", "gpu-type", "user"]);
        assert!(Cli::try_parse_from(["yard", "usage", "--by", "tenant,colour"]).is_err());
    }

    #[tokio::test]
    async fn csv_is_refused_before_another_command_does_anything() {
        let cli = Cli::try_parse_from(["yard", "cancel", "0193b4c2", "-o", "csv"]).unwrap();
        let err = crate::run(cli).await.expect_err("refused");
        assert!(err.to_string().contains("-o csv is for `yard usage`"), "{err}");
    }

    #[test]
    fn audit_shows_at_least_one_entry() {
        assert!(Cli::try_parse_from(["yard", "audit", "--limit", "0"]).is_err());
        let cli = Cli::try_parse_from(["yard", "audit"]).unwrap();
        let Command::Audit(args) = cli.command else { panic!("not audit") };
        assert_eq!(args.limit, 50);
    }
}
