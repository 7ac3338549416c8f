use resident_proto::{VramBytes, pb};

use super::GpuProbe;
use crate::error::AgentError;

/// GPUs that exist only as capacity (`--simulate-gpus "A6000:48GiB x8,T4:16GiB"`), some
/// perhaps unavailable (`!T4:16GiB`: a GPU the host has and cannot open).
pub struct SimulatedGpus {
    gpus: Vec<pb::GpuInfo>,
    unavailable: Vec<pb::UnavailableGpu>,
}

impl SimulatedGpus {
    /// GPUs that are reported as `gpus` and run nothing.
    pub fn new(gpus: Vec<pb::GpuInfo>) -> Self {
        Self {
            gpus,
            unavailable: Vec::new(),
        }
    }

    /// The GPUs of a `--simulate-gpus` spec (`[!]NAME:SIZE[@MAJOR.MINOR] [xCOUNT]`, several
    /// comma-separated), those marked `!` reported as unavailable.
    pub fn parse(spec: &str) -> Result<Self, AgentError> {
        let mut simulated = Self::new(Vec::new());
        for (gpu, available) in parse_simulated_gpus(spec)? {
            match available {
                true => simulated.gpus.push(gpu),
                false => simulated.unavailable.push(pb::UnavailableGpu {
                    index: gpu.index,
                    reason: format!(
                        "simulated: {} marked `!` in --simulate-gpus, as a GPU that another \
                         process holds",
                        gpu.name
                    ),
                }),
            }
        }
        Ok(simulated)
    }
}

impl GpuProbe for SimulatedGpus {
    fn gpus(&self) -> Vec<pb::GpuInfo> {
        self.gpus.clone()
    }

    fn simulated(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Vec<pb::UnavailableGpu> {
        self.unavailable.clone()
    }
}

/// Compute capability of well-known GPU names; 8.0 otherwise.
fn known_compute(name: &str) -> (u32, u32) {
    let name = name.to_ascii_uppercase();
    let table: [(&str, (u32, u32)); 12] = [
        ("H200", (9, 0)),
        ("H100", (9, 0)),
        ("B200", (10, 0)),
        ("L40", (8, 9)),
        ("L4", (8, 9)),
        ("A6000", (8, 6)),
        ("A10G", (8, 6)),
        ("A10", (8, 6)),
        ("A100", (8, 0)),
        ("T4", (7, 5)),
        ("V100", (7, 0)),
        ("4090", (8, 9)),
    ];
    table
        .iter()
        .find(|(key, _)| name.contains(key))
        .map_or((8, 0), |(_, cc)| *cc)
}

/// Parses `[!]NAME:SIZE[@MAJOR.MINOR] [xCOUNT]`, several comma-separated: each GPU, and
/// whether it is available (a leading `!` makes it one the host has and cannot open). GPUs
/// are numbered in order, unavailable ones included, as CUDA numbers a host's GPUs.
fn parse_simulated_gpus(spec: &str) -> Result<Vec<(pb::GpuInfo, bool)>, AgentError> {
    let fail = |reason: String| AgentError::GpuSpec {
        spec: spec.to_owned(),
        reason,
    };
    let mut gpus = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (available, part) = match part.strip_prefix('!') {
            Some(rest) => (false, rest.trim()),
            None => (true, part),
        };
        let (model, count) = match part.rsplit_once(|c: char| c.is_whitespace()) {
            Some((model, count)) if count.starts_with(['x', 'X']) => {
                let count: u32 = count[1..]
                    .parse()
                    .map_err(|_| fail(format!("`{count}` is not a count like x8")))?;
                (model.trim(), count)
            }
            _ => (part, 1),
        };
        let (name, size) = model
            .split_once(':')
            .ok_or_else(|| fail(format!("`{model}` needs NAME:SIZE, e.g. A6000:48GiB")))?;
        let (size, compute) = match size.split_once('@') {
            Some((size, cc)) => {
                let (major, minor) = cc
                    .split_once('.')
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                    .ok_or_else(|| fail(format!("`{cc}` is not a compute capability like 8.6")))?;
                (size, (major, minor))
            }
            None => (size, known_compute(name)),
        };
        let vram: VramBytes = size.parse().map_err(fail)?;
        if name.trim().is_empty() || vram.0 == 0 || count == 0 {
            return Err(fail(format!(
                "`{part}` needs a name, a size and a count above zero"
            )));
        }
        for _ in 0..count {
            let index = gpus.len() as u32;
            let gpu = pb::GpuInfo {
                index,
                uuid: format!("SIM-{}-{index}", name.trim()),
                name: name.trim().to_owned(),
                total_vram_bytes: vram.0,
                free_vram_bytes: vram.0,
                compute_major: compute.0,
                compute_minor: compute.1,
                simulated: true,
                utilization_ratio: None,
            };
            gpus.push((gpu, available));
        }
    }
    if gpus.is_empty() {
        return Err(fail("no GPUs listed".into()));
    }
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_marked_with_a_bang_is_unavailable_and_keeps_its_index() {
        let simulated = SimulatedGpus::parse("A10G:24GiB, !T4:16GiB, L4:24GiB").unwrap();
        let offered: Vec<u32> = simulated.gpus().iter().map(|g| g.index).collect();
        assert_eq!(offered, [0, 2]);
        let unavailable = simulated.unavailable();
        assert_eq!(unavailable.len(), 1);
        assert_eq!(unavailable[0].index, 1);
        assert!(unavailable[0].reason.contains("T4"), "{unavailable:?}");
    }

    #[test]
    fn parses_counts_sizes_and_compute() {
        let gpus: Vec<pb::GpuInfo> = parse_simulated_gpus("A6000:48GiB x8, T4:16GiB x4,H100:80GiB")
            .unwrap()
            .into_iter()
            .map(|(gpu, available)| {
                assert!(available);
                gpu
            })
            .collect();
        assert_eq!(gpus.len(), 13);
        assert_eq!(gpus[0].total_vram_bytes, 48 << 30);
        assert_eq!((gpus[0].compute_major, gpus[0].compute_minor), (8, 6));
        assert_eq!(gpus[8].name, "T4");
        assert_eq!((gpus[12].compute_major, gpus[12].index), (9, 12));
        let custom = parse_simulated_gpus("X1:10GiB@7.2 x2").unwrap();
        assert_eq!(
            (custom[1].0.compute_major, custom[1].0.compute_minor),
            (7, 2)
        );
    }

    #[test]
    fn rejects_bad_specs_with_the_reason() {
        let error = parse_simulated_gpus("A6000 x8").unwrap_err().to_string();
        assert!(error.contains("needs NAME:SIZE"), "{error}");
        assert!(parse_simulated_gpus("A6000:lots").is_err());
        assert!(parse_simulated_gpus("A6000:48GiB xmany").is_err());
        assert!(parse_simulated_gpus("").is_err());
    }
}
