//! `resident token`: add, revoke and list the tokens of a scheduler's auth file. The
//! scheduler re-reads the file when it changes (or on SIGHUP): no restart needed.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use resident_scheduler::auth::{AuthFile, Role};

#[derive(Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Args)]
struct AuthFileArg {
    /// The scheduler's auth file (created when missing); it holds only hashes of tokens.
    #[arg(long, env = "RESIDENT_AUTH_FILE")]
    auth_file: PathBuf,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it once (alone, on the last line of stdout).
    Create {
        #[command(flatten)]
        file: AuthFileArg,
        /// Who holds it: a person, a service, or a node (audit logs name it).
        #[arg(long, env = "RESIDENT_TOKEN_NAME")]
        name: String,
        /// admin (everything), submit (pools and own jobs), read (status), agent (join as a node).
        #[arg(long, env = "RESIDENT_TOKEN_ROLE")]
        role: Role,
    },
    /// Revoke a token by name; calls with it are refused from the scheduler's next reload.
    Revoke {
        #[command(flatten)]
        file: AuthFileArg,
        /// The name the token was created with; it stops working at once on a scheduler
        /// that watches the file.
        #[arg(long, env = "RESIDENT_TOKEN_NAME")]
        name: String,
    },
    /// List the tokens' names, roles and creation times (never the tokens).
    List {
        #[command(flatten)]
        file: AuthFileArg,
    },
}

pub fn run(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Create { file, name, role } => {
            let token = AuthFile::edit(&file.auth_file, true, |auth| auth.create(&name, role))?;
            println!(
                "created token `{name}` with role {role} in {}; it is shown only now:",
                file.auth_file.display()
            );
            println!("{token}");
        }
        TokenCommand::Revoke { file, name } => {
            let revoked = AuthFile::edit(&file.auth_file, false, |auth| auth.revoke(&name))?;
            println!(
                "revoked token `{}` (role {}); the scheduler refuses it once it re-reads {}",
                revoked.name,
                revoked.role,
                file.auth_file.display()
            );
        }
        TokenCommand::List { file } => {
            let auth = AuthFile::load(&file.auth_file, false)?;
            println!("{:<24} {:<8} CREATED (unix)", "NAME", "ROLE");
            for entry in &auth.tokens {
                println!(
                    "{:<24} {:<8} {}",
                    entry.name, entry.role, entry.created_unix
                );
            }
        }
    }
    Ok(())
}
