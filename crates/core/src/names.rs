//! The names users give to things, each with its one rule and its one parser, used by the
//! templates, the application and the store alike, so that the API, the dashboard and a
//! template parameter give the same answer for the same name. The database constraints
//! (`tenants_name_format`, `volumes_name_format`, `datasets_name_format`) state the same rules
//! as a last line of defence.

use std::fmt;

/// Why a name was refused, in the words users see.
pub type NameError = String;

/// A DNS label: 1 to 63 lowercase letters, digits or '-', starting with a letter or digit. It
/// becomes a Kubernetes namespace or object name and a directory, so nothing else is allowed.
fn label_check(text: &str) -> Result<(), NameError> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a valid name: 1 to 63 lowercase letters, digits or '-', starting with a letter or digit"
        ))
    }
}

macro_rules! label_name {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn parse(text: &str) -> Result<$name, NameError> {
                label_check(text).map(|()| $name(text.to_string()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

label_name!(
    /// A tenant's name (a DNS label: it names the tenant's Kubernetes namespace).
    TenantName
);
label_name!(
    /// A volume's name (a DNS label: it names a PersistentVolumeClaim and a directory).
    VolumeName
);
label_name!(
    /// A task template's name (a DNS label).
    TemplateName
);

/// A dataset's name or version: 1 to 128 letters, digits, '.', '_' or '-', starting with a
/// letter or digit.
fn dataset_part_check(what: &str, text: &str) -> Result<(), NameError> {
    let mut chars = text.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && text.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a valid dataset {what}: 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

/// What a job's data parameter starts with to name a dataset version kept on Trainyard's
/// object store: `store:NAME@VERSION` (the engine fetches its files from the server).
pub const STORE_DATASET_PREFIX: &str = "store:";

/// A registered dataset version, written `name@version`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatasetRef {
    name: String,
    version: String,
}

impl DatasetRef {
    pub fn new(name: &str, version: &str) -> Result<DatasetRef, NameError> {
        dataset_part_check("name", name)?;
        dataset_part_check("version", version)?;
        Ok(DatasetRef { name: name.to_string(), version: version.to_string() })
    }

    /// `name@version`.
    pub fn parse(text: &str) -> Result<DatasetRef, NameError> {
        let (name, version) = text
            .split_once('@')
            .ok_or_else(|| format!("{text:?} does not name a dataset version: write it as name@version"))?;
        DatasetRef::new(name, version)
    }

    /// The version a job names as `store:NAME@VERSION` (a dataset kept on Trainyard's object
    /// store); `None` when `text` does not start with `store:`.
    pub fn parse_store(text: &str) -> Option<Result<DatasetRef, NameError>> {
        let rest = text.strip_prefix(STORE_DATASET_PREFIX)?;
        Some(DatasetRef::parse(rest).map_err(|why| why.replace("name@version", "store:name@version")))
    }

    /// `store:name@version`: how a job names this version when it is kept on the object store.
    pub fn store_uri(&self) -> String {
        format!("{STORE_DATASET_PREFIX}{self}")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> &str {
        &self.version
    }
}

impl fmt::Display for DatasetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// The job ids a short id (6 to 32 hex digits, dashes ignored) stands for: from the prefix padded
/// with `0` to it padded with `f`, so that a lookup walks the primary key's index rather than
/// every id as text. `None` when `prefix` is not such a short id.
pub fn job_id_range(prefix: &str) -> Option<(uuid::Uuid, uuid::Uuid)> {
    let hex: String = prefix.chars().filter(|c| *c != '-').collect::<String>().to_ascii_lowercase();
    if hex.len() < 6 || hex.len() > 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let pad = |with: char| format!("{hex}{}", with.to_string().repeat(32 - hex.len()));
    Some((uuid::Uuid::parse_str(&pad('0')).ok()?, uuid::Uuid::parse_str(&pad('f')).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "team-a", "0abc", "x".repeat(63).as_str()] {
            assert!(TenantName::parse(good).is_ok(), "{good}");
            assert!(VolumeName::parse(good).is_ok(), "{good}");
            assert!(TemplateName::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "Team", "a_b", "a.b", "a b", "é", "x".repeat(64).as_str()] {
            let err = VolumeName::parse(bad).unwrap_err();
            assert!(err.contains("1 to 63 lowercase letters, digits or '-'"), "{bad}: {err}");
            assert_eq!(TenantName::parse(bad).unwrap_err(), err, "one rule for every label");
        }
    }

    #[test]
    fn dataset_refs() {
        let parsed = DatasetRef::parse("ImageNet_1k@2024.1").unwrap();
        assert_eq!((parsed.name(), parsed.version()), ("ImageNet_1k", "2024.1"));
        assert_eq!(parsed.to_string(), "ImageNet_1k@2024.1");
        let cases = [
            ("photos", "write it as name@version"),
            ("@1", "not a valid dataset name"),
            ("photos@", "not a valid dataset version"),
            (".hidden@1", "not a valid dataset name"),
            ("photos@1@2", "not a valid dataset version"),
            ("pho tos@1", "not a valid dataset name"),
        ];
        for (text, message) in cases {
            let err = DatasetRef::parse(text).unwrap_err();
            assert!(err.contains(message), "{text}: {err}");
        }
    }

    #[test]
    fn store_refs() {
        let parsed = DatasetRef::parse_store("store:photos@1").unwrap().unwrap();
        assert_eq!((parsed.name(), parsed.version()), ("photos", "1"));
        assert_eq!(parsed.store_uri(), "store:photos@1");
        assert!(DatasetRef::parse_store("photos@1").is_none(), "not a store reference");
        assert!(DatasetRef::parse_store("/data/store:x@1").is_none());
        let err = DatasetRef::parse_store("store:photos").unwrap().unwrap_err();
        assert!(err.contains("write it as store:name@version"), "{err}");
        assert!(DatasetRef::parse_store("store:../x@1").unwrap().is_err());
    }
}
