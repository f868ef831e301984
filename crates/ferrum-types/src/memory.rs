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
