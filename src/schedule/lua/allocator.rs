//! Tuning of glibc malloc for the Lua VM.
//!
//! A scheduler run allocates and frees hundreds of thousands of small blocks. glibc keeps freed
//! small blocks in "fastbins" and merges them all (`malloc_consolidate`) on the next larger
//! request, which profiling showed costing more than a millisecond at the start of every round,
//! right when the scheduler input is built. Without fastbins freed blocks merge as they are freed.

/// Applies the tuning; call once at start, before the scheduler runs.
#[allow(unsafe_code)]
pub fn tune() {
    // SAFETY: mallopt only changes allocator parameters; M_MXFAST = 0 disables fastbins.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}
