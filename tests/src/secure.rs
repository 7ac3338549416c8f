//! A cluster with TLS and tokens on, made with the real `resident certs` and `resident token`
//! commands.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use resident_sdk::{ClientCredentials, Cluster, SdkError};

use crate::{Proc, resident_bin, spawn_agent_with, spawn_scheduler_with};

/// Certificates, an auth file and the tokens created in it, in a temporary directory.
pub struct SecureSetup {
    /// The directory holding everything.
    pub dir: tempfile::TempDir,
    /// Each token created, by name.
    pub tokens: BTreeMap<String, String>,
}

/// Runs `resident ARGS`, asserting success; returns stdout.
pub fn resident(args: &[&std::ffi::OsStr]) -> String {
    let output = Command::new(resident_bin())
        .args(args)
        .output()
        .expect("run resident");
    assert!(
        output.status.success(),
        "resident {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

impl SecureSetup {
    /// `resident certs init --san 127.0.0.1` and one token per `(name, role)`.
    pub fn new(tokens: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        resident(&[
            "certs".as_ref(),
            "init".as_ref(),
            "--out".as_ref(),
            dir.path().join("pki").as_os_str(),
            "--san".as_ref(),
            "127.0.0.1".as_ref(),
        ]);
        let mut setup = Self {
            dir,
            tokens: BTreeMap::new(),
        };
        for (name, role) in tokens {
            setup.create_token(name, role);
        }
        setup
    }

    /// What `resident certs init` wrote.
    pub fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// The CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.pki().join("ca.pem")
    }

    /// `resident certs agent`: the client certificate and key for `node_id`.
    pub fn agent_certificate(&self, node_id: &str) -> (PathBuf, PathBuf) {
        resident(&[
            "certs".as_ref(),
            "agent".as_ref(),
            "--pki".as_ref(),
            self.pki().as_os_str(),
            "--node-id".as_ref(),
            node_id.as_ref(),
        ]);
        let agents = self.pki().join("agents");
        (
            agents.join(format!("{node_id}.pem")),
            agents.join(format!("{node_id}-key.pem")),
        )
    }

    /// The auth file.
    pub fn auth_file(&self) -> PathBuf {
        self.dir.path().join("auth.toml")
    }

    /// `resident token create`; the token is the last line of its stdout.
    pub fn create_token(&mut self, name: &str, role: &str) -> String {
        let stdout = resident(&[
            "token".as_ref(),
            "create".as_ref(),
            "--auth-file".as_ref(),
            self.auth_file().as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
            "--role".as_ref(),
            role.as_ref(),
        ]);
        let token = stdout.lines().last().expect("a token line").to_owned();
        self.tokens.insert(name.to_owned(), token.clone());
        token
    }

    /// `resident token revoke` of the token `name`.
    pub fn revoke(&self, name: &str) {
        resident(&[
            "token".as_ref(),
            "revoke".as_ref(),
            "--auth-file".as_ref(),
            self.auth_file().as_os_str(),
            "--name".as_ref(),
            name.as_ref(),
        ]);
    }

    /// The token created as `name`.
    pub fn token(&self, name: &str) -> &str {
        &self.tokens[name]
    }

    /// A TLS scheduler with the auth file, on a loopback port.
    pub fn spawn_scheduler(&self) -> (Proc, String) {
        self.spawn_scheduler_with(&[])
    }

    /// [`Self::spawn_scheduler`] with more arguments (`--agent-ca`).
    pub fn spawn_scheduler_with(&self, extra: &[OsString]) -> (Proc, String) {
        let pki = self.pki();
        let mut args: Vec<OsString> = vec![
            "--tls-cert".into(),
            pki.join("scheduler.pem").into(),
            "--tls-key".into(),
            pki.join("scheduler-key.pem").into(),
            "--auth-file".into(),
            self.auth_file().into(),
        ];
        args.extend(extra.iter().cloned());
        spawn_scheduler_with(0, &self.dir.path().join("state"), &args)
    }

    /// `resident agent` dialling `url` with this CA, the named token (none: no token) and
    /// `extra` arguments, its log going to `stderr`.
    pub fn spawn_agent(
        &self,
        url: &str,
        node_id: &str,
        gpus: &str,
        token_name: Option<&str>,
        extra: &[OsString],
        stderr: Stdio,
    ) -> Proc {
        let mut args: Vec<OsString> = vec!["--ca".into(), self.ca().into()];
        if let Some(name) = token_name {
            args.extend(["--token".into(), self.token(name).into()]);
        }
        args.extend(extra.iter().cloned());
        spawn_agent_with(url, node_id, gpus, "", &args, stderr)
    }

    /// Client credentials trusting the CA, with `token`.
    pub fn credentials(&self, token: Option<&str>) -> ClientCredentials {
        ClientCredentials::default()
            .with_ca_file(&self.ca())
            .expect("ca.pem")
            .with_token(token.map(str::to_owned))
    }

    /// Connects as the named token's holder.
    pub async fn connect_as(&self, url: &str, name: &str) -> Result<Cluster, SdkError> {
        Cluster::connect_with(url, self.credentials(Some(self.token(name)))).await
    }
}

/// A path's text, or empty.
pub fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
