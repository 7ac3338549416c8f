//! Dialling the scheduler, shared by the SDK and the node agent: the URL alone decides TLS
//! (`https://` is always TLS, never a silent fallback to plaintext), and every call carries
//! the bearer token when one is given.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// gRPC metadata key of the bearer token (`authorization: Bearer <token>`).
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// A channel whose calls all carry the caller's token.
pub type AuthedChannel = InterceptedService<Channel, BearerToken>;

/// What a client or an agent proves itself with.
#[derive(Clone, Default)]
pub struct ClientCredentials {
    /// PEM of the CA that signed the scheduler's certificate; `None` trusts the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// The token the scheduler's auth file knows (`resident token create`).
    pub token: Option<String>,
    /// A client certificate and key (PEM) for mutual TLS (agents: `resident certs agent`).
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Send the token over plaintext `http://` to a host that is not loopback (`--insecure`):
    /// refused otherwise, since anyone on the path could read and replay it.
    pub token_over_plaintext: bool,
}

impl std::fmt::Debug for ClientCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCredentials")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<pem>"),
            )
            .field("token_over_plaintext", &self.token_over_plaintext)
            .finish()
    }
}

impl ClientCredentials {
    /// Reads the CA file; a missing or non-PEM file is a clear error.
    pub fn with_ca_file(mut self, path: &std::path::Path) -> Result<Self, ConnectError> {
        self.ca_pem = Some(read_pem(path, "BEGIN CERTIFICATE")?);
        Ok(self)
    }

    /// Reads a client certificate and its key (PEM) for mutual TLS.
    pub fn with_client_identity_files(
        mut self,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self, ConnectError> {
        self.client_identity = Some((
            read_pem(cert, "BEGIN CERTIFICATE")?,
            read_pem(key, "PRIVATE KEY")?,
        ));
        Ok(self)
    }

    /// Sets the token to present (an empty one is none).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.trim().is_empty());
        self
    }

    /// Allows the token over plaintext `http://` to hosts beyond loopback (`--insecure`,
    /// `RESIDENT_INSECURE`), for a network the operator trusts.
    pub fn allow_token_over_plaintext(mut self, allow: bool) -> Self {
        self.token_over_plaintext = allow;
        self
    }
}

/// Whether `host` (as a URL holds it) is this machine: `localhost`, `127.0.0.0/8`, `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A PEM file that holds `marker` (`BEGIN CERTIFICATE`, `PRIVATE KEY`), or why not.
fn read_pem(path: &std::path::Path, marker: &str) -> Result<Vec<u8>, ConnectError> {
    let failed = |reason: String| ConnectError::PemFile {
        path: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
    if String::from_utf8_lossy(&pem).contains(marker) {
        Ok(pem)
    } else {
        Err(failed(format!("it holds no PEM `{marker}`")))
    }
}

/// Why the scheduler cannot be dialled as asked; every message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse, or names no scheme the client speaks.
    #[error("invalid scheduler url `{url}`: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A CA or client certificate came with a plaintext URL.
    #[error(
        "a CA or client certificate was given but `{url}` is plaintext http://; use an https:// url to talk TLS"
    )]
    CaWithoutTls {
        /// The plaintext URL.
        url: String,
    },
    /// A certificate file cannot be read.
    #[error("cannot read the certificate file {path}: {reason}")]
    PemFile {
        /// The file.
        path: String,
        /// What the system or the PEM parser said.
        reason: String,
    },
    /// TLS could not be set up for the URL.
    #[error("cannot set up TLS for `{url}`: {source}")]
    Tls {
        /// The URL.
        url: String,
        /// What the transport said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The token cannot travel in a gRPC header.
    #[error("the token holds characters a gRPC header cannot carry; pass the token as printed")]
    BadToken,
    /// A token would cross a network in the clear.
    #[error(
        "refusing to send the token over plaintext `{url}`: `{host}` is not loopback, so anyone on the path could read and replay it; use an https:// url (the scheduler's --tls-cert, `resident certs init`), or pass --insecure (RESIDENT_INSECURE=1) on a network you trust"
    )]
    TokenOverPlaintext {
        /// The plaintext URL.
        url: String,
        /// Its host, not a loopback one.
        host: String,
    },
}

/// The endpoint for `url`: TLS for `https://` (against the given CA or the system roots),
/// plaintext for `http://`, anything else refused.
pub fn scheduler_endpoint(
    url: &str,
    credentials: &ClientCredentials,
) -> Result<Endpoint, ConnectError> {
    let bad_url = |reason: String| ConnectError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| bad_url(format!("{e}")))?;
    match endpoint.uri().scheme_str() {
        Some("https") => {
            let mut tls = match &credentials.ca_pem {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            if let Some((cert, key)) = &credentials.client_identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
            }
            endpoint
                .tls_config(tls)
                .map_err(|source| ConnectError::Tls {
                    url: url.to_owned(),
                    source,
                })
        }
        Some("http") if credentials.ca_pem.is_some() || credentials.client_identity.is_some() => {
            Err(ConnectError::CaWithoutTls {
                url: url.to_owned(),
            })
        }
        Some("http") => {
            let host = endpoint.uri().host().unwrap_or_default();
            if credentials.token.is_some()
                && !credentials.token_over_plaintext
                && !is_loopback_host(host)
            {
                return Err(ConnectError::TokenOverPlaintext {
                    url: url.to_owned(),
                    host: host.to_owned(),
                });
            }
            Ok(endpoint)
        }
        _ => Err(bad_url(
            "expected http://host:port (loopback, trusted networks) or https://host:port".into(),
        )),
    }
}

/// Adds `authorization: Bearer <token>` to every call (nothing when there is no token).
#[derive(Clone, Default)]
pub struct BearerToken {
    header: Option<MetadataValue<Ascii>>,
}

impl BearerToken {
    /// The interceptor for `token`; one that cannot travel in a header is refused.
    pub fn new(token: Option<&str>) -> Result<Self, ConnectError> {
        let header = token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| ConnectError::BadToken)
            })
            .transpose()?;
        Ok(Self { header })
    }
}

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_METADATA, header.clone());
        }
        Ok(request)
    }
}

/// The token a request carries, if any (`Bearer <token>`); the server side of [`BearerToken`].
pub fn bearer_token<T>(request: &tonic::Request<T>) -> Option<&str> {
    let value = request
        .metadata()
        .get(AUTHORIZATION_METADATA)?
        .to_str()
        .ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim()).filter(|t| !t.is_empty())
}

/// A hint for a transport failure that smells of a TLS mismatch: plaintext to a TLS port, or
/// a certificate the client does not trust.
pub fn transport_hint(url: &str, error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut chain = String::new();
    let mut next = Some(error);
    while let Some(e) = next {
        chain.push_str(&e.to_string().to_ascii_lowercase());
        chain.push(' ');
        next = e.source();
    }
    if chain.contains("certificate") || chain.contains("unknownissuer") {
        return Some(format!(
            "the scheduler's certificate is not trusted: pass the CA that signed it with --ca (RESIDENT_CA), and connect by a name or IP in the certificate ({url})"
        ));
    }
    if chain.contains("connection reset")
        || chain.contains("broken pipe")
        || chain.contains("frame")
        || chain.contains("h2 protocol")
        || chain.contains("connection closed")
    {
        return plaintext_hint(url);
    }
    None
}

/// For a call that failed below gRPC on a connection that opened: over `http://`, the
/// likely cause is a scheduler that serves TLS.
pub fn plaintext_hint(url: &str) -> Option<String> {
    url.starts_with("http://").then(|| {
        format!(
            "the connection opened but the scheduler did not answer plaintext gRPC; if it serves TLS, use an https:// url and --ca ({url})"
        )
    })
}

/// A status made by the client's transport rather than sent by the scheduler (no metadata
/// came with it).
pub fn is_transport_failure(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
    ) && status.metadata().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_decides_tls() {
        let none = ClientCredentials::default();
        assert!(scheduler_endpoint("http://127.0.0.1:1", &none).is_ok());
        assert!(scheduler_endpoint("https://127.0.0.1:1", &none).is_ok());
        let with_ca = ClientCredentials {
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            ..Default::default()
        };
        let refused = scheduler_endpoint("http://127.0.0.1:1", &with_ca).unwrap_err();
        assert!(
            refused.to_string().contains("use an https:// url"),
            "{refused}"
        );
        let refused = scheduler_endpoint("ftp://x:1", &none).unwrap_err();
        assert!(
            refused.to_string().contains("https://host:port"),
            "{refused}"
        );
    }

    #[test]
    fn a_token_goes_over_plaintext_only_to_loopback_unless_allowed() {
        let token = ClientCredentials::default().with_token(Some("rsd_secret".into()));
        for url in [
            "http://127.0.0.1:1",
            "http://127.9.0.1:1",
            "http://localhost:1",
            "http://[::1]:1",
            "https://scheduler.example:1",
        ] {
            assert!(scheduler_endpoint(url, &token).is_ok(), "{url}");
        }
        for url in ["http://10.0.0.5:50051", "http://scheduler.example:50051"] {
            let refused = scheduler_endpoint(url, &token).unwrap_err().to_string();
            assert!(
                refused.contains("not loopback") && refused.contains("--insecure"),
                "{refused}"
            );
            assert!(!refused.contains("rsd_secret"), "{refused}");
            let allowed = token.clone().allow_token_over_plaintext(true);
            assert!(scheduler_endpoint(url, &allowed).is_ok(), "{url}");
            let no_token = ClientCredentials::default();
            assert!(scheduler_endpoint(url, &no_token).is_ok(), "{url}");
        }
    }

    #[test]
    fn bearer_round_trip() {
        let mut interceptor = BearerToken::new(Some("rsd_abc")).unwrap();
        let request = interceptor.call(tonic::Request::new(())).unwrap();
        assert_eq!(bearer_token(&request), Some("rsd_abc"));
        let mut none = BearerToken::new(None).unwrap();
        let request = none.call(tonic::Request::new(())).unwrap();
        assert_eq!(bearer_token(&request), None);
        assert!(BearerToken::new(Some("bad\ntoken")).is_err());
    }

    #[test]
    fn credentials_never_print_secrets() {
        let credentials = ClientCredentials::default().with_token(Some("rsd_secret".into()));
        assert!(!format!("{credentials:?}").contains("secret"));
    }
}
