//! What a report, manifest or results file leaves out when it was never counted: a field
//! at its default (`#[serde(default, skip_serializing_if = "is_default")]`), so that files
//! of versions without it read, and are written, as before. A leaf.

/// Whether a count or sum is at its default.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}
