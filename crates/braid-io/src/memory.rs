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
//!
//! The other way round, the data path must not give memory back on its own: at a few
//! Gbit/s the session's arenas and the channel readers' chunks (64 KiB each) are
//! allocated and freed thousands of times a second, and glibc returned the free top of
//! a heap to the system whenever it passed 128 KiB (`M_TRIM_THRESHOLD`), so the next
//! chunks came back as fresh pages, each one a page fault: 46 000 a second for one TCP
//! flow through the tunnel, 4.6 % of both ends' CPU samples. [`tune_allocator`]
//! raises that threshold to [`TRIM_THRESHOLD`] (1 200 faults a second in the same
//! run); `give_back_freed` still returns everything free when called.

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

/// Free memory at the top of a heap that glibc keeps for reuse instead of returning
/// it to the system (docs/performance.md, "Page faults").
pub const TRIM_THRESHOLD: usize = 32 << 20;

/// Set the allocator's thresholds for braid's data path (glibc; nothing elsewhere).
/// Called once at start, before any thread:
///
/// * keep up to [`TRIM_THRESHOLD`] of freed memory per heap for reuse
///   (`M_TRIM_THRESHOLD`; above);
/// * serve blocks of 128 KiB or more with their own `mmap`, always
///   (`M_MMAP_THRESHOLD` at its default, instead of letting it rise). glibc raises it
///   to the size of each such block freed (up to 32 MiB), after which the TCP
///   terminator's 256 KiB socket buffers come from the heap arenas, and zeroing them
///   there touches pages that an `mmap`ed block leaves untouched until used: 10 000
///   idle terminated connections held 220 MiB, and 114 MiB with the threshold fixed
///   (`docs/streams.md`, "Memory"). Setting either threshold stops glibc's raising.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator, under its lock; it has
    // no preconditions and an invalid value is refused (returns 0), not undefined.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
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

    /// Minor page faults of the calling thread so far.
    fn thread_faults() -> i64 {
        // SAFETY: getrusage fills the struct it is given; zeroed is a valid start.
        unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
            u.ru_minflt
        }
    }

    #[test]
    fn chunks_freed_and_allocated_again_do_not_fault_in_fresh_pages() {
        super::tune_allocator();
        // What the data path does: 64 KiB chunks filled, all freed, more allocated.
        let round = || {
            let blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 * 1024]).collect();
            assert!(blocks.iter().all(|b| b[4096] == b[0]));
        };
        for _ in 0..5 {
            round();
        }
        let before = thread_faults();
        let rounds = 40;
        for _ in 0..rounds {
            round();
        }
        let faults = thread_faults() - before;
        // Each round touches 1024 pages: trimmed back to the system after every round
        // (glibc's default), each would fault again. Another test's malloc_trim may
        // take them once or twice.
        assert!(
            faults < rounds * 1024 / 4,
            "{faults} page faults in {rounds} rounds of 4 MiB"
        );
    }
}
