//! How the worker's memory is handed back: glibc's malloc set for a process that allocates in bursts.
//!
//! A busy worker allocates in bursts — at each tick the claims of every due job, their script calls to
//! each node, the runs' tasks — and frees it all within about a second. glibc's defaults keep what such a
//! burst freed: an arena per thread that allocated (up to eight per core), large blocks moved from
//! `mmap` into those arenas once one was freed (the dynamic mmap threshold), and free pages inside an
//! arena kept until it is trimmed, which only its top ever is. So a worker's RSS ratchets up to its worst
//! burst and stays there. [`tune`] sets the worker's malloc so the memory a burst freed goes back:
//!
//! - at most [`ARENAS`] arenas, so the tokio threads reuse each other's free blocks;
//! - blocks of [`MMAP_THRESHOLD`] and more (a batch's script calls to a node) in their own mappings,
//!   unmapped when freed — which also turns the dynamic threshold off;
//! - every [`TRIM_EVERY`], `malloc_trim(0)` in a thread of its own, which returns the free pages of every
//!   arena, not only their tops (as jemalloc's decay purges, and for the same reason).
//!
//! What it saves is measured with the benchmark's item 5 (docs/scaling.md). Other C libraries (musl) have none of these knobs and are left as they are.

/// The most malloc arenas (glibc's default is eight per core).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: libc::c_int = 2;

/// Blocks of this size and more get a mapping of their own, returned to the system when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 64 * 1024;

/// Free memory at the top of an arena beyond this is returned at once (glibc's default, set because
/// setting the mmap threshold turns off the dynamic adjustment of both).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: libc::c_int = 128 * 1024;

/// How often the free pages inside the arenas are returned to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Sets malloc up for a long-running worker (see the module's doc) and starts the thread that trims it.
/// Called once, before the runtime's threads start; a setting glibc refuses is left at its default.
pub(crate) fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes malloc's parameters, which glibc allows at any time; these are
        // set before the runtime's threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
        let trimmer = std::thread::Builder::new()
            .name("malloc-trim".to_string())
            .spawn(|| loop {
                std::thread::sleep(TRIM_EVERY);
                // SAFETY: `malloc_trim` is thread-safe: it takes each arena's lock in turn.
                unsafe { libc::malloc_trim(0) };
            });
        // Without the thread the worker only keeps more memory than it needs: nothing to report.
        drop(trimmer);
    }
}
