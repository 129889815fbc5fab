//! What this process uses of the machine, as a worker's report states it: cores it may run
//! on, CPU time and peak memory (Linux `/proc`; 0 where unknown).

/// Cores this process may run on (at least 1), as a report states them.
pub fn available_cores() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Peak resident set size of this process (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
        .unwrap_or(0)
}

/// CPU time of this process so far (user + system), seconds; 0 where unknown.
pub fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (USER_HZ is 100 on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cores_memory_and_cpu_time() {
        assert!(available_cores() >= 1);
        // Work enough to be counted in clock ticks.
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        if cfg!(target_os = "linux") {
            assert!(peak_rss_bytes() > 1024 * 1024, "{}", peak_rss_bytes());
            assert!(cpu_seconds() > 0.0);
        }
    }
}
