//! Giving freed memory back to the system.
//!
//! A server's sessions allocate most in their first seconds: the handshake, and the
//! capacity probes' trains, whose datagrams pass through each session's queues and
//! arena at once. With a thousand peers connecting together that is some 75 MB of
//! heap at the peak, most of it freed a few seconds later, but glibc's allocator keeps
//! freed pages mapped: the server's resident set stayed at the peak (100-107 MiB with
//! 1000 idle peers, 63 MB of them live). [`give_back_freed`] returns the free pages
//! (`malloc_trim`, which also releases whole free pages inside the heap, not only at
//! its top); the server calls it once a second while peers start and for ten seconds
//! after.

/// Return the allocator's free pages to the system (glibc's `malloc_trim`; nothing
/// elsewhere).
pub fn give_back_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes the
    // allocator's locks like any allocation and has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    fn rss_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn freed_pages_inside_the_heap_go_back_to_the_system() {
        // 64 MiB in blocks under glibc's mmap threshold (so on the heap), touched;
        // every block but the last freed: the last pins the heap's top, so only a
        // trim that releases pages inside the heap gives anything back.
        let mut blocks: Vec<Vec<u8>> = (0..1024).map(|i| vec![i as u8; 64 * 1024]).collect();
        let pin = blocks.pop().unwrap();
        drop(blocks);
        let before = rss_kib();
        super::give_back_freed();
        let after = rss_kib();
        assert!(
            before.saturating_sub(after) >= 32 * 1024,
            "resident {before} KiB before, {after} KiB after"
        );
        assert!(pin.iter().all(|&b| b == 255));
    }
}
