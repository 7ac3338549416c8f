use cudaforge::{KernelBuilder, Result};
use std::env;
use std::path::PathBuf;

mod fatbins;

const CUTILE_FEATURE: &str = "CARGO_FEATURE_CUTILE";
/// `stub`: link `src/moe_stub.c` in place of the static MoE library (a type check, which
/// links nothing, and a build for scripts/cuda-emu, which cannot run the library).
const MOE_VAR: &str = "RESIDENT_CANDLE_MOE";
/// The static MoE/GGUF library's name (`lib<name>.a` in OUT_DIR), and its stub's: never the
/// same file (see `main`).
const MOE_LIBRARY: &str = "candle_moe";
const MOE_STUB_LIBRARY: &str = "candle_moe_stub";

fn main() -> Result<()> {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-changed=src/compatibility.cuh");
    println!("cargo::rerun-if-changed=src/cuda_utils.cuh");
    println!("cargo::rerun-if-changed=src/binary_op_macros.cuh");

    // Resident's patch (vendor/README.md): every kernel module as a fatbin, SASS for each
    // compute capability in RESIDENT_CUDA_ARCHS (default 7.5, 8.0, 8.6, 8.9, 9.0) plus PTX
    // of the newest for later GPUs, instead of PTX for one capability: a GPU loads its SASS
    // without the driver's JIT compile (16-20 s on a fresh host), and one binary serves a
    // T4, an A10G, an A6000 and an H100 alike.
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    fatbins::build(&out_dir);

    // Resident's patch: the static MoE/GGUF library (15 heavily templated modules, about
    // 700 s of one-threaded nvcc on a CI core) is only linked, never type-checked against.
    // `stub` links functions of the same names that abort instead: `scripts/build-cuda.sh
    // --check` (CI's type check, which links nothing) and builds whose binaries run on
    // scripts/cuda-emu (kernels on the CPU, which cannot run the library) set it. The two
    // share this script's run, and so its kernels, in one target directory.
    println!("cargo::rerun-if-env-changed={MOE_VAR}");
    if env::var(MOE_VAR).as_deref() == Ok("stub") {
        build_stub(&out_dir);
        return Ok(());
    }

    let mut moe_sources = vec![
        "src/moe/moe_gguf.cu",
        "src/moe/moe_wmma.cu",
        "src/moe/moe_wmma_gguf.cu",
        "src/mmvq_gguf.cu",
        "src/mmq_gguf/mmq_quantize.cu",
        "src/mmq_gguf/mmq_instance_q4_0.cu",
        "src/mmq_gguf/mmq_instance_q4_1.cu",
        "src/mmq_gguf/mmq_instance_q5_0.cu",
        "src/mmq_gguf/mmq_instance_q5_1.cu",
        "src/mmq_gguf/mmq_instance_q8_0.cu",
        "src/mmq_gguf/mmq_instance_q2_k.cu",
        "src/mmq_gguf/mmq_instance_q3_k.cu",
        "src/mmq_gguf/mmq_instance_q4_k.cu",
        "src/mmq_gguf/mmq_instance_q5_k.cu",
        "src/mmq_gguf/mmq_instance_q6_k.cu",
    ];
    if env::var_os(CUTILE_FEATURE).is_some() {
        moe_sources.push("src/moe/moe_align.cu");
    }

    // Resident's patch: the library is built for the compute capabilities of every other
    // module (RESIDENT_CUDA_ARCHS, fatbins.rs), SASS for each and PTX of the newest, instead
    // of the one that CUDA_COMPUTE_CAP or nvidia-smi names (a Docker build has neither, and
    // failed here): a GGUF kept quantised on the GPU then runs on every GPU of a mixed fleet.
    let archs = fatbins::archs();
    let mut moe_builder = KernelBuilder::default()
        .compute_cap(archs[0] as usize)
        .args(fatbins::library_gencode_args(&archs))
        .source_files(moe_sources)
        .arg("--expt-relaxed-constexpr")
        .arg("-std=c++17")
        .arg("-O3");

    // Disable bf16 WMMA kernels on GPUs older than sm_80 (Ampere).
    // bf16 WMMA fragments require compute capability >= 8.0.
    // Resident's patch: one compile serves every arch, so a list that reaches below 8.0
    // leaves the bf16 MoE WMMA kernels out of all of them (Resident runs no MoE model).
    if archs[0] < 80 {
        moe_builder = moe_builder.arg("-DNO_BF16_KERNEL");
    }

    let mut is_target_msvc = false;
    if let Ok(target) = std::env::var("TARGET") {
        if target.contains("msvc") {
            is_target_msvc = true;
            moe_builder = moe_builder.arg("-D_USE_MATH_DEFINES");
        }
    }

    if !is_target_msvc {
        moe_builder = moe_builder.arg("-Xcompiler").arg("-fPIC");
    }

    // Resident's patch: the library and the stub (below) have names of their own. cudaforge
    // skips a build whose objects are current when the library's file exists; upstream's
    // `libmoe.a`, which the stub once overwrote in the same OUT_DIR, made a real build after
    // a stub build link the stub (a GPU binary whose quantised matmuls aborted).
    moe_builder.build_lib(out_dir.join(format!("lib{MOE_LIBRARY}.a")))?;
    println!("cargo:rustc-link-search={}", out_dir.display());
    println!("cargo:rustc-link-lib={MOE_LIBRARY}");
    println!("cargo:rustc-link-lib=dylib=cudart");
    if !is_target_msvc {
        println!("cargo:rustc-link-lib=stdc++");
    }
    Ok(())
}

/// `src/moe_stub.c` as `OUT_DIR/lib{MOE_STUB_LIBRARY}.a`, with the system C compiler.
fn build_stub(out_dir: &std::path::Path) {
    use std::process::Command;
    let object = out_dir.join("moe_stub.o");
    let library = out_dir.join(format!("lib{MOE_STUB_LIBRARY}.a"));
    let _ = std::fs::remove_file(&library);
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let compiled = Command::new(&compiler)
        .args(["-c", "-fPIC", "-O1", "src/moe_stub.c", "-o"])
        .arg(&object)
        .status()
        .expect("cannot run the C compiler for src/moe_stub.c");
    assert!(compiled.success(), "{compiler} failed on src/moe_stub.c");
    let archived = Command::new("ar")
        .arg("crs")
        .arg(&library)
        .arg(&object)
        .status()
        .expect("cannot run ar for the MoE stub");
    assert!(archived.success(), "ar failed on the MoE stub");
    println!("cargo:rustc-link-search={}", out_dir.display());
    println!("cargo:rustc-link-lib=static={MOE_STUB_LIBRARY}");
}
