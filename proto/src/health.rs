//! The standard `grpc.health.v1` service, for Kubernetes' gRPC probes, Docker's health
//! check and `resident health`. The scheduler serves it on its API port (TLS when that is
//! TLS) and, like the agent, on an optional plaintext health port: kubelet's gRPC probes
//! speak no TLS, and a health answer reveals nothing.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
pub use tonic_health::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::HealthServer;
pub use tonic_health::server::HealthReporter;
use tonic_health::server::HealthService;

/// The service name a scheduler reports: SERVING while its core runs.
pub const SCHEDULER_HEALTH_SERVICE: &str = "resident.v1.SchedulerService";
/// The service name an agent reports: SERVING while it is registered with a scheduler.
pub const AGENT_HEALTH_SERVICE: &str = "resident.v1.NodeAgentService";

/// The gRPC service answering from `reporter`'s statuses.
pub fn health_service(reporter: &HealthReporter) -> HealthServer<HealthService> {
    HealthServer::new(HealthService::from_health_reporter(reporter.clone()))
}

/// Serves only the health service on `listener`, in plaintext, until `cancel` fires.
pub fn serve_health_port(
    listener: TcpListener,
    reporter: HealthReporter,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let addr = listener.local_addr().ok();
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(health_service(&reporter))
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(listener),
                cancel.cancelled_owned(),
            )
            .await;
        if let Err(error) = served {
            tracing::error!(?addr, %error, "health port stopped");
        }
    })
}

/// Sets a service's status; the reporter's lock is async, the callers are not.
pub fn set_health(reporter: &HealthReporter, service: &str, status: ServingStatus) {
    let reporter = reporter.clone();
    let service = service.to_owned();
    tokio::spawn(async move { reporter.set_service_status(service, status).await });
}

/// Asks the plaintext health port at `addr` (`host:port`) how `service` is (`""`: the
/// process as a whole).
pub async fn check_health(
    addr: &str,
    service: &str,
    timeout: Duration,
) -> Result<ServingStatus, HealthCheckError> {
    let url = format!("http://{addr}");
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone()).map_err(|reason| {
        HealthCheckError::BadAddress {
            addr: addr.to_owned(),
            reason,
        }
    })?;
    check_service(&endpoint, service, timeout)
        .await
        .map_err(|failed| HealthCheckError::At {
            url,
            failed: Box::new(failed),
        })
}

/// Why a health check got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HealthCheckError {
    /// The address is not a `host:port`.
    #[error("`{addr}` is not a host:port: {reason}")]
    BadAddress {
        /// The address given.
        addr: String,
        /// tonic's reason.
        reason: tonic::transport::Error,
    },
    /// No connection to the health service.
    #[error("cannot reach the health service: {0}")]
    Unreachable(tonic::transport::Error),
    /// The service answered the check with an error.
    #[error("health check of `{service}`: {}", .status.message())]
    Refused {
        /// The service asked about.
        service: String,
        /// The error status.
        status: tonic::Status,
    },
    /// No answer in time.
    #[error("no health answer within {0:?}")]
    TimedOut(Duration),
    /// A failure of [`check_service`], with the URL that was asked.
    #[error("{failed} ({url})")]
    At {
        /// The health port's URL.
        url: String,
        /// What failed.
        failed: Box<HealthCheckError>,
    },
}

/// Asks the health service behind `endpoint` (with its TLS, if any) how `service` is, on a
/// fresh connection, all within `timeout`.
pub async fn check_service(
    endpoint: &tonic::transport::Endpoint,
    service: &str,
    timeout: Duration,
) -> Result<ServingStatus, HealthCheckError> {
    let check = async {
        let channel = endpoint
            .connect()
            .await
            .map_err(HealthCheckError::Unreachable)?;
        HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .map_err(|status| HealthCheckError::Refused {
                service: service.to_owned(),
                status,
            })
    };
    let response = tokio::time::timeout(timeout, check)
        .await
        .map_err(|_| HealthCheckError::TimedOut(timeout))??;
    Ok(match response.into_inner().status {
        1 => ServingStatus::Serving,
        2 => ServingStatus::NotServing,
        _ => ServingStatus::Unknown,
    })
}
