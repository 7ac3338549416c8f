fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=resident/v1/resident.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    // A system protoc (PROTOC set) wins; otherwise the vendored one, so a fresh machine builds.
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_prost_build::configure()
        .bytes(".")
        .compile_with_config(config, &["resident/v1/resident.proto"], &["."])?;
    Ok(())
}
