//! Where `yard` finds the server and the token: the environment (`TRAINYARD_URL`,
//! `TRAINYARD_TOKEN`) first, then the file `yard login` writes under the user's config directory.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
pub struct Config {
    pub url: String,
    pub token: String,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config").field("url", &self.url).field("token", &"<redacted>").finish()
    }
}

pub fn path() -> anyhow::Result<PathBuf> {
    let dir = dirs::config_dir().context("cannot find your config directory (set HOME or XDG_CONFIG_HOME)")?;
    Ok(dir.join("trainyard").join("config.json"))
}

/// The settings in force, or a hint to log in.
pub fn load() -> anyhow::Result<Config> {
    let env_url = std::env::var("TRAINYARD_URL").ok().filter(|v| !v.is_empty());
    let env_token = std::env::var("TRAINYARD_TOKEN").ok().filter(|v| !v.is_empty());
    let file: Option<Config> = match std::fs::read(path()?) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).context("reading the yard config file")?),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(err).context("reading the yard config file"),
    };
    let url = env_url.or_else(|| file.as_ref().map(|c| c.url.clone()));
    let token = env_token.or_else(|| file.as_ref().map(|c| c.token.clone()));
    match (url, token) {
        (Some(url), Some(token)) => Ok(Config { url: url.trim_end_matches('/').to_string(), token }),
        _ => {
            bail!("not signed in: run `yard login --url URL --token TOKEN` (or set TRAINYARD_URL and TRAINYARD_TOKEN)")
        }
    }
}

/// Writes the config readable by its owner only: it holds a secret.
pub fn save(config: &Config) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path()?;
    std::fs::create_dir_all(path.parent().expect("config path has a parent"))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(&serde_json::to_vec_pretty(config)?)?;
    Ok(path)
}
