//! A small private CA and a server certificate for the scheduler (`resident certs init`), for
//! clusters without a PKI of their own.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// PEM text of the CA and the scheduler's certificate with their keys.
pub struct SchedulerPki {
    /// The CA's certificate.
    pub ca_cert_pem: String,
    /// The CA's private key (kept to sign agents' certificates).
    pub ca_key_pem: String,
    /// The scheduler's certificate, signed by the CA.
    pub cert_pem: String,
    /// The scheduler's private key.
    pub key_pem: String,
}

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// An empty subject name.
    #[error("a subject name must not be empty")]
    EmptyName,
    /// A name that is no IP address and no DNS name.
    #[error("`{0}` is neither an IP address nor a DNS name")]
    NotAName(String),
    /// A DNS-like name rcgen refuses.
    #[error("`{name}` is not a valid DNS name: {reason}")]
    BadDnsName {
        /// The name.
        name: String,
        /// rcgen's reason.
        reason: rcgen::Error,
    },
    /// A node id that cannot be a certificate's name.
    #[error(
        "node id `{0}` cannot name a certificate; with mutual TLS, node ids are DNS-style names (letters, digits, `-`, `.`)"
    )]
    NodeName(String),
    /// No name for the scheduler's certificate.
    #[error("give at least one name or IP agents and clients dial the scheduler by")]
    NoNames,
    /// A validity of zero days.
    #[error("certificates must be valid for at least one day")]
    NoDays,
    /// The CA key given is not a key.
    #[error("the CA key: {0}")]
    CaKey(rcgen::Error),
    /// Generating or signing failed (`what` says which).
    #[error("{what}: {reason}")]
    Crypto {
        /// What was being done.
        what: &'static str,
        /// rcgen's reason.
        reason: rcgen::Error,
    },
}

/// A subject alternative name: an IP address or a DNS name (`*.` allowed first).
pub fn parse_san(name: &str) -> Result<SanType, PkiError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(PkiError::EmptyName);
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns_like = name.split('.').enumerate().all(|(i, label)| {
        (i == 0 && label == "*")
            || (!label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    });
    if !dns_like {
        return Err(PkiError::NotAName(name.to_owned()));
    }
    name.try_into()
        .map(SanType::DnsName)
        .map_err(|reason| PkiError::BadDnsName {
            name: name.to_owned(),
            reason,
        })
}

/// The CA's parameters; the same every time, so an issuer can be rebuilt from the CA key.
fn ca_params(days: u32) -> CertificateParams {
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "Resident cluster CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca, days);
    ca
}

/// A node id usable as a certificate name: a DNS name (letters, digits, `-`, `.`).
pub fn check_node_name(node_id: &str) -> Result<(), PkiError> {
    match parse_san(node_id) {
        Ok(SanType::DnsName(_)) if !node_id.contains('*') => Ok(()),
        _ => Err(PkiError::NodeName(node_id.to_owned())),
    }
}

/// A client certificate for the agent `node_id`, signed by the CA of `generate_scheduler_pki`
/// (its key, PEM). The node id is the certificate's only name, so with mutual TLS the
/// scheduler accepts this certificate for that node id and no other.
pub fn issue_agent_cert(ca_key_pem: &str, node_id: &str, days: u32) -> Result<AgentCert, PkiError> {
    check_node_name(node_id)?;
    if days == 0 {
        return Err(PkiError::NoDays);
    }
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(PkiError::CaKey)?;
    let issuer = Issuer::new(ca_params(1), &ca_key);
    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = vec![parse_san(node_id)?];
    leaf.distinguished_name.push(DnType::CommonName, node_id);
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf.use_authority_key_identifier_extension = true;
    validity(&mut leaf, days);
    let key = KeyPair::generate().map_err(crypto("generating the agent key"))?;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(crypto("signing the agent certificate"))?;
    Ok(AgentCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().to_vec(),
    })
}

/// An agent's client certificate and key.
pub struct AgentCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
    /// The certificate, DER.
    pub cert_der: Vec<u8>,
}

/// Whether a client certificate (DER) names `node_id`.
pub fn certificate_names_node(cert_der: &[u8], node_id: &str) -> bool {
    let der = rustls_pki_types::CertificateDer::from(cert_der);
    let Ok(cert) = webpki::EndEntityCert::try_from(&der) else {
        return false;
    };
    let Ok(name) = rustls_pki_types::ServerName::try_from(node_id) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// Names a failed generation or signing.
fn crypto(what: &'static str) -> impl Fn(rcgen::Error) -> PkiError {
    move |reason| PkiError::Crypto { what, reason }
}

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A CA valid ten times `days` and a scheduler certificate for `sans`, valid `days`.
pub fn generate_scheduler_pki(sans: &[String], days: u32) -> Result<SchedulerPki, PkiError> {
    if sans.is_empty() {
        return Err(PkiError::NoNames);
    }
    if days == 0 {
        return Err(PkiError::NoDays);
    }
    let san_types = sans
        .iter()
        .map(|s| parse_san(s))
        .collect::<Result<Vec<_>, _>>()?;

    let ca = ca_params(days.saturating_mul(10));
    let ca_key = KeyPair::generate().map_err(crypto("generating the CA key"))?;
    let ca_cert = ca
        .self_signed(&ca_key)
        .map_err(crypto("signing the CA certificate"))?;
    let issuer = Issuer::new(ca, &ca_key);

    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = san_types;
    leaf.distinguished_name
        .push(DnType::CommonName, sans[0].trim());
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    validity(&mut leaf, days);
    let key = KeyPair::generate().map_err(crypto("generating the scheduler key"))?;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(crypto("signing the scheduler certificate"))?;
    Ok(SchedulerPki {
        ca_cert_pem: ca_cert.pem(),
        ca_key_pem: ca_key.serialize_pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert!(matches!(parse_san("10.0.0.7"), Ok(SanType::IpAddress(_))));
        assert!(matches!(
            parse_san("sched.example"),
            Ok(SanType::DnsName(_))
        ));
        assert!(parse_san("*.example").is_ok());
        assert!(
            parse_san("bad name!")
                .unwrap_err()
                .to_string()
                .contains("neither")
        );
        assert!(generate_scheduler_pki(&[], 1).is_err());
        let pki = generate_scheduler_pki(&["127.0.0.1".into()], 1).unwrap();
        assert!(pki.cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(pki.key_pem.contains("PRIVATE KEY"));
    }

    #[test]
    fn agent_certificates_name_their_node_only() {
        let pki = generate_scheduler_pki(&["127.0.0.1".into()], 1).unwrap();
        let agent = issue_agent_cert(&pki.ca_key_pem, "gpu-1", 1).unwrap();
        assert!(agent.key_pem.contains("PRIVATE KEY"));
        assert!(certificate_names_node(&agent.cert_der, "gpu-1"));
        assert!(!certificate_names_node(&agent.cert_der, "gpu-2"));
        assert!(issue_agent_cert(&pki.ca_key_pem, "bad id", 1).is_err());
        assert!(issue_agent_cert("not a key", "gpu-1", 1).is_err());
    }
}
