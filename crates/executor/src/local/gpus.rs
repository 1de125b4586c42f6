//! The machine's GPUs, from `nvidia-smi` when it is installed.

use std::process::Command;

use crate::Gpu;

/// The GPUs `nvidia-smi` lists, or none when it is absent or fails.
pub fn discover() -> Vec<Gpu> {
    let Ok(output) = Command::new("nvidia-smi").args(["--query-gpu=index,name", "--format=csv,noheader"]).output()
    else {
        return Vec::new();
    };
    if !output.status.success() {
        tracing::warn!(status = %output.status, "nvidia-smi failed; offering no GPUs");
        return Vec::new();
    }
    parse(&String::from_utf8_lossy(&output.stdout))
}

/// Parses lines such as `0, NVIDIA H100 80GB HBM3`.
pub fn parse(csv: &str) -> Vec<Gpu> {
    csv.lines()
        .filter_map(|line| {
            let (index, name) = line.split_once(',')?;
            Some(Gpu { index: index.trim().parse().ok()?, gpu_type: normalise_type(name) })
        })
        .collect()
}

/// `NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`: the form used in job requests.
pub fn normalise_type(name: &str) -> String {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_smi_csv() {
        let gpus = parse("0, NVIDIA H100 80GB HBM3\n1, NVIDIA H100 80GB HBM3\n");
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1], Gpu { index: 1, gpu_type: "nvidia-h100-80gb-hbm3".into() });
        assert!(parse("garbage").is_empty());
    }
}
