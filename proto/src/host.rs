//! Facts about the machine a process runs on, shared by the scheduler and the agent.

/// This machine's memory (`MemTotal` in `/proc/meminfo`); `None` where it cannot be read.
pub fn total_ram_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn reads_this_machines_memory() {
        let bytes = super::total_ram_bytes().expect("linux has /proc/meminfo");
        assert!(bytes > 64 << 20, "{bytes}");
    }
}
