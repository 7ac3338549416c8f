//! Sane bounds on the dimensions a model's metadata (`config.json`, GGUF keys) declares.
//! Dimensions size allocations (rotary tables, KV caches, work buffers) before any weight
//! is read, and an allocation the host cannot make aborts the whole agent process; a
//! corrupt or hostile file must be refused with an error instead.

use crate::ModelError;

/// Checks each `(what, value, max)`: every dimension from 1 to its max.
pub(crate) fn check_dims(dims: &[(&str, usize, usize)]) -> Result<(), ModelError> {
    for &(what, value, max) in dims {
        if value == 0 || value > max {
            return Err(ModelError::Load(format!(
                "the model's {what} is {value}; it must be from 1 to {max} (is the model file corrupt?)"
            )));
        }
    }
    Ok(())
}

/// The largest layer count any model we load may declare.
pub(crate) const MAX_LAYERS: usize = 1024;
/// The largest hidden size.
pub(crate) const MAX_HIDDEN: usize = 1 << 16;
/// The largest attention head count (and head dimension).
pub(crate) const MAX_HEADS: usize = 1024;
/// The largest feed-forward size.
pub(crate) const MAX_FFN: usize = 1 << 20;
/// The largest vocabulary.
pub(crate) const MAX_VOCAB: usize = 1 << 22;
/// The longest context (positions).
pub(crate) const MAX_POSITIONS: usize = 1 << 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_absurd_dimensions_are_refused_naming_them() {
        assert!(check_dims(&[("layers", 12, MAX_LAYERS)]).is_ok());
        let error = check_dims(&[("layers", 0, MAX_LAYERS)])
            .unwrap_err()
            .to_string();
        assert!(error.contains("layers is 0"), "{error}");
        let error = check_dims(&[("vocabulary", 1 << 40, MAX_VOCAB)])
            .unwrap_err()
            .to_string();
        assert!(error.contains("from 1 to 4194304"), "{error}");
    }
}
