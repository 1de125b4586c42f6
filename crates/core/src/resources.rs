//! Per-replica resource requests. Users write cpu as cores (`2`, `0.5`, `"500m"`) and memory as
//! Kubernetes-style quantities (`"4Gi"`, `"512Mi"`, `"1G"`) or a byte count; inside Trainyard they
//! are integers (millicores, bytes) so that sums and comparisons are exact.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use utoipa::ToSchema;

/// Upper bounds that no real replica reaches; values above them are typos, not requests.
pub const MAX_CPU_MILLIS: u64 = 1024 * 1000;
pub const MAX_MEMORY_BYTES: u64 = 64 << 40; // 64 TiB
pub const MAX_GPUS_PER_REPLICA: u32 = 64;

/// What one replica of a job needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU cores: a number (`2`, `0.5`) or millicores (`"500m"`). Default 1.
    #[serde(default = "Cpu::one")]
    #[schema(value_type = f64, example = 1.0)]
    pub cpu: Cpu,
    /// Memory: bytes, or a quantity such as `"4Gi"`, `"512Mi"`, `"2G"`. Default `"1Gi"`.
    #[serde(default = "Memory::one_gib")]
    #[schema(value_type = String, example = "4Gi")]
    pub memory: Memory,
    /// GPUs per replica. Default 0.
    #[serde(default)]
    pub gpus: u32,
    /// GPU type, e.g. `nvidia-h100-80gb`. Any type when absent.
    #[serde(default)]
    pub gpu_type: Option<String>,
}

impl Default for Resources {
    fn default() -> Self {
        Resources { cpu: Cpu::one(), memory: Memory::one_gib(), gpus: 0, gpu_type: None }
    }
}

/// CPU in millicores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cpu(pub u64);

impl Cpu {
    pub fn one() -> Cpu {
        Cpu(1000)
    }

    pub fn millis(self) -> u64 {
        self.0
    }

    /// Parses `"2"`, `"0.5"`, `"500m"`.
    pub fn parse(text: &str) -> Result<Cpu, String> {
        let text = text.trim();
        if let Some(millis) = text.strip_suffix('m') {
            return millis
                .parse::<u64>()
                .map(Cpu)
                .map_err(|_| format!("`{text}` is not a cpu amount such as 2, 0.5 or \"500m\""));
        }
        let cores: f64 =
            text.parse().map_err(|_| format!("`{text}` is not a cpu amount such as 2, 0.5 or \"500m\""))?;
        Cpu::from_cores(cores)
    }

    pub fn from_cores(cores: f64) -> Result<Cpu, String> {
        if !cores.is_finite() || cores < 0.0 {
            return Err(format!("cpu must be a positive number of cores, got {cores}"));
        }
        let millis = (cores * 1000.0).round();
        if millis > MAX_CPU_MILLIS as f64 {
            return Err(format!(
                "{} is more than any node has (at most {})",
                human_cpus(millis as u64),
                human_cpus(MAX_CPU_MILLIS)
            ));
        }
        Ok(Cpu(millis as u64))
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) { write!(f, "{}", self.0 / 1000) } else { write!(f, "{}m", self.0) }
    }
}

impl Serialize for Cpu {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0 as f64 / 1000.0)
    }
}

impl<'de> Deserialize<'de> for Cpu {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Cpu, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Cpu;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("cpu cores as a number (2, 0.5) or a string such as \"500m\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Cpu, E> {
                Cpu::from_cores(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Cpu, E> {
                Cpu::from_cores(v as f64).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Cpu, E> {
                Cpu::from_cores(v as f64).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Cpu, E> {
                Cpu::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Memory(pub u64);

const BINARY_SUFFIXES: [(&str, u64); 5] =
    [("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("Pi", 1 << 50)];
const DECIMAL_SUFFIXES: [(&str, u64); 5] =
    [("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000), ("T", 1_000_000_000_000), ("P", 1_000_000_000_000_000)];

impl Memory {
    pub fn one_gib() -> Memory {
        Memory(1 << 30)
    }

    pub fn bytes(self) -> u64 {
        self.0
    }

    /// Parses a byte count or a quantity with a binary (`Ki`..`Pi`) or decimal (`k`..`P`) suffix.
    pub fn parse(text: &str) -> Result<Memory, String> {
        let text = text.trim();
        let bad = || format!("`{text}` is not a memory amount such as \"4Gi\", \"512Mi\" or a byte count");
        let (digits, unit) = BINARY_SUFFIXES
            .iter()
            .chain(DECIMAL_SUFFIXES.iter())
            .find_map(|(suffix, unit)| text.strip_suffix(suffix).map(|d| (d, *unit)))
            .unwrap_or((text, 1));
        let value: u64 = digits.parse().map_err(|_| bad())?;
        Memory::from_bytes(value.checked_mul(unit).ok_or_else(bad)?)
    }

    pub fn from_bytes(bytes: u64) -> Result<Memory, String> {
        if bytes == 0 {
            return Err("memory must be more than 0 bytes".into());
        }
        if bytes > MAX_MEMORY_BYTES {
            return Err(format!(
                "{} of memory is more than any node has (at most {})",
                human_memory(bytes),
                human_memory(MAX_MEMORY_BYTES)
            ));
        }
        Ok(Memory(bytes))
    }
}

impl fmt::Display for Memory {
    /// The largest binary unit that divides the amount exactly, so that parsing the text gives
    /// back the same number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (suffix, unit) in BINARY_SUFFIXES.iter().rev() {
            if self.0 >= *unit && self.0.is_multiple_of(*unit) {
                return write!(f, "{}{suffix}", self.0 / unit);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for Memory {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Memory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Memory, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Memory;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("memory as a byte count or a string such as \"4Gi\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Memory, E> {
                Memory::from_bytes(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Memory, E> {
                if v < 0 {
                    return Err(E::custom(format!("memory must be positive, got {v}")));
                }
                Memory::from_bytes(v as u64).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Memory, E> {
                Err(E::custom(format!("memory must be a whole number of bytes or a quantity such as \"4Gi\", got {v}")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Memory, E> {
                Memory::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// CPUs as people write them, in every message a person reads: `1 CPU`, `8 CPUs`, `2.5 CPUs`,
/// `0.25 CPUs` (never millicores).
pub fn human_cpus(millis: u64) -> String {
    let cores = if millis.is_multiple_of(1000) {
        format!("{}", millis / 1000)
    } else {
        let text = format!("{:.3}", millis as f64 / 1000.0);
        text.trim_end_matches('0').to_string()
    };
    let unit = if millis == 1000 { "CPU" } else { "CPUs" };
    format!("{cores} {unit}")
}

/// Memory, and every size (a dataset, a code archive, a volume, an artefact), as people read it,
/// in every message a person reads: the largest binary unit that keeps one decimal, `512 MiB`,
/// `1.5 GiB`, `1 TiB` (never a byte count, but below 1 KiB, and never `Memory`'s exact
/// `24684084Ki`, which is for parsing back).
pub fn human_memory(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for next in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    let text = format!("{value:.1}");
    format!("{} {unit}", text.strip_suffix(".0").unwrap_or(&text))
}

/// GPUs as people say them, in every message a person reads: `1 GPU`, `8 GPUs`,
/// `8 GPUs of nvidia-h100-80gb`.
pub fn human_gpus(count: u64, gpu_type: Option<&str>) -> String {
    let unit = if count == 1 { "GPU" } else { "GPUs" };
    match gpu_type {
        Some(kind) => format!("{count} {unit} of {kind}"),
        None => format!("{count} {unit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_people_write_them() {
        assert_eq!(human_cpus(8000), "8 CPUs");
        assert_eq!(human_cpus(1000), "1 CPU");
        assert_eq!(human_cpus(500), "0.5 CPUs");
        assert_eq!(human_cpus(2500), "2.5 CPUs");
        assert_eq!(human_cpus(2250), "2.25 CPUs");
        assert_eq!(human_cpus(1), "0.001 CPUs");
        assert_eq!(human_memory(512 << 20), "512 MiB");
        assert_eq!(human_memory(3 << 29), "1.5 GiB");
        assert_eq!(human_memory(16 << 30), "16 GiB");
        assert_eq!(human_memory(1 << 40), "1 TiB");
        assert_eq!(human_memory(8_336_031_744), "7.8 GiB");
        assert_eq!(human_memory(100), "100 B");
        assert_eq!(human_gpus(1, None), "1 GPU");
        assert_eq!(human_gpus(8, Some("nvidia-h100-80gb")), "8 GPUs of nvidia-h100-80gb");
        assert_eq!(human_gpus(0, None), "0 GPUs");
    }

    #[test]
    fn refusals_of_amounts_state_them_in_human_units() {
        let memory = Memory::from_bytes(MAX_MEMORY_BYTES + (1 << 40)).unwrap_err();
        assert!(memory.contains("65 TiB") && memory.contains("at most 64 TiB"), "{memory}");
        let cpu = Cpu::from_cores(2000.5).unwrap_err();
        assert!(cpu.contains("2000.5 CPUs") && cpu.contains("at most 1024 CPUs"), "{cpu}");
    }

    #[test]
    fn cpu_accepts_cores_and_millicores() {
        assert_eq!(Cpu::parse("2").unwrap(), Cpu(2000));
        assert_eq!(Cpu::parse("0.5").unwrap(), Cpu(500));
        assert_eq!(Cpu::parse("250m").unwrap(), Cpu(250));
        assert!(Cpu::parse("-1").is_err());
        assert!(Cpu::parse("lots").is_err());
        assert!(Cpu::from_cores(1e9).is_err());
        assert_eq!(Cpu(1500).to_string(), "1500m");
        assert_eq!(Cpu(3000).to_string(), "3");
    }

    #[test]
    fn memory_round_trips_through_its_text() {
        for text in ["4Gi", "512Mi", "1G", "1000", "3Ki"] {
            let memory = Memory::parse(text).unwrap();
            assert_eq!(Memory::parse(&memory.to_string()).unwrap(), memory, "{text}");
        }
        assert_eq!(Memory::parse("2Gi").unwrap().bytes(), 2 << 30);
        assert_eq!(Memory::parse("1G").unwrap().bytes(), 1_000_000_000);
        assert!(Memory::parse("0").is_err());
        assert!(Memory::parse("100Pi").is_err());
        assert!(Memory::parse("18446744073709551615Pi").is_err());
        assert!(Memory::parse("4 gigs").is_err());
    }

    #[test]
    fn resources_from_json_with_defaults() {
        let r: Resources = serde_json::from_str(r#"{"cpu": "500m", "memory": "2Gi", "gpus": 1}"#).unwrap();
        assert_eq!(r.cpu, Cpu(500));
        assert_eq!(r.memory.bytes(), 2 << 30);
        let r: Resources = serde_json::from_str("{}").unwrap();
        assert_eq!(r, Resources::default());
        assert!(serde_json::from_str::<Resources>(r#"{"cpu": -2}"#).is_err());
        assert!(serde_json::from_str::<Resources>(r#"{"gpus": -1}"#).is_err());
    }
}
