//! Handing freed memory back to the OS.

/// Returns the heap pages the allocator holds free to the kernel.
///
/// glibc keeps freed memory resident: after the first large free it raises
/// its mmap threshold, so later megabyte-sized buffers come from the heap
/// and leave holes there when freed. Work that allocates a lot once (a
/// model's load: about 170 MB over SmolLM2's 96 MB of weights; a 16 MB
/// request body tokenized: its ids, offsets and token strings) would
/// otherwise leave the process that much larger for good. A no-op off
/// glibc.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only returns free heap pages to the kernel;
        // it is safe to call at any time from any thread.
        unsafe { malloc_trim(0) };
    }
}

/// Keeps a long-running process from holding on to memory its requests
/// freed; for `ferrum serve`, called before its threads start.
///
/// glibc serves each thread from one of up to eight arenas per core and
/// raises its mmap threshold after large frees (see
/// [`release_freed_memory`]), so a server's transient megabytes (request
/// bodies, token ids, logits, JSON) settle as holes in many heaps: under
/// `scripts/soak.py`'s 64 clients the resident set rose 200 MB above the
/// weights and the KV pool and stayed there. A fixed 1 MiB threshold maps
/// every larger buffer on its own and unmaps it when freed; four arenas
/// bound the heaps. Decode allocates nothing per token, so neither costs
/// generation speed. A no-op off glibc.
pub fn bound_retained_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        // glibc's malloc.h.
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        const M_ARENA_MAX: std::ffi::c_int = -8;
        // SAFETY: mallopt only changes allocator parameters; called before
        // the server's threads start.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 1 << 20);
            mallopt(M_ARENA_MAX, 4);
        }
    }
}
