//! Compiles `src/embed/fused_kernels.cu` when the `cuda` feature is on.
//!
//! The output is a fatbin: SASS for every compute capability we ship to (7.5 T4, 8.0 A100,
//! 8.6 A6000/A10G, 8.9 L4, 9.0 H100/H200), plus PTX of the newest one for GPUs that came
//! later. A GPU we built SASS for loads the module without the driver's JIT compile.
//! `RESIDENT_CUDA_ARCHS` (e.g. `86` or `75,90`) narrows or widens the list; the last one also
//! gets PTX.
//!
//! Written by hand rather than with a kernel-builder crate: it is one nvcc call, and the crates
//! we looked at (cudaforge, bindgen_cuda) build PTX or static libraries for one capability,
//! not a multi-capability fatbin.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const KERNELS: &str = "src/embed/fused_kernels.cu";
/// Included by `KERNELS`.
const FLASH_ATTENTION: &str = "src/embed/flash_attention.cuh";
/// Included by `KERNELS`.
const PAGED_ATTENTION_MMA: &str = "src/embed/paged_attention_mma.cuh";
const DEFAULT_ARCHS: &str = "75,80,86,89,90";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed={KERNELS}");
    println!("cargo::rerun-if-changed={FLASH_ATTENTION}");
    println!("cargo::rerun-if-changed={PAGED_ATTENTION_MMA}");
    for var in [
        "RESIDENT_CUDA_ARCHS",
        "CUDA_HOME",
        "CUDA_PATH",
        "NVCC",
        "NVCC_CCBIN",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let fatbin = out_dir.join("fused_kernels.fatbin");
    let archs = env::var("RESIDENT_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_string());
    let archs = parse_archs(&archs).unwrap_or_else(|message| fail(&message));
    let nvcc = nvcc_path();

    let mut command = Command::new(&nvcc);
    command.args(["--fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr"]);
    command.args(gencode_args(&archs));
    if let Ok(ccbin) = env::var("NVCC_CCBIN") {
        command.args(["-allow-unsupported-compiler", "-ccbin", &ccbin]);
    }
    command.arg("-o").arg(&fatbin).arg(KERNELS);
    let output = command.output().unwrap_or_else(|error| {
        fail(&format!(
            "could not run nvcc ({}): {error}; the cuda feature needs the CUDA toolkit at build \
             time: run scripts/build-cuda.sh, or set CUDA_HOME (or NVCC) to a CUDA 13 install",
            nvcc.display()
        ))
    });
    if !output.status.success() {
        fail(&format!(
            "nvcc failed on {KERNELS} ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
}

/// Compute capabilities as numbers (`"75, 86"` → `[75, 86]`), sorted, without repeats.
fn parse_archs(list: &str) -> Result<Vec<u32>, String> {
    let mut archs = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.parse::<u32>()
                .ok()
                .filter(|n| (50..=200).contains(n))
                .ok_or_else(|| {
                    format!(
                        "RESIDENT_CUDA_ARCHS holds {a:?}: give compute capabilities as numbers \
                         such as 75,80,86,89,90"
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    archs.sort_unstable();
    archs.dedup();
    if archs.is_empty() {
        return Err("RESIDENT_CUDA_ARCHS is empty: name at least one compute capability".into());
    }
    Ok(archs)
}

/// SASS for each capability; the newest also as PTX, for GPUs newer than all of them.
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

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}
