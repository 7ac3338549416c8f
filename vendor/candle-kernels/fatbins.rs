//! Resident's patch of candle-kernels (see vendor/README.md in the Resident repository):
//! each `src/*.cu` module compiled by nvcc into a fatbin holding SASS for every compute
//! capability of `RESIDENT_CUDA_ARCHS` (default 7.5, 8.0, 8.6, 8.9, 9.0) and PTX of the
//! newest, and `OUT_DIR/ptx.rs` naming each as `pub const NAME: &[u8]`. The modules build
//! in parallel, one nvcc per module.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "75,80,86,89,90";
/// Compiled into the static MoE library instead (upstream's exclusions).
const STATIC_ONLY: [&str; 3] = ["moe_", "mmvq_gguf", "mmq_"];

pub fn build(out_dir: &Path) {
    for var in ["RESIDENT_CUDA_ARCHS", "CUDA_HOME", "CUDA_PATH", "NVCC", "NVCC_CCBIN"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let archs = archs();
    let mut modules: Vec<PathBuf> = std::fs::read_dir("src")
        .expect("candle-kernels/src")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "cu"))
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !STATIC_ONLY.iter().any(|prefix| name.starts_with(prefix))
        })
        .collect();
    modules.sort();
    let nvcc = nvcc_path();
    std::thread::scope(|scope| {
        for module in &modules {
            let (nvcc, archs) = (&nvcc, &archs);
            scope.spawn(move || compile(nvcc, archs, module, out_dir));
        }
    });
    let consts: String = modules
        .iter()
        .map(|module| {
            let stem = module.file_stem().and_then(|s| s.to_str()).expect("a .cu name");
            format!(
                "pub const {}: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{stem}.fatbin\"));\n",
                stem.to_uppercase().replace(['.', '-'], "_"),
            )
        })
        .collect();
    std::fs::write(out_dir.join("ptx.rs"), consts).expect("write ptx.rs");
}

fn compile(nvcc: &Path, archs: &[u32], module: &Path, out_dir: &Path) {
    let stem = module.file_stem().and_then(|s| s.to_str()).expect("a .cu name");
    let mut command = Command::new(nvcc);
    command.args(["--fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr"]);
    command.args(["--default-stream", "per-thread"]);
    command.args(gencode_args(archs));
    if let Ok(ccbin) = env::var("NVCC_CCBIN") {
        command.args(["-allow-unsupported-compiler", "-ccbin", &ccbin]);
    }
    command.arg("-o").arg(out_dir.join(format!("{stem}.fatbin"))).arg(module);
    let output = command.output().unwrap_or_else(|error| {
        panic!("could not run nvcc ({}): {error}; set CUDA_HOME or NVCC", nvcc.display())
    });
    if !output.status.success() {
        panic!(
            "nvcc failed on {} ({}):\n{}{}",
            module.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The compute capabilities to build for, oldest first: `RESIDENT_CUDA_ARCHS`, or the default
/// list.
pub fn archs() -> Vec<u32> {
    let archs = env::var("RESIDENT_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_owned());
    parse_archs(&archs)
}

/// The static MoE/GGUF library's `-gencode`s beside the one cudaforge's builder adds for its
/// compute capability, which build.rs sets to the oldest of `archs`: SASS for the others, and
/// PTX of the newest.
pub fn library_gencode_args(archs: &[u32]) -> Vec<String> {
    let newest = archs.last().expect("at least one arch");
    let sass = archs[1..]
        .iter()
        .map(|arch| format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
    sass.chain([format!("-gencode=arch=compute_{newest},code=compute_{newest}")])
        .collect()
}

fn parse_archs(list: &str) -> Vec<u32> {
    let mut archs: Vec<u32> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.trim_start_matches("sm_").replace('.', "").parse().unwrap_or_else(|_| {
                panic!("RESIDENT_CUDA_ARCHS holds {a:?}: give compute capabilities like 75,86,90")
            })
        })
        .collect();
    archs.sort_unstable();
    archs.dedup();
    assert!(!archs.is_empty(), "RESIDENT_CUDA_ARCHS is empty");
    archs
}

/// SASS for each capability, and PTX of the newest for GPUs that came after it.
fn gencode_args(archs: &[u32]) -> Vec<String> {
    let newest = archs.last().copied();
    archs
        .iter()
        .map(|&arch| {
            let code = if Some(arch) == newest {
                format!("[sm_{arch},compute_{arch}]")
            } else {
                format!("sm_{arch}")
            };
            format!("-gencode=arch=compute_{arch},code={code}")
        })
        .collect()
}

fn nvcc_path() -> PathBuf {
    if let Some(nvcc) = env::var_os("NVCC") {
        return nvcc.into();
    }
    for home in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(home) {
            let nvcc = PathBuf::from(home).join("bin").join("nvcc");
            if nvcc.exists() {
                return nvcc;
            }
        }
    }
    PathBuf::from("nvcc")
}
