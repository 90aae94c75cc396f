//! Views of raw bytes as typed slices (quant blocks, f32, u16 ...).
//!
//! The only place outside the ISA modules where a cast happens, so the rest of pinch
//! (including `runtime-min`) stays free of `unsafe`. Block structs in [`crate::quant`]
//! are `#[repr(C)]` and made only of `u8` arrays (f16 fields are `[u8; 2]`), so their
//! alignment is 1 and every bit pattern is a valid value.
#![allow(unsafe_code)]

/// Plain-old-data: any bit pattern is a valid value and there is no padding.
///
/// # Safety
/// Implementors must be `#[repr(C)]` or primitive, have no padding, and accept every
/// bit pattern.
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: primitive integers and floats accept every bit pattern and have no padding.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for i8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for i16 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}

/// Declare block structs as [`Pod`] and check at compile time that their alignment is 1.
#[macro_export]
macro_rules! pod_block {
    ($($t:ty),* $(,)?) => {$(
        static_assertions::const_assert_eq!(core::mem::align_of::<$t>(), 1);
        // SAFETY: the block is #[repr(C)] made of u8 arrays only (alignment 1 asserted
        // above), so it has no padding and every bit pattern is valid.
        #[allow(unsafe_code)]
        unsafe impl $crate::blocks::Pod for $t {}
    )*};
}

/// View `bytes` as `T`s. `None` if the length is not a whole number of `T` or the
/// start is misaligned for `T`.
#[inline]
pub fn cast<T: Pod>(bytes: &[u8]) -> Option<&[T]> {
    let size = core::mem::size_of::<T>();
    if size == 0
        || !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(core::mem::align_of::<T>())
    {
        return None;
    }
    // SAFETY: T is Pod (any bit pattern valid), the pointer is aligned for T (checked),
    // the length is a whole number of T, and the lifetime is tied to `bytes`.
    Some(unsafe { core::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) })
}

/// Mutable view of `bytes` as `T`s; same conditions as [`cast`].
#[inline]
pub fn cast_mut<T: Pod>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let size = core::mem::size_of::<T>();
    if size == 0
        || !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(core::mem::align_of::<T>())
    {
        return None;
    }
    // SAFETY: as in `cast`; the borrow of `bytes` is exclusive for the returned lifetime.
    Some(unsafe {
        core::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, bytes.len() / size)
    })
}

/// View `T`s as bytes (always possible for Pod).
#[inline]
pub fn bytes_of<T: Pod>(items: &[T]) -> &[u8] {
    // SAFETY: T is Pod with no padding, so every byte is initialised; u8 has alignment 1.
    unsafe {
        core::slice::from_raw_parts(items.as_ptr() as *const u8, core::mem::size_of_val(items))
    }
}

/// Mutable byte view of `T`s (for writing any bytes: every pattern is a valid T).
#[inline]
pub fn bytes_of_mut<T: Pod>(items: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Pod: every byte pattern written through the view is a valid T.
    unsafe {
        core::slice::from_raw_parts_mut(
            items.as_mut_ptr() as *mut u8,
            core::mem::size_of_val(items),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_rejects_partial_and_misaligned() {
        let mut buf = [0u64; 4];
        let bytes = bytes_of_mut(&mut buf);
        assert_eq!(cast::<f32>(&bytes[..8]).map(|s| s.len()), Some(2));
        assert!(cast::<f32>(&bytes[..7]).is_none());
        assert!(cast::<f32>(&bytes[1..9]).is_none());
    }
}
