//! A thin S3 client for jobs: list a prefix, stream or fetch objects, put objects whole
//! (they appear only complete), and upload large files in parts.

use std::io::Read;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::ByteStream;

use super::{ObjectInfo, S3Action, S3Error, S3Options};

const MIN_PART_BYTES: usize = 5 << 20;

/// An S3 client plus the runtime it runs on, so blocking readers can use it too.
#[derive(Clone, Debug)]
pub struct S3Client {
    pub(crate) client: Client,
    runtime: tokio::runtime::Handle,
    pub(crate) part_bytes: usize,
}

/// The SDK's HTTPS client (hyper, connection pool, the platform's root certificates) on
/// rustls with ring: the SDK's default would bring a second crypto library (aws-lc).
fn https_client() -> aws_sdk_s3::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// The SDK's shared configuration over [`https_client`]: credentials and region from the
/// standard chains (the loader hands the region chain's IMDS lookup the same client), and
/// `us-east-1` where no region is configured anywhere, for the credential providers (STS,
/// for a web identity) as for S3. The fallback costs a second load only when it is needed.
async fn shared_config() -> aws_config::SdkConfig {
    let loader =
        || aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https_client());
    let shared = loader().load().await;
    if shared.region().is_some() {
        return shared;
    }
    loader()
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .load()
        .await
}

pub(crate) fn describe(error: impl std::error::Error) -> String {
    DisplayErrorContext(error).to_string()
}

impl S3Client {
    /// Credentials and region from the standard AWS chain (environment, profile, web
    /// identity, instance metadata); region `us-east-1` when none is configured. Every
    /// request, the credential and region lookups' included, goes through rustls on ring.
    pub async fn connect(options: &S3Options) -> Self {
        let shared = shared_config().await;
        let mut builder = aws_sdk_s3::config::Builder::from(&shared);
        if let Some(endpoint) = &options.endpoint {
            builder = builder.endpoint_url(endpoint).force_path_style(true);
        }
        if let Some((access_key, secret)) = &options.static_credentials {
            builder = builder.credentials_provider(aws_sdk_s3::config::Credentials::new(
                access_key, secret, None, None, "resident",
            ));
        }
        Self {
            client: Client::from_conf(builder.build()),
            runtime: tokio::runtime::Handle::current(),
            part_bytes: options.part_bytes.max(MIN_PART_BYTES),
        }
    }

    /// Every object under `prefix`, in key order.
    pub async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<ObjectInfo>, S3Error> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut objects = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| S3Error::call(S3Action::List, bucket, prefix, describe(e)))?;
            for object in page.contents() {
                objects.push(ObjectInfo {
                    key: object.key().unwrap_or_default().to_owned(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    etag: object.e_tag().unwrap_or_default().to_owned(),
                });
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    /// The whole object, or `None` when there is no such key.
    pub async fn get(&self, bucket: &str, key: &str) -> Result<Option<Vec<u8>>, S3Error> {
        let response = self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await;
        let output = match response {
            Ok(output) => output,
            Err(error) => {
                let missing = error.as_service_error().is_some_and(|e| e.is_no_such_key());
                if missing {
                    return Ok(None);
                }
                return Err(S3Error::call(S3Action::Read, bucket, key, describe(error)));
            }
        };
        let bytes = output
            .body
            .collect()
            .await
            .map_err(|e| S3Error::call(S3Action::Read, bucket, key, e))?;
        Ok(Some(bytes.to_vec()))
    }

    /// The object's size, or `None` when there is no such key.
    pub async fn size(&self, bucket: &str, key: &str) -> Result<Option<u64>, S3Error> {
        match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(head) => Ok(Some(head.content_length().unwrap_or(0).max(0) as u64)),
            Err(error) if error.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(error) => Err(S3Error::call(S3Action::Stat, bucket, key, describe(error))),
        }
    }

    /// Writes the object in one request: readers see it whole or not at all.
    pub async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), S3Error> {
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| S3Error::call(S3Action::Write, bucket, key, describe(e)))
    }

    /// Writes the object only if there is none (`If-None-Match: *`); `false` when one
    /// exists. A store without conditional writes just writes it.
    pub async fn put_if_absent(
        &self,
        bucket: &str,
        key: &str,
        bytes: Vec<u8>,
    ) -> Result<bool, S3Error> {
        let written = self
            .client
            .put_object()
            .bucket(bucket)
            .key(key)
            .if_none_match("*")
            .body(ByteStream::from(bytes))
            .send()
            .await;
        match written {
            Ok(_) => Ok(true),
            Err(error)
                if matches!(
                    error.raw_response().map(|r| r.status().as_u16()),
                    Some(409 | 412)
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(S3Error::call(S3Action::Write, bucket, key, describe(error))),
        }
    }

    /// Deletes the object `key`; deleting one that is not there succeeds.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), S3Error> {
        self.client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| S3Error::call(S3Action::Delete, bucket, key, describe(e)))
    }

    /// A blocking reader over the object's body, streamed (for reader threads; must not be
    /// called on an async worker thread).
    pub fn open_blocking(&self, bucket: &str, key: &str) -> Result<Box<dyn Read + Send>, S3Error> {
        let output = self
            .runtime
            .block_on(self.client.get_object().bucket(bucket).key(key).send())
            .map_err(|e| S3Error::call(S3Action::Read, bucket, key, describe(e)))?;
        let body = output.body.into_async_read();
        Ok(Box::new(tokio_util::io::SyncIoBridge::new_with_handle(
            body,
            self.runtime.clone(),
        )))
    }

    /// Copies the object into `file` (for formats that need random access, like Parquet);
    /// blocking, like [`S3Client::open_blocking`].
    pub fn download_blocking(
        &self,
        bucket: &str,
        key: &str,
        file: &mut std::fs::File,
    ) -> Result<(), S3Error> {
        let mut body = self.open_blocking(bucket, key)?;
        std::io::copy(&mut body, file)
            .map(|_| ())
            .map_err(|e| S3Error::call(S3Action::Read, bucket, key, e))
    }

    /// Checks that the bucket exists and `key` can be written (then removes it again).
    pub async fn check_writable(&self, bucket: &str, key: &str) -> Result<(), S3Error> {
        if let Err(error) = self.client.head_bucket().bucket(bucket).send().await {
            return Err(
                match error.as_service_error().is_some_and(|e| e.is_not_found()) {
                    true => S3Error::NoBucket {
                        bucket: bucket.to_owned(),
                    },
                    false => S3Error::Unreachable {
                        bucket: bucket.to_owned(),
                        reason: describe(error),
                    },
                },
            );
        }
        self.put(bucket, key, b"ok".to_vec()).await?;
        self.delete(bucket, key).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::TcpListener;

    use super::*;

    /// The SDK's HTTPS goes through rustls on ring (the provider is chosen, not assumed
    /// installed: a missing one panics in rustls) and checks the server's certificate: an
    /// endpoint whose certificate no root vouches for is refused, in words.
    #[tokio::test]
    async fn https_runs_on_ring_and_refuses_a_certificate_no_root_vouches_for() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = handshakes.clone();
        let server = tokio::spawn(async move {
            // The SDK may try again: every connection gets the same certificate.
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = acceptor.accept(stream).await;
            }
        });
        let options = S3Options {
            endpoint: Some(format!("https://localhost:{port}")),
            static_credentials: Some(("key".into(), "secret".into())),
            ..Default::default()
        };
        let client = S3Client::connect(&options).await;
        let error = client.list("bucket", "prefix/").await.unwrap_err();
        let words = error.to_string();
        assert!(
            words.to_lowercase().contains("certificate"),
            "the refusal names the certificate: {words}"
        );
        server.abort();
        assert!(
            handshakes.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "a TLS handshake reached the server"
        );
    }
}
