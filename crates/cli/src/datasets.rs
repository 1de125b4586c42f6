//! `yard datasets push`: a packed folder (data-pack's, or `yard-data pack`'s) uploaded to the
//! installation's object store and registered as a new version. The manifest goes first (the
//! server checks every shard against it while it streams), then each shard and index, then the
//! registration, which the server refuses unless every file is there with its size. The files
//! are kept by the manifest's content hash, so pushing the same content again stores it once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use trainyard_core::api::{Dataset, DatasetFileUploaded, DatasetRegister};
use trainyard_core::names::DatasetRef;
use trainyard_core::resources::human_memory;
use trainyard_data::manifest::{DatasetManifest, MANIFEST_FILE};

use crate::Output;
use crate::client::Client;
use crate::output;

/// Files uploaded at once.
const UPLOADS_IN_FLIGHT: usize = 4;

/// Pushes the packed dataset in `folder` as `dataset` (`NAME`, the next whole-number version;
/// or `NAME@VERSION`).
pub async fn push(client: &Client, out: Output, dataset: &str, folder: &Path) -> anyhow::Result<ExitCode> {
    let (name, version) = match dataset.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (dataset, None),
    };
    DatasetRef::new(name, version.unwrap_or("1")).map_err(anyhow::Error::msg)?;
    let manifest = DatasetManifest::read(folder).map_err(|err| anyhow::anyhow!("{err}"))?;
    let manifest_bytes = std::fs::read(folder.join(MANIFEST_FILE))?;
    let files = files_of(folder, &manifest)?;
    let registered: Vec<Dataset> = client.get("/api/v1/datasets").await?;
    let versions: Vec<&Dataset> = registered.iter().filter(|d| d.name == name).collect();
    let version = match version {
        Some(version) => version.to_string(),
        None => {
            // The same content pushed before under this name: nothing to do.
            if let Some(same) =
                versions.iter().find(|d| d.content_hash == manifest.content_hash && d.store_prefix.is_some())
            {
                eprintln!("{}@{} holds this content already; nothing pushed", same.name, same.version);
                return output::print(out, *same, |d| format!("{}@{}\n", d.name, d.version));
            }
            let newest = versions.iter().filter_map(|d| d.version.parse::<u64>().ok()).max().unwrap_or(0);
            (newest + 1).to_string()
        }
    };
    let hex = manifest.content_hash.trim_start_matches("sha256:").to_string();
    // The same content pushed before under another name: its files are there and cannot change;
    // only the new version is registered.
    let stored = registered.iter().any(|d| d.content_hash == manifest.content_hash && d.store_prefix.is_some());
    let total: u64 = files.iter().map(|f| f.1).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("pushing {name}@{version}"));
    let manifest_len = manifest_bytes.len() as u64;
    if !stored {
        let _: DatasetFileUploaded = client
            .put_body(&file_api_path(&hex, MANIFEST_FILE)?, reqwest::Body::from(manifest_bytes), manifest_len)
            .await
            .context("uploading the manifest")?;
    }
    let to_upload = if stored { &[][..] } else { &files[..] };
    let uploads = futures::stream::iter(to_upload.iter().map(|(file, len)| {
        let (bar, hex) = (bar.clone(), hex.clone());
        async move { upload(client, &hex, folder, file, *len, &bar).await }
    }))
    .buffer_unordered(UPLOADS_IN_FLIGHT);
    let results: Vec<anyhow::Result<()>> = uploads.collect().await;
    bar.finish_and_clear();
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let body = DatasetRegister {
        name: name.to_string(),
        version,
        from_job: None,
        uri: None,
        format: None,
        content_hash: None,
        size_bytes: None,
        samples: None,
        from_store: Some(manifest.content_hash.clone()),
    };
    let d: Dataset = client.post("/api/v1/datasets", &body).await?;
    output::print(out, &d, |d| {
        format!(
            "pushed {}@{} ({} shards, {}, content hash {}); jobs read it as {}\n",
            d.name,
            d.version,
            manifest.shards.len(),
            human_memory(manifest.bytes),
            d.content_hash,
            d.uri
        )
    })
}

/// Every shard and index the manifest names, with its size here; a file that is missing, or a
/// shard whose size is not the manifest's, stops the push before anything is sent.
fn files_of(folder: &Path, manifest: &DatasetManifest) -> anyhow::Result<Vec<(String, u64)>> {
    let mut files = Vec::with_capacity(manifest.shards.len() * 2);
    for shard in &manifest.shards {
        for name in [&shard.name, &shard.index] {
            let path: PathBuf = folder.join(name);
            let len =
                std::fs::metadata(&path).with_context(|| format!("{}: the manifest names it", path.display()))?.len();
            if *name == shard.name && len != shard.bytes {
                anyhow::bail!(
                    "{}: {len} bytes, the manifest says {}; pack the dataset again",
                    path.display(),
                    shard.bytes
                );
            }
            files.push((name.clone(), len));
        }
    }
    Ok(files)
}

async fn upload(
    client: &Client,
    hex: &str,
    folder: &Path,
    file: &str,
    len: u64,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    let _: DatasetFileUploaded = client
        .put_file(&file_api_path(hex, file)?, &folder.join(file), len, bar)
        .await
        .with_context(|| format!("uploading {file}"))?;
    Ok(())
}

/// `/api/v1/dataset-content/<hex>/<file>`, the file name percent-encoded.
fn file_api_path(hex: &str, file: &str) -> anyhow::Result<String> {
    let mut url = reqwest::Url::parse("http://x/api/v1/dataset-content")?;
    url.path_segments_mut().map_err(|()| anyhow::anyhow!("bad URL"))?.push(hex).push(file);
    Ok(url.path().to_string())
}
