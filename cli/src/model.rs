//! `resident model`: put a model where every agent can fetch it.
//!
//! `push` uploads a model directory to an S3 prefix and writes `resident-model.json` (every
//! file's size and SHA-256) after the files, so agents never see a half-uploaded model as
//! complete. `manifest` prints a directory's manifest and content digest, the fingerprint a
//! job records for that model wherever it is stored.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use resident_storage::model_manifest::{MANIFEST_FILE, ModelManifest};
use resident_storage::{Location, S3Client, S3Options, key_under};

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Upload a model directory to `s3://bucket/prefix/`, manifest last.
    Push(PushArgs),
    /// Print a model directory's manifest (`resident-model.json`) and its content digest.
    Manifest(ManifestArgs),
}

#[derive(Args)]
pub struct PushArgs {
    /// The model directory (config.json, tokenizer.json, *.safetensors, ...).
    dir: PathBuf,
    /// Where to put it: `s3://bucket/prefix/`.
    destination: String,
    /// An S3-compatible endpoint (MinIO, Ceph), addressed path-style; default AWS.
    /// Credentials come from the standard AWS chain.
    #[arg(long, env = "RESIDENT_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
}

#[derive(Args)]
pub struct ManifestArgs {
    /// The model directory.
    dir: PathBuf,
}

pub async fn run(command: ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Push(args) => push(args).await,
        ModelCommand::Manifest(args) => {
            let manifest = manifest_of(&args.dir).await?;
            println!("{}", String::from_utf8_lossy(&manifest.to_json()));
            eprintln!("content digest: {}", manifest.digest());
            Ok(())
        }
    }
}

async fn manifest_of(dir: &Path) -> anyhow::Result<ModelManifest> {
    anyhow::ensure!(
        dir.join("config.json").is_file(),
        "{} has no config.json: pass the model's own directory",
        dir.display()
    );
    let owned = dir.to_owned();
    tokio::task::spawn_blocking(move || ModelManifest::of_dir(&owned))
        .await?
        .with_context(|| format!("model {}", dir.display()))
}

async fn push(args: PushArgs) -> anyhow::Result<()> {
    let Location::S3 { bucket, prefix } =
        Location::parse(&args.destination).map_err(anyhow::Error::msg)?
    else {
        anyhow::bail!(
            "{} is not an S3 location: give s3://bucket/prefix/",
            args.destination
        );
    };
    let manifest = manifest_of(&args.dir).await?;
    let client = S3Client::connect(&S3Options {
        endpoint: args.s3_endpoint.clone(),
        ..S3Options::default()
    })
    .await;
    let manifest_key = key_under(&prefix, MANIFEST_FILE);
    // A model being replaced is incomplete until its new manifest lands.
    client
        .delete(&bucket, &manifest_key)
        .await
        .map_err(anyhow::Error::msg)?;
    for file in &manifest.files {
        let key = key_under(&prefix, &file.path);
        client
            .upload_file(&bucket, &key, &args.dir.join(&file.path))
            .await
            .map_err(anyhow::Error::msg)?;
    }
    client
        .put(&bucket, &manifest_key, manifest.to_json())
        .await
        .map_err(anyhow::Error::msg)?;
    println!(
        "pushed {} to s3://{bucket}/{prefix}/: {} files, {} bytes; content digest {}",
        args.dir.display(),
        manifest.files.len(),
        manifest.total_bytes(),
        manifest.digest()
    );
    Ok(())
}
