//! Bounds on the configs of the built-in kinds (`echo`, `text-stats`, `embed`, `generate`),
//! checked by the scheduler when a pool is created (a refusal names the field and its
//! limit) and by the agent again before an actor loads. A config value that sizes an
//! allocation must never be able to take an agent down: an allocation the host cannot
//! make aborts the whole process, and every actor on it with it.

/// The largest pool config (JSON) a scheduler accepts: configs are listed with every pool
/// and must leave room for many in one message.
pub const MAX_CONFIG_BYTES: usize = 64 << 10;

/// The bounded numeric fields of each built-in kind, by kind name: `(field, max)`.
const BOUNDS: &[(&str, &[(&str, u64)])] = &[
    (
        "echo",
        &[
            // Outputs stay within a message (the agent checks the product at run time).
            ("repeat", 1 << 16),
            ("delay_ms", 3_600_000),
            ("load_delay_ms", 3_600_000),
        ],
    ),
    (
        "embed",
        &[
            ("max_batch_tokens", 1 << 22),
            ("max_batch_size", 1 << 16),
            ("max_seq_length", 1 << 20),
            ("tokenize_threads", 256),
        ],
    ),
    (
        "generate",
        &[
            ("max_sequences", 4096),
            ("max_step_tokens", 1 << 20),
            ("max_context", 1 << 21),
            ("threads", 1024),
        ],
    ),
];

/// An actor config over the bounds; the text names the field, its value and the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigLimitError {
    /// The config is larger than [`MAX_CONFIG_BYTES`].
    #[error(
        "actor config is {0} bytes; the limit is {MAX_CONFIG_BYTES} (pass large inputs as files or tasks, not config)"
    )]
    TooLarge(usize),
    /// A numeric field of a built-in kind out of its bounds.
    #[error(
        "actor config field `{field}` of kind `{kind}` is {value}; it must be a whole number from 0 to {max}"
    )]
    OutOfBounds {
        /// The field.
        field: &'static str,
        /// The kind's name.
        kind: String,
        /// The value given, as JSON.
        value: String,
        /// The largest value allowed.
        max: u64,
    },
}

/// Checks the config of an actor of kind `kind` (`name` or `name@version`) against the
/// bounds of the built-in kind of that name; other kinds' configs are theirs to check.
/// The error names the field, its value and the limit.
pub fn check_config(kind: &str, config: &[u8]) -> Result<(), ConfigLimitError> {
    if config.len() > MAX_CONFIG_BYTES {
        return Err(ConfigLimitError::TooLarge(config.len()));
    }
    let (name, _) = crate::split_kind_id(kind);
    let Some((_, bounds)) = BOUNDS.iter().find(|(k, _)| *k == name) else {
        return Ok(());
    };
    if config.is_empty() {
        return Ok(());
    }
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(config) else {
        // Not an object: the kind's own parser says what is wrong with it.
        return Ok(());
    };
    for (field, max) in *bounds {
        let Some(value) = fields.get(*field).filter(|v| !v.is_null()) else {
            continue;
        };
        let within = value.as_u64().is_some_and(|v| v <= *max);
        if !within {
            return Err(ConfigLimitError::OutOfBounds {
                field,
                kind: name.to_owned(),
                value: value.to_string(),
                max: *max,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_sizes_are_refused_naming_the_field_and_limit() {
        let refused = check_config("echo", br#"{"repeat": 1000000000000000}"#)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("`repeat`") && refused.contains("65536"),
            "{refused}"
        );
        let refused = check_config("generate@1", br#"{"model": "m", "max_sequences": -1}"#);
        assert!(refused.unwrap_err().to_string().contains("`max_sequences`"));
        let refused = check_config("embed", br#"{"model": "m", "max_batch_size": 1.5}"#);
        assert!(refused.is_err());
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert!(
            check_config("my-kind@1", &big)
                .unwrap_err()
                .to_string()
                .contains("65536")
        );
    }

    #[test]
    fn sane_configs_and_other_kinds_pass() {
        check_config("echo", br#"{"repeat": 4, "delay_ms": 5}"#).unwrap();
        check_config("generate@1", br#"{"model": "m", "max_sequences": null}"#).unwrap();
        check_config("embed", b"").unwrap();
        check_config("my-kind@1", br#"{"repeat": 1000000000000000}"#).unwrap();
        check_config("echo", b"not json").unwrap();
    }
}
