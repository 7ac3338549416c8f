//! Loopback ports for the processes a test starts.
//!
//! A port the kernel hands out for `bind(0)` comes from its ephemeral range, which is also where
//! every outgoing connection takes its local port: between the test releasing it and the child
//! process binding it, another test's gRPC client may connect from it ("Address already in use").
//! So a port here comes from below that range, where the kernel never picks one, and is claimed
//! by a file so that two test processes of one run never pick the same one.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The lowest port handed out: above the well-known and common service ports.
const LOWEST_PORT: u16 = 15_000;
/// The ports a run needs at most at once, with room to pick at random among free ones.
const FEWEST_PORTS: u16 = 2_000;
/// A claim older than this is free again: the process it was for has long bound it, or is gone.
const CLAIM_LIFETIME: Duration = Duration::from_secs(300);

/// A free loopback port: below the kernel's ephemeral range, claimed for this test, and free
/// when checked.
pub fn free_port() -> u16 {
    let Some(ports) = unpicked_ports() else {
        return kernel_port();
    };
    let claims = claims_dir();
    for _ in 0..10_000 {
        let port = ports.start + (random() % u64::from(ports.end - ports.start)) as u16;
        if claim(&claims, port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    kernel_port()
}

/// The ports the kernel never hands out by itself on this host, if there are enough of them.
fn unpicked_ports() -> Option<std::ops::Range<u16>> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let lowest_ephemeral: u16 = ephemeral.split_whitespace().next()?.parse().ok()?;
    (lowest_ephemeral >= LOWEST_PORT + FEWEST_PORTS).then_some(LOWEST_PORT..lowest_ephemeral)
}

fn kernel_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn claims_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("resident-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port claims directory");
    dir
}

/// Claims `port` for this process: true unless a fresh claim of another test holds it.
fn claim(dir: &Path, port: u16) -> bool {
    let path = dir.join(port.to_string());
    let new_claim = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .is_ok()
    };
    if new_claim() {
        return true;
    }
    let stale = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .is_some_and(|age| age > CLAIM_LIFETIME);
    stale && std::fs::remove_file(&path).is_ok() && new_claim()
}

/// A random number, differently seeded in each call (no generator crate needed for this).
fn random() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        if let Some(range) = unpicked_ports() {
            assert!(ports.iter().all(|p| range.contains(p)), "{ports:?}");
        }
        for port in ports {
            TcpListener::bind(("127.0.0.1", port)).expect("a given port is free");
        }
    }
}
