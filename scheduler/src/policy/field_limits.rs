//! Limits on what agents and clients name and describe, well below the message limit, so
//! that every record stays small and a listing of many of them fits in one message (each
//! listing is also capped in bytes: `service/listing.rs`). A refusal names the field and
//! its limit.

use resident_proto::pb;

/// Node ids, hostnames: a DNS name's length.
pub const MAX_NODE_ID_BYTES: usize = 253;
/// An agent process's generation (a uuid and a little more).
pub const MAX_GENERATION_BYTES: usize = 128;
/// Labels on a node.
pub const MAX_NODE_LABELS: usize = 64;
/// Each label's key and value (as pool selectors).
pub const MAX_LABEL_BYTES: usize = 256;
/// Actor kinds one agent offers, and each kind's name.
pub const MAX_ACTOR_KINDS: usize = 256;
pub const MAX_KIND_BYTES: usize = 128;
/// GPUs on one node, and each GPU's name and uuid.
pub const MAX_GPUS: usize = 64;
pub const MAX_GPU_NAME_BYTES: usize = 256;
/// Why a GPU could not be opened (the driver's words).
pub const MAX_GPU_REASON_BYTES: usize = 512;
/// A job's name.
pub const MAX_JOB_NAME_BYTES: usize = 256;

/// A field over its limit; the text names the field and the limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldLimitError {
    /// A text field longer than its limit.
    #[error("{field} is {bytes} bytes long; the limit is {max}")]
    TooLong {
        /// Which field (`node_id`, ``label `zone` ``, ...).
        field: String,
        /// Its length.
        bytes: usize,
        /// Its limit.
        max: usize,
    },
    /// A list with more entries than its limit.
    #[error("{field} has {count} entries; the limit is {max}")]
    TooMany {
        /// Which list.
        field: &'static str,
        /// Its entries.
        count: usize,
        /// Its limit.
        max: usize,
    },
}

/// Checks what an agent says about its node when it registers.
pub fn check_registration(register: &pb::RegisterNode) -> Result<(), FieldLimitError> {
    too_long("node_id", &register.node_id, MAX_NODE_ID_BYTES)?;
    too_long("generation", &register.generation, MAX_GENERATION_BYTES)?;
    too_long("hostname", &register.hostname, MAX_NODE_ID_BYTES)?;
    too_many("labels", register.labels.len(), MAX_NODE_LABELS)?;
    for (key, value) in &register.labels {
        too_long("a label key", key, MAX_LABEL_BYTES)?;
        too_long(&format!("label `{key}`"), value, MAX_LABEL_BYTES)?;
    }
    too_many("actor_kinds", register.actor_kinds.len(), MAX_ACTOR_KINDS)?;
    for kind in &register.actor_kinds {
        too_long("an actor kind", kind, MAX_KIND_BYTES)?;
    }
    too_many("gpus", register.gpus.len(), MAX_GPUS)?;
    for gpu in &register.gpus {
        too_long("a GPU name", &gpu.name, MAX_GPU_NAME_BYTES)?;
        too_long("a GPU uuid", &gpu.uuid, MAX_GPU_NAME_BYTES)?;
    }
    too_many(
        "unavailable_gpus",
        register.unavailable_gpus.len(),
        MAX_GPUS,
    )?;
    for gpu in &register.unavailable_gpus {
        too_long(
            "why a GPU is unavailable",
            &gpu.reason,
            MAX_GPU_REASON_BYTES,
        )?;
    }
    Ok(())
}

/// Checks a job's name.
pub fn check_job_name(name: &str) -> Result<(), FieldLimitError> {
    too_long("the job name", name, MAX_JOB_NAME_BYTES)
}

fn too_long(field: &str, value: &str, max: usize) -> Result<(), FieldLimitError> {
    if value.len() > max {
        return Err(FieldLimitError::TooLong {
            field: field.to_owned(),
            bytes: value.len(),
            max,
        });
    }
    Ok(())
}

fn too_many(field: &'static str, count: usize, max: usize) -> Result<(), FieldLimitError> {
    if count > max {
        return Err(FieldLimitError::TooMany { field, count, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> pb::RegisterNode {
        pb::RegisterNode {
            node_id: "n1".into(),
            generation: "g".into(),
            actor_kinds: vec!["echo".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_sane_registration_passes_and_each_oversized_field_is_named() {
        assert_eq!(check_registration(&node()), Ok(()));
        let mut long_id = node();
        long_id.node_id = "n".repeat(254);
        let error = check_registration(&long_id).unwrap_err().to_string();
        assert!(
            error.contains("node_id is 254 bytes") && error.contains("253"),
            "{error}"
        );
        let mut labels = node();
        labels.labels = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
        let error = check_registration(&labels).unwrap_err().to_string();
        assert!(error.contains("labels has 65 entries"), "{error}");
        let mut value = node();
        value.labels.insert("zone".into(), "z".repeat(300));
        let error = check_registration(&value).unwrap_err().to_string();
        assert!(error.contains("label `zone` is 300 bytes"), "{error}");
        let mut kinds = node();
        kinds.actor_kinds = vec!["k".into(); 257];
        assert!(
            check_registration(&kinds)
                .unwrap_err()
                .to_string()
                .contains("actor_kinds")
        );
        let mut gpus = node();
        gpus.gpus = vec![pb::GpuInfo::default(); 65];
        assert!(
            check_registration(&gpus)
                .unwrap_err()
                .to_string()
                .contains("gpus has 65")
        );
    }

    #[test]
    fn a_long_job_name_is_refused() {
        assert!(check_job_name(&"j".repeat(256)).is_ok());
        assert!(
            check_job_name(&"j".repeat(257))
                .unwrap_err()
                .to_string()
                .contains("257 bytes")
        );
    }
}
