//! `--ca` and `--token`: how every command that talks to a cluster proves itself.

use std::path::PathBuf;

use clap::Args;
use resident_sdk::{ClientCredentials, Cluster};

#[derive(Args, Clone, Debug, Default)]
pub struct CredentialArgs {
    /// CA certificate (PEM) that signed the scheduler's certificate, for https:// URLs
    /// (`resident certs init` writes ca.pem). Without it the system's roots are trusted.
    #[arg(long, env = "RESIDENT_CA")]
    pub ca: Option<PathBuf>,
    /// Token for a cluster with auth on (`resident token create` prints one).
    #[arg(long, env = "RESIDENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Send the token over plaintext http:// to a scheduler that is not on loopback (a
    /// network you trust); refused otherwise, since anyone on the path could read it.
    #[arg(long, env = "RESIDENT_INSECURE")]
    pub insecure: bool,
}

impl CredentialArgs {
    pub fn credentials(&self) -> anyhow::Result<ClientCredentials> {
        Ok(resident_node_agent::command::client_credentials(
            self.ca.as_deref(),
            self.token.clone(),
        )?
        .allow_token_over_plaintext(self.insecure))
    }

    /// Connects to the cluster at `url` with these credentials.
    pub async fn connect(&self, url: &str) -> anyhow::Result<Cluster> {
        Ok(Cluster::connect_with(url, self.credentials()?).await?)
    }
}

/// `--reconnect-timeout`: how a long job rides through a scheduler restart.
#[derive(Args, Clone, Debug)]
pub struct ReconnectArgs {
    /// How long the job waits for a scheduler that went away (a restart, a network cut)
    /// before it exits; within it the job resumes where it was. `90s`, `10m`, `1h`.
    #[arg(long, env = "RESIDENT_RECONNECT_TIMEOUT", default_value = "10m", value_parser = humantime::parse_duration)]
    pub reconnect_timeout: std::time::Duration,
}
