//! cuda-emu's counts of what the calling thread asked of the GPU (`scripts/cuda-emu/stats.h`):
//! host launches, copies, waits and allocations, for tests that check what a GPU path costs
//! the host beyond its arithmetic. Only a process running on cuda-emu has them: its fake
//! driver defines `cuda_emu_counts`, which a real driver does not.

use std::ffi::{c_char, c_void};

/// `CudaEmuCounts` of stats.h, field for field and in its order, with `since`.
macro_rules! emu_counts {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// What one thread asked of the GPU since it started (stats.h says what each counts).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct EmuCounts {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl EmuCounts {
            /// The counts between `before` and these.
            pub(crate) fn since(self, before: Self) -> Self {
                Self { $($field: self.$field - before.$field,)* }
            }
        }
    };
}

emu_counts!(
    /// By the host, not those a graph replays.
    kernel_launches,
    /// cuBLAS and cuRAND calls.
    library_calls,
    graph_launches,
    /// Operations recorded into a graph, not run.
    captured,
    /// Operations run by graph launches.
    replayed,
    copies_to_device,
    bytes_to_device,
    copies_to_host,
    bytes_to_host,
    copies_on_device,
    memsets,
    /// Synchronisations, synchronous copies and copies to pageable host memory.
    waits,
    allocations,
    allocated_bytes,
    frees,
    /// Stream-ordered allocations the default pool could not serve from what it held.
    pool_growths,
    events_created,
);

#[allow(unsafe_code)]
unsafe extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

impl EmuCounts {
    /// The calling thread's counts, where the process runs on cuda-emu; `None` elsewhere.
    #[allow(unsafe_code)]
    pub(crate) fn of_this_thread() -> Option<Self> {
        // SAFETY: dlsym with RTLD_DEFAULT (a null handle on glibc) only looks a name up in
        // the loaded libraries; the symbol, where cuda-emu's libcuda defines it, is
        // `void cuda_emu_counts(CudaEmuCounts *out)`, which writes one `EmuCounts` (the same
        // `repr(C)` layout) to `out` and nothing else.
        unsafe {
            let symbol = dlsym(std::ptr::null_mut(), c"cuda_emu_counts".as_ptr());
            if symbol.is_null() {
                return None;
            }
            let counts: unsafe extern "C" fn(*mut EmuCounts) = std::mem::transmute(symbol);
            let mut out = Self::default();
            counts(&mut out);
            Some(out)
        }
    }
}
