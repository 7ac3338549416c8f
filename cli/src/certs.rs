//! `resident certs init`: writes a small private CA and the scheduler's certificate
//! ([`generate_scheduler_pki`]); keys readable by their owner only.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use resident_scheduler::auth::pki::{generate_scheduler_pki, issue_agent_cert};

#[derive(Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Write ca.pem, ca-key.pem, scheduler.pem and scheduler-key.pem into --out.
    Init {
        /// Directory to write into (created when missing).
        #[arg(long, env = "RESIDENT_PKI")]
        out: PathBuf,
        /// A DNS name or IP address agents and clients dial the scheduler by (repeatable;
        /// in the variable, comma-separated).
        #[arg(
            long = "san",
            env = "RESIDENT_CERT_SANS",
            value_delimiter = ',',
            required = true
        )]
        sans: Vec<String>,
        /// Days the scheduler's certificate is valid (the CA: ten times as long).
        #[arg(long, env = "RESIDENT_CERT_DAYS", default_value_t = 365)]
        days: u32,
        /// Overwrite files that exist.
        #[arg(long, env = "RESIDENT_CERT_FORCE")]
        force: bool,
    },
    /// Issue an agent's client certificate for mutual TLS (`--agent-ca` on the scheduler):
    /// writes NODE.pem and NODE-key.pem, signed by the CA in --pki, naming only the node id.
    Agent {
        /// The directory `certs init` wrote (its ca-key.pem signs).
        #[arg(long, env = "RESIDENT_PKI")]
        pki: PathBuf,
        /// The agent's --node-id.
        #[arg(long, env = "RESIDENT_NODE_ID")]
        node_id: String,
        /// Where to write (default: PKI/agents).
        #[arg(long, env = "RESIDENT_CERT_OUT")]
        out: Option<PathBuf>,
        /// Days the agent's certificate is valid.
        #[arg(long, env = "RESIDENT_CERT_DAYS", default_value_t = 365)]
        days: u32,
    },
}

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const SCHEDULER_CERT: &str = "scheduler.pem";
pub const SCHEDULER_KEY: &str = "scheduler-key.pem";

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init {
            out,
            sans,
            days,
            force,
        } => {
            let written = init(&out, &sans, days, force)?;
            for path in written {
                println!("wrote {}", path.display());
            }
            println!(
                "serve with: resident scheduler --tls-cert {} --tls-key {}; give agents and clients --ca {}",
                out.join(SCHEDULER_CERT).display(),
                out.join(SCHEDULER_KEY).display(),
                out.join(CA_CERT).display()
            );
        }
        CertsCommand::Agent {
            pki,
            node_id,
            out,
            days,
        } => {
            let ca_key = std::fs::read_to_string(pki.join(CA_KEY))
                .with_context(|| format!("reading the CA key {}", pki.join(CA_KEY).display()))?;
            let agent = issue_agent_cert(&ca_key, &node_id, days).map_err(anyhow::Error::msg)?;
            let out = out.unwrap_or_else(|| pki.join("agents"));
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let cert = out.join(format!("{node_id}.pem"));
            let key = out.join(format!("{node_id}-key.pem"));
            write_pem(&cert, &agent.cert_pem, false)?;
            write_pem(&key, &agent.key_pem, true)?;
            println!(
                "wrote {} and {}; run the agent with --node-id {node_id} --client-cert {} --client-key {}",
                cert.display(),
                key.display(),
                cert.display(),
                key.display()
            );
        }
    }
    Ok(())
}

/// Creates the CA and the scheduler's certificate; returns the files written.
pub fn init(out: &Path, sans: &[String], days: u32, force: bool) -> anyhow::Result<Vec<PathBuf>> {
    let names = [CA_CERT, CA_KEY, SCHEDULER_CERT, SCHEDULER_KEY];
    if !force {
        for name in names {
            let path = out.join(name);
            anyhow::ensure!(
                !path.exists(),
                "{} exists; pass --force to replace it (clients trusting the old CA must get the new ca.pem)",
                path.display()
            );
        }
    }
    let pki =
        generate_scheduler_pki(sans, days).map_err(|e| anyhow::anyhow!("--san/--days: {e}"))?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let files = [
        (CA_CERT, pki.ca_cert_pem, false),
        (CA_KEY, pki.ca_key_pem, true),
        (SCHEDULER_CERT, pki.cert_pem, false),
        (SCHEDULER_KEY, pki.key_pem, true),
    ];
    let mut written = Vec::new();
    for (name, pem, secret) in files {
        let path = out.join(name);
        write_pem(&path, &pem, secret)?;
        written.push(path);
    }
    Ok(written)
}

fn write_pem(path: &Path, pem: &str, secret: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if secret { 0o600 } else { 0o644 };
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_four_files_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let written = init(
            dir.path(),
            &["127.0.0.1".into(), "sched.example".into()],
            30,
            false,
        )
        .unwrap();
        assert_eq!(written.len(), 4);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(CA_KEY))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = init(dir.path(), &["127.0.0.1".into()], 30, false).unwrap_err();
        assert!(again.to_string().contains("--force"), "{again}");
        assert!(init(dir.path(), &["127.0.0.1".into()], 30, true).is_ok());
        assert!(init(dir.path(), &["bad name!".into()], 30, true).is_err());
    }
}
