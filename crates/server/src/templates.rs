//! The template registry: built-in templates (embedded in the binary from the workspace's
//! `templates/` folder, checked at start) and each tenant's uploaded ones (in Postgres).
//! A built-in's name is reserved: no tenant can publish a template under it.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use include_dir::{Dir, include_dir};
use trainyard_core::api::{TemplateDetail, TemplateSource, TemplateSummary, TemplateUpload};
use trainyard_core::auth::Caller;
use trainyard_core::error::ObjectKind;
use trainyard_core::job::TemplateRef;
use trainyard_core::{Error, Result};
use trainyard_store::Store;
use trainyard_store::templates::{KeptBuiltin, Published, StoredTemplate};
use trainyard_templates::{Bundle, LoadError, MANIFEST_FILE, Template};
use uuid::Uuid;

/// The built-in template a notebook session runs (`templates/notebook`); its jobs get the
/// session's upstream secret at launch.
pub const NOTEBOOK_TEMPLATE: &str = "notebook";

static BUILTIN_DIR: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../../templates");

pub struct Templates {
    builtins: BTreeMap<String, Arc<Template>>,
    /// The built-ins as bundles (manifest text and files), kept in the database by digest.
    bundles: BTreeMap<String, Bundle>,
    store: Store,
}

impl Templates {
    /// Loads and checks every built-in template. A broken one stops the server from starting,
    /// naming the folder, the file, the field and the rule.
    pub fn new(store: Store) -> std::result::Result<Templates, String> {
        Templates::with_bundles(store, builtin_bundles())
    }

    /// The built-ins from a folder of template folders instead of those built into the binary
    /// (`serve --builtin-templates-dir`: template development, and the tests of kept versions).
    pub fn from_dir(store: Store, dir: &std::path::Path) -> std::result::Result<Templates, String> {
        Templates::with_bundles(store, bundles_in(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?)
    }

    fn with_bundles(store: Store, bundles: BTreeMap<String, Bundle>) -> std::result::Result<Templates, String> {
        let mut builtins = BTreeMap::new();
        for (folder, bundle) in &bundles {
            let template = Template::load(bundle).map_err(|e| format!("built-in template templates/{folder}/{e}"))?;
            if template.name() != folder {
                return Err(format!(
                    "built-in template templates/{folder}/{MANIFEST_FILE}: name: is {:?}; it must match its folder",
                    template.name()
                ));
            }
            builtins.insert(folder.clone(), Arc::new(template));
        }
        Ok(Templates { builtins, bundles, store })
    }

    /// Keeps every built-in version this server offers in the database, by digest, so that a
    /// job from it runs again with exactly its files after Trainyard is upgraded.
    pub async fn keep_builtins(&self) -> Result<()> {
        for (folder, template) in &self.builtins {
            let bundle = &self.bundles[folder];
            let kept = KeptBuiltin {
                name: template.name().to_string(),
                version: template.version().to_string(),
                digest: template.digest.clone(),
                manifest: bundle.manifest.clone(),
                files: bundle.files.clone(),
            };
            self.store.builtin_version_keep(&kept).await?;
        }
        Ok(())
    }

    /// Exactly the template a job ran (`reference`, with its digest): the built-in of this
    /// server, a kept earlier built-in version, or the tenant's published version, whose digest
    /// must still be the one recorded.
    pub async fn resolve_pinned(&self, tenant_id: Uuid, reference: &TemplateRef) -> Result<Arc<Template>> {
        let gone = || {
            Error::Conflict(format!(
                "template {}@{} with digest {} is no longer available to run again",
                reference.name, reference.version, reference.digest
            ))
        };
        if let Some(current) = self.builtins.get(&reference.name) {
            if current.digest == reference.digest {
                return Ok(Arc::clone(current));
            }
            let kept = self
                .store
                .builtin_version_get(&reference.name, &reference.version, Some(&reference.digest))
                .await?
                .ok_or_else(gone)?;
            let template = Template::load(&Bundle { manifest: kept.manifest, files: kept.files }).map_err(|e| {
                Error::internal(format!("kept built-in {}@{} no longer loads: {e}", kept.name, kept.version))
            })?;
            return if template.digest == reference.digest { Ok(Arc::new(template)) } else { Err(gone()) };
        }
        let (template, _) = self.resolve(tenant_id, &reference.name, Some(&reference.version)).await?;
        if template.digest == reference.digest { Ok(template) } else { Err(gone()) }
    }

    /// Built-ins and the tenant's own, by name.
    pub async fn list(&self, tenant_id: Uuid) -> Result<Vec<TemplateSummary>> {
        let mut summaries: Vec<TemplateSummary> = self
            .builtins
            .values()
            .map(|t| TemplateSummary {
                name: t.name().to_string(),
                source: TemplateSource::Builtin,
                description: t.manifest.description.clone(),
                versions: vec![t.version().to_string()],
                latest: t.version().to_string(),
            })
            .collect();
        let mut by_name: BTreeMap<String, Vec<(semver::Version, String)>> = BTreeMap::new();
        for row in self.store.templates_list(tenant_id).await? {
            let version = semver::Version::parse(&row.version).map_err(Error::internal)?;
            by_name.entry(row.name).or_default().push((version, row.description));
        }
        for (name, mut versions) in by_name {
            versions.sort_by(|a, b| b.0.cmp(&a.0));
            summaries.push(TemplateSummary {
                name,
                source: TemplateSource::Tenant,
                description: versions[0].1.clone(),
                latest: versions[0].0.to_string(),
                versions: versions.iter().map(|(v, _)| v.to_string()).collect(),
            });
        }
        Ok(summaries)
    }

    /// A template version: the given one, or the newest.
    pub async fn resolve(
        &self,
        tenant_id: Uuid,
        name: &str,
        version: Option<&str>,
    ) -> Result<(Arc<Template>, TemplateDetail)> {
        if let Some(template) = self.builtins.get(name) {
            if let Some(wanted) = version
                && wanted != template.version().to_string()
            {
                return Err(Error::invalid("version", format!("{name} has version {} only", template.version())));
            }
            let detail = detail_of(template, TemplateSource::Builtin, vec![template.version().to_string()]);
            return Ok((Arc::clone(template), detail));
        }
        let mut versions: Vec<semver::Version> = self
            .store
            .templates_list(tenant_id)
            .await?
            .into_iter()
            .filter(|row| row.name == name)
            .filter_map(|row| semver::Version::parse(&row.version).ok())
            .collect();
        versions.sort_by(|a, b| b.cmp(a));
        let Some(newest) = versions.first() else {
            return Err(Error::not_found(ObjectKind::Template));
        };
        let chosen = match version {
            None => newest.to_string(),
            Some(wanted) if versions.iter().any(|v| v.to_string() == wanted) => wanted.to_string(),
            Some(wanted) => {
                let known: Vec<String> = versions.iter().map(|v| v.to_string()).collect();
                return Err(Error::invalid(
                    "version",
                    format!("{name} has no version {wanted}; it has {}", known.join(", ")),
                ));
            }
        };
        let stored = self
            .store
            .template_get(tenant_id, name, &chosen)
            .await?
            .ok_or_else(|| Error::not_found(ObjectKind::Template))?;
        let template = Template::load(&Bundle { manifest: stored.manifest, files: stored.files })
            .map_err(|e| Error::internal(format!("stored template {name}@{chosen} no longer loads: {e}")))?;
        let detail = detail_of(&template, TemplateSource::Tenant, versions.iter().map(|v| v.to_string()).collect());
        Ok((Arc::new(template), detail))
    }

    /// The files a job from `reference` receives. The digest must still match: what runs is
    /// exactly what was recorded.
    pub async fn files_for(&self, tenant_id: Uuid, reference: &TemplateRef) -> Result<BTreeMap<String, Vec<u8>>> {
        Ok(self.resolve_pinned(tenant_id, reference).await?.files.clone())
    }

    /// Checks an uploaded bundle completely, then publishes it for the caller's tenant.
    pub async fn publish(
        &self,
        caller: &Caller,
        upload: TemplateUpload,
        audit: &trainyard_store::audit::Audit,
    ) -> Result<(TemplateDetail, Published)> {
        let mut files = BTreeMap::new();
        for (path, encoded) in upload.files {
            let content = base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map_err(|e| Error::invalid(format!("files.{path}"), format!("is not base64: {e}")))?;
            files.insert(path, content);
        }
        let bundle = Bundle { manifest: upload.manifest, files };
        let template = Template::load(&bundle).map_err(load_error)?;
        if self.builtins.contains_key(template.name()) {
            return Err(Error::Conflict(format!("{} is a built-in template; choose another name", template.name())));
        }
        let stored = StoredTemplate {
            name: template.name().to_string(),
            version: template.version().to_string(),
            digest: template.digest.clone(),
            description: template.manifest.description.clone(),
            manifest: bundle.manifest.clone(),
            files: bundle.files.clone(),
            created_by: caller.user.clone(),
            created_at: chrono::Utc::now(),
        };
        let published = self
            .store
            .template_publish(
                caller,
                &stored,
                &audit.clone().target(format!("template:{}@{}", stored.name, stored.version)),
            )
            .await?;
        let (_, detail) = self.resolve(caller.tenant_id, template.name(), Some(&stored.version)).await?;
        Ok((detail, published))
    }
}

/// A load error of an upload: 422 naming the file and the field.
fn load_error(err: LoadError) -> Error {
    Error::invalid(err.field.clone(), format!("{}: {}", err.file, err.message))
}

fn detail_of(template: &Template, source: TemplateSource, versions: Vec<String>) -> TemplateDetail {
    TemplateDetail {
        name: template.name().to_string(),
        version: template.version().to_string(),
        source,
        digest: template.digest.clone(),
        versions,
        manifest: serde_json::to_value(&template.manifest).expect("manifest serialises"),
        files: template.files.keys().cloned().collect(),
    }
}

/// The built-in templates as bundles, by folder name.
pub fn builtin_bundles() -> BTreeMap<String, Bundle> {
    let mut bundles = BTreeMap::new();
    for folder in BUILTIN_DIR.dirs() {
        let name = folder.path().to_string_lossy().into_owned();
        let mut bundle = Bundle::default();
        collect(folder, folder.path(), &mut bundle);
        bundles.insert(name, bundle);
    }
    bundles
}

/// Template bundles from a folder on disk, one sub-folder per template (the layout of the
/// workspace's `templates/`).
fn bundles_in(dir: &std::path::Path) -> std::io::Result<BTreeMap<String, Bundle>> {
    let mut bundles = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_dir() {
            continue;
        }
        let root = entry.path();
        let mut bundle = Bundle::default();
        let mut stack = vec![root.clone()];
        while let Some(folder) = stack.pop() {
            for item in std::fs::read_dir(&folder)? {
                let path = item?.path();
                let relative = path.strip_prefix(&root).expect("inside its folder").to_path_buf();
                if !is_template_file(&relative) {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if relative.as_os_str() == MANIFEST_FILE {
                    bundle.manifest = std::fs::read_to_string(&path)?;
                } else {
                    bundle.files.insert(relative.to_string_lossy().into_owned(), std::fs::read(&path)?);
                }
            }
        }
        bundles.insert(entry.file_name().to_string_lossy().into_owned(), bundle);
    }
    Ok(bundles)
}

/// Whether a path inside a built-in template's folder is part of the template: not its own
/// tests (`tests/`, run by `tests/run`) and not what running them or Python leaves behind.
fn is_template_file(relative: &std::path::Path) -> bool {
    let mut parts = relative.components().map(|c| c.as_os_str().to_string_lossy());
    let first_is_tests = parts.next().is_some_and(|first| first == "tests");
    !first_is_tests
        && !relative.components().any(|c| {
            let name = c.as_os_str().to_string_lossy();
            name.starts_with('.') || name == "__pycache__" || name.ends_with(".pyc")
        })
}

fn collect(dir: &Dir<'_>, root: &std::path::Path, bundle: &mut Bundle) {
    for file in dir.files() {
        let path = file.path().strip_prefix(root).expect("inside its folder");
        if !is_template_file(path) {
            continue;
        }
        let relative = path.to_string_lossy().into_owned();
        if relative == MANIFEST_FILE {
            bundle.manifest = String::from_utf8_lossy(file.contents()).into_owned();
        } else {
            bundle.files.insert(relative, file.contents().to_vec());
        }
    }
    for sub in dir.dirs() {
        if is_template_file(sub.path().strip_prefix(root).expect("inside its folder")) {
            collect(sub, root, bundle);
        }
    }
}
