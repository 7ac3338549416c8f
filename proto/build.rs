fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A system protoc (PROTOC set) wins; otherwise use the vendored one so a fresh machine builds.
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        unsafe_set_protoc(&protoc);
    }
    println!("cargo:rerun-if-changed=resident/v1/resident.proto");
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["resident/v1/resident.proto"], &["."])?;
    Ok(())
}

#[allow(unsafe_code)]
fn unsafe_set_protoc(path: &std::path::Path) {
    // SAFETY: build scripts run single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", path) };
}
