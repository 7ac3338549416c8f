//! `resident health`: the one-word answer of a scheduler's or agent's `grpc.health.v1`
//! port, for Docker's HEALTHCHECK, systemd and scripts; and serving that port.

use std::time::Duration;

use clap::Args;
use resident_proto::health::{ServingStatus, check_health};

#[derive(Args)]
pub struct HealthArgs {
    /// The health port to ask (`host:port`). Default: the port this container or host
    /// serves, from RESIDENT_HEALTH_LISTEN (0.0.0.0 is asked on 127.0.0.1).
    #[arg(long, env = "RESIDENT_HEALTH_LISTEN")]
    addr: String,
    /// The service to ask about: empty for the process, `resident.v1.SchedulerService`
    /// (the scheduler's core runs) or `resident.v1.NodeAgentService` (the agent is
    /// registered with a scheduler).
    #[arg(long, env = "RESIDENT_HEALTH_SERVICE", default_value = "")]
    service: String,
    /// Give up after this long.
    #[arg(long, env = "RESIDENT_HEALTH_TIMEOUT", default_value = "3s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// The address to dial for a listen address: a wildcard host is asked on loopback.
fn dial_addr(listen: &str) -> String {
    for wildcard in ["0.0.0.0:", "[::]:"] {
        if let Some(port) = listen.strip_prefix(wildcard) {
            return format!("127.0.0.1:{port}");
        }
    }
    listen.to_owned()
}

pub async fn run(args: HealthArgs) -> anyhow::Result<()> {
    let addr = dial_addr(&args.addr);
    let status = check_health(&addr, &args.service, args.timeout)
        .await
        .map_err(anyhow::Error::msg)?;
    let what = if args.service.is_empty() {
        "the process"
    } else {
        &args.service
    };
    match status {
        ServingStatus::Serving => {
            println!("SERVING");
            Ok(())
        }
        other => anyhow::bail!("{what} at {addr} is {other:?}"),
    }
}

pub use resident_node_agent::command::serve_health_on;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listen_address_is_asked_on_loopback() {
        assert_eq!(dial_addr("0.0.0.0:8081"), "127.0.0.1:8081");
        assert_eq!(dial_addr("[::]:8081"), "127.0.0.1:8081");
        assert_eq!(dial_addr("10.0.0.5:8081"), "10.0.0.5:8081");
    }
}
