//! Recycled buffers for tunnel frames' payloads. A tunnel moves its bytes in frames of up to
//! [`crate::tunnel::TUNNEL_CHUNK`] bytes, each in a buffer of its own that is dropped once written out. Under
//! musl's allocator (the static agent's) a buffer that size is an `mmap` and a `munmap` of its
//! own, its pages faulted in and zeroed by the kernel for every frame: a quarter of the agent's
//! time in a download. The few buffers kept here serve the next frames instead.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Capacity of the buffers kept: a tunnel data frame's payload (channel byte and a 256 KiB
/// chunk). A leaf of the crate, so it states the size and the tunnel asserts that they agree.
pub const CAPACITY: usize = 256 * 1024 + 1;
/// Buffers kept at most: what a download's frames in flight between the channel's reader and
/// the tunnel's writer need, and no more than 1 MiB held by a process that tunneled once.
const KEEP: usize = 4;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn pool() -> MutexGuard<'static, Vec<Vec<u8>>> {
    // Holds only empty buffers: consistent whatever a panicking holder did.
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An empty buffer for `len` bytes: a kept one of [`CAPACITY`] when `len` is a tunnel frame's
/// size (more than half of it, so a kept buffer is not spent on a small payload), else new.
pub fn take(len: usize) -> Vec<u8> {
    if len > CAPACITY || len <= CAPACITY / 2 {
        return Vec::with_capacity(len);
    }
    pool().pop().unwrap_or_else(|| Vec::with_capacity(CAPACITY))
}

/// Gives a buffer back once its bytes are written out. Only buffers of exactly [`CAPACITY`]
/// are kept, up to a few; the rest are freed.
pub fn give(mut buf: Vec<u8>) {
    if buf.capacity() != CAPACITY {
        return;
    }
    let mut pool = pool();
    if pool.len() < KEEP {
        buf.clear();
        pool.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_sized_buffers_come_back_and_others_do_not() {
        let buf = take(CAPACITY);
        assert!(buf.is_empty() && buf.capacity() == CAPACITY);
        let ptr = buf.as_ptr();
        give(buf);
        // Tests run on threads side by side: another may take it first, so look for it in a
        // few takes, all given back after.
        let taken: Vec<Vec<u8>> = (0..KEEP).map(|_| take(CAPACITY - 10)).collect();
        assert!(taken.iter().any(|b| b.as_ptr() == ptr));
        assert!(taken
            .iter()
            .all(|b| b.is_empty() && b.capacity() == CAPACITY));
        taken.into_iter().for_each(give);
        assert!(take(100).capacity() < CAPACITY);
        assert!(take(CAPACITY + 1).capacity() > CAPACITY);
        give(Vec::with_capacity(100));
        assert!(pool().iter().all(|b| b.capacity() == CAPACITY) && pool().len() <= KEEP);
    }
}
