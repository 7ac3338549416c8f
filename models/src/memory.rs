//! The host memory one model's caches may take, so that a batch of long sequences fails
//! its step with an error instead of an allocation that aborts the agent (an allocation
//! the host cannot make aborts the whole process; `catch_unwind` cannot catch it).
//!
//! The budget is half the host's RAM (`MemTotal` in `/proc/meminfo`), per cache. A step
//! that would grow a cache past it fails with [`ModelError::OutOfMemory`], which the
//! generate actor answers by running half as many sequences at once; growth within it is
//! reserved with `try_reserve`, so a host that cannot give the memory is an error too.

use std::sync::OnceLock;

use crate::ModelError;

/// Half the host's RAM, or no limit where it cannot be read.
pub fn cache_budget_bytes() -> u64 {
    static BUDGET: OnceLock<u64> = OnceLock::new();
    *BUDGET.get_or_init(|| host_ram_bytes().map_or(u64::MAX, |ram| ram / 2))
}

/// `MemTotal` from `/proc/meminfo`.
pub fn host_ram_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a cache that would take `bytes` (`None`: more than a `u64` holds) past `budget`.
pub(crate) fn check_cache_size(
    what: &str,
    bytes: Option<u64>,
    budget: u64,
) -> Result<(), ModelError> {
    match bytes {
        Some(bytes) if bytes <= budget => Ok(()),
        _ => Err(ModelError::OutOfMemory(format!(
            "the {what} would take {}, past this model's host-memory budget of {} (half the \
             host's RAM); run fewer sequences at once (max_sequences) or shorter prompts and \
             outputs",
            bytes.map_or("more than 16 EiB".to_owned(), gib),
            gib(budget)
        ))),
    }
}

/// Grows `vec` to `len` elements of `value`, with room for `room` where the host gives
/// it (so that growing again up to `room` moves nothing), for `len` where it gives only
/// that; reserving first: an error, not an abort, when the host cannot give the memory.
pub(crate) fn try_grow<T: Clone>(
    vec: &mut Vec<T>,
    len: usize,
    room: usize,
    value: T,
) -> Result<(), ModelError> {
    if len > vec.capacity() {
        let roomy = room.max(len) - vec.len();
        vec.try_reserve_exact(roomy)
            .or_else(|_| vec.try_reserve_exact(len - vec.len()))
            .map_err(|e| {
                ModelError::OutOfMemory(format!("cannot reserve {len} cache entries: {e}"))
            })?;
    }
    if len > vec.len() {
        vec.resize(len, value);
    }
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_has_ram_and_a_budget_of_half() {
        let ram = host_ram_bytes().expect("/proc/meminfo");
        assert!(ram > 1 << 28, "{ram}");
        assert_eq!(cache_budget_bytes(), ram / 2);
    }

    #[test]
    fn a_cache_past_its_budget_is_an_out_of_memory_error() {
        assert!(check_cache_size("KV cache", Some(10), 10).is_ok());
        let error = check_cache_size("KV cache", Some(3 << 30), 1 << 30).unwrap_err();
        assert!(
            matches!(&error, ModelError::OutOfMemory(m) if m.contains("3.0 GiB") && m.contains("1.0 GiB")),
            "{error}"
        );
        assert!(check_cache_size("KV cache", None, u64::MAX).is_err());
    }

    #[test]
    fn growth_within_its_room_moves_nothing() {
        let mut values = vec![7u32; 3];
        try_grow(&mut values, 5, 100, 1).unwrap();
        assert_eq!(values, [7, 7, 7, 1, 1]);
        assert!(values.capacity() >= 100);
        let at = values.as_ptr();
        try_grow(&mut values, 100, 100, 2).unwrap();
        assert_eq!((values.len(), values.as_ptr()), (100, at));
        // Shorter than held: nothing changes.
        try_grow(&mut values, 10, 10, 3).unwrap();
        assert_eq!(values.len(), 100);
    }

    #[test]
    fn growth_the_host_cannot_give_is_an_error() {
        let mut small = vec![0u8; 4];
        try_grow(&mut small, 16, 16, 1).unwrap();
        assert_eq!(small.len(), 16);
        let mut huge: Vec<u64> = Vec::new();
        assert!(matches!(
            try_grow(&mut huge, usize::MAX / 2, 0, 0),
            Err(ModelError::OutOfMemory(_))
        ));
    }
}
