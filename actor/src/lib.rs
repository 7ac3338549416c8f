//! The contract of a typed actor kind, shared by the agent that runs it and the clients that
//! call it.
//!
//! A kind is a type implementing [`Kind`]: its name and version, the config a pool gives
//! each actor, and the request, response and error types of a call. Put it in a crate both
//! sides depend on; the agent side implements `resident_node_agent::typed::TypedActor` for
//! it, the client side opens `pool.typed::<K>()` with `resident_sdk`.
//!
//! On the wire, requests and replies are [postcard](https://docs.rs/postcard) (compact,
//! serde-driven); configs are JSON, so `resident pools` can show them. A kind is offered and
//! asked for by its id, `name@version` ([`kind_id`]): bump [`Kind::VERSION`] whenever a type
//! changes incompatibly, and the scheduler will place the new version only on agents that
//! run it, and refuse a pool of a version no agent has.
//!
//! ```
//! use resident_actor::{Kind, decode_reply, decode_request, encode_reply, encode_request, kind_id};
//! use serde::{Deserialize, Serialize};
//!
//! /// Counts the words of a text.
//! struct WordCount;
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Text(String);
//!
//! impl Kind for WordCount {
//!     const NAME: &'static str = "word-count";
//!     const VERSION: u32 = 1;
//!     type Config = ();
//!     type Request = Text;
//!     type Response = usize;
//!     type Error = String;
//! }
//!
//! assert_eq!(kind_id::<WordCount>(), "word-count@1");
//! // What a client sends and an agent reads back; then the agent's answer, the other way.
//! let payload = encode_request::<WordCount>(&Text("a resident actor".into())).unwrap();
//! let request = decode_request::<WordCount>(&payload).unwrap();
//! let answer: Result<usize, String> = Ok(request.0.split_whitespace().count());
//! let output = encode_reply::<WordCount>(&answer).unwrap();
//! assert_eq!(decode_reply::<WordCount>(&output).unwrap(), Ok(3));
//! ```

#![warn(missing_docs)]

use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod generate;
pub mod limits;
pub mod reasoning;

/// A typed actor kind: what its actors are configured with, take and give back.
pub trait Kind: 'static {
    /// The kind's name: lowercase words joined by `-`, no `@`.
    const NAME: &'static str;
    /// Bump when `Config`, `Request`, `Response` or `Error` change incompatibly.
    const VERSION: u32;
    /// What a pool gives each of its actors when they load (JSON on the wire).
    type Config: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// One call's input.
    type Request: Serialize + DeserializeOwned + Send + 'static;
    /// One call's output.
    type Response: Serialize + DeserializeOwned + Send + 'static;
    /// What a call may fail with, by the kind's own account (returned to the caller as a
    /// value, never retried: retrying the same request would fail the same way).
    type Error: Serialize + DeserializeOwned + std::fmt::Display + std::fmt::Debug + Send + 'static;
}

/// The id agents offer and pools ask for: `name@version`.
pub fn kind_id<K: Kind>() -> String {
    format!("{}@{}", K::NAME, K::VERSION)
}

/// A kind id's name and version (`None` for an unversioned kind, such as the built-in ones).
pub fn split_kind_id(id: &str) -> (&str, Option<u32>) {
    match id.rsplit_once('@') {
        Some((name, version)) => match version.parse() {
            Ok(version) => (name, Some(version)),
            Err(_) => (id, None),
        },
        None => (id, None),
    }
}

/// Which part of a call could not be encoded or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The pool's actor config.
    Config,
    /// A call's request.
    Request,
    /// A call's reply.
    Reply,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Part::Config => "config",
            Part::Request => "request",
            Part::Reply => "reply",
        })
    }
}

/// A value that does not encode, or bytes that do not decode, as the kind's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "actor kind `{kind}`: cannot {action} the {part} as `{type_name}`: {reason}; both sides \
     must be built from the same version of the kind"
)]
pub struct CodecError {
    /// The kind's id (`name@version`).
    pub kind: String,
    /// `encode` or `decode`.
    pub action: &'static str,
    /// What was being encoded or decoded.
    pub part: Part,
    /// The Rust type it was encoded or decoded as.
    pub type_name: &'static str,
    /// The codec's error.
    pub reason: String,
}

fn codec_error<K: Kind, T>(action: &'static str, part: Part, reason: impl ToString) -> CodecError {
    CodecError {
        kind: kind_id::<K>(),
        action,
        part,
        type_name: std::any::type_name::<T>(),
        reason: reason.to_string(),
    }
}

fn encode<K: Kind, T: Serialize>(value: &T, part: Part) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|e| codec_error::<K, T>("encode", part, e))
}

fn decode<K: Kind, T: DeserializeOwned>(bytes: &[u8], part: Part) -> Result<T, CodecError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(codec_error::<K, T>(
            "decode",
            part,
            format!("{} bytes left over after the value", rest.len()),
        )),
        Err(e) => Err(codec_error::<K, T>("decode", part, e)),
    }
}

/// A request as the bytes of a task's payload.
pub fn encode_request<K: Kind>(request: &K::Request) -> Result<Vec<u8>, CodecError> {
    encode::<K, _>(request, Part::Request)
}

/// A task's payload as the kind's request.
pub fn decode_request<K: Kind>(bytes: &[u8]) -> Result<K::Request, CodecError> {
    decode::<K, _>(bytes, Part::Request)
}

/// A call's outcome: the response, or the kind's own error.
pub type Reply<K> = Result<<K as Kind>::Response, <K as Kind>::Error>;

/// A reply (the kind's response, or its error) as the bytes of a task's output.
pub fn encode_reply<K: Kind>(reply: &Reply<K>) -> Result<Vec<u8>, CodecError> {
    encode::<K, _>(reply, Part::Reply)
}

/// A task's output as the kind's reply.
pub fn decode_reply<K: Kind>(bytes: &[u8]) -> Result<Reply<K>, CodecError> {
    decode::<K, _>(bytes, Part::Reply)
}

/// A pool's actor config as the bytes the agent hands the kind at load.
pub fn encode_config<K: Kind>(config: &K::Config) -> Result<Vec<u8>, CodecError> {
    serde_json::to_vec(config).map_err(|e| codec_error::<K, K::Config>("encode", Part::Config, e))
}

/// Decodes a pool's config; an empty one reads as `null`, then as `{}` (so `()` and structs
/// whose fields all have defaults need none).
pub fn decode_config<K: Kind>(bytes: &[u8]) -> Result<K::Config, CodecError> {
    let decode = |text: &[u8]| serde_json::from_slice::<K::Config>(text);
    let decoded = match bytes.is_empty() {
        true => decode(b"null").or_else(|_| decode(b"{}")),
        false => decode(bytes),
    };
    decoded.map_err(|e| codec_error::<K, K::Config>("decode", Part::Config, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Shingles {
        text: String,
        width: u8,
    }

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default)]
    struct Settings {
        seeds: u32,
    }

    struct Demo;
    impl Kind for Demo {
        const NAME: &'static str = "demo";
        const VERSION: u32 = 3;
        type Config = Settings;
        type Request = Shingles;
        type Response = Vec<u64>;
        type Error = String;
    }

    #[test]
    fn ids_carry_name_and_version() {
        assert_eq!(kind_id::<Demo>(), "demo@3");
        assert_eq!(split_kind_id("demo@3"), ("demo", Some(3)));
        assert_eq!(split_kind_id("embed"), ("embed", None));
        assert_eq!(split_kind_id("odd@name"), ("odd@name", None));
    }

    #[test]
    fn requests_and_replies_round_trip_compactly() {
        let request = Shingles {
            text: "near duplicate".into(),
            width: 5,
        };
        let bytes = encode_request::<Demo>(&request).unwrap();
        assert!(bytes.len() < 20, "{} bytes", bytes.len());
        assert_eq!(decode_request::<Demo>(&bytes).unwrap(), request);
        let ok: Reply<Demo> = Ok(vec![1, u64::MAX]);
        let err: Reply<Demo> = Err("too short".into());
        for reply in [ok, err] {
            let bytes = encode_reply::<Demo>(&reply).unwrap();
            assert_eq!(decode_reply::<Demo>(&bytes).unwrap(), reply);
        }
    }

    #[test]
    fn bytes_of_another_type_are_refused_with_the_kind_and_type() {
        let error = decode_request::<Demo>(&[0xff, 0xff, 0xff]).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("actor kind `demo@3`: cannot decode the request as `"));
        assert!(message.contains("Shingles"), "{message}");
        let trailing = [
            encode_request::<Demo>(&Shingles {
                text: String::new(),
                width: 1,
            })
            .unwrap(),
            vec![7],
        ]
        .concat();
        let error = decode_request::<Demo>(&trailing).unwrap_err();
        assert!(error.reason.contains("1 bytes left over"), "{error}");
    }

    #[test]
    fn configs_are_json_and_may_be_empty() {
        let bytes = encode_config::<Demo>(&Settings { seeds: 64 }).unwrap();
        assert_eq!(bytes, br#"{"seeds":64}"#);
        assert_eq!(
            decode_config::<Demo>(&bytes).unwrap(),
            Settings { seeds: 64 }
        );
        assert_eq!(decode_config::<Demo>(b"").unwrap(), Settings::default());
        let error = decode_config::<Demo>(br#"{"seeds":"many"}"#).unwrap_err();
        assert_eq!(error.part, Part::Config);
        assert!(error.to_string().contains("Settings"), "{error}");
    }
}
