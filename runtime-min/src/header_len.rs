//! Find where a GGUF file's header ends by walking it through `Platform::read_at`,
//! so the engine can read exactly the header into the arena (no growing buffers).
//!
//! This walk trusts nothing: every length is bounded by the file size and every sum is
//! checked; the full validation happens afterwards in [`crate::gguf::Gguf::parse`].
use crate::platform::Platform;

/// Why the header length could not be found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderLenError {
    /// The file ends (or a length points) past its end at `offset`.
    Truncated {
        offset: u64,
        file_len: u64,
    },
    /// Not a GGUF file.
    BadMagic,
    /// An unknown metadata value type or nesting too deep.
    BadValue {
        offset: u64,
    },
    Read(crate::platform::PlatformError),
}

impl core::fmt::Display for HeaderLenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HeaderLenError::Truncated { offset, file_len } => {
                write!(f, "GGUF header runs past the end of the file (offset {offset}, file is {file_len} bytes)")
            }
            HeaderLenError::BadMagic => write!(f, "not a GGUF file (bad magic)"),
            HeaderLenError::BadValue { offset } => {
                write!(f, "bad GGUF metadata value at offset {offset}")
            }
            HeaderLenError::Read(e) => write!(f, "{e}"),
        }
    }
}

const WINDOW: usize = 16 * 1024;

struct Walker<'p, P: Platform> {
    p: &'p P,
    file: &'p P::File,
    len: u64,
    pos: u64,
    win: [u8; WINDOW],
    win_start: u64,
    win_len: usize,
}

impl<P: Platform> Walker<'_, P> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], HeaderLenError> {
        let end = self.pos.checked_add(N as u64).filter(|e| *e <= self.len);
        if end.is_none() {
            return Err(HeaderLenError::Truncated {
                offset: self.pos,
                file_len: self.len,
            });
        }
        if self.pos < self.win_start || self.pos + N as u64 > self.win_start + self.win_len as u64 {
            self.win_start = self.pos;
            let want = ((self.len - self.pos) as usize).min(WINDOW);
            let mut got = 0;
            while got < want {
                let n = self
                    .p
                    .read_at(
                        self.file,
                        self.pos + got as u64,
                        &mut self.win[got..want],
                        false,
                    )
                    .map_err(HeaderLenError::Read)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            self.win_len = got;
            if got < N {
                return Err(HeaderLenError::Truncated {
                    offset: self.pos,
                    file_len: self.len,
                });
            }
        }
        let off = (self.pos - self.win_start) as usize;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.win[off..off + N]);
        self.pos += N as u64;
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32, HeaderLenError> {
        Ok(u32::from_le_bytes(self.bytes::<4>()?))
    }
    fn u64(&mut self) -> Result<u64, HeaderLenError> {
        Ok(u64::from_le_bytes(self.bytes::<8>()?))
    }
    fn skip(&mut self, n: u64) -> Result<(), HeaderLenError> {
        match self.pos.checked_add(n) {
            Some(e) if e <= self.len => {
                self.pos = e;
                Ok(())
            }
            _ => Err(HeaderLenError::Truncated {
                offset: self.pos,
                file_len: self.len,
            }),
        }
    }
    fn string(&mut self) -> Result<(), HeaderLenError> {
        let n = self.u64()?;
        self.skip(n)
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<(), HeaderLenError> {
        let at = self.pos;
        match ty {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4..=6 => self.skip(4),
            10..=12 => self.skip(8),
            8 => self.string(),
            9 if depth < 8 => {
                let et = self.u32()?;
                let n = self.u64()?;
                let fixed = match et {
                    0 | 1 | 7 => Some(1u64),
                    2 | 3 => Some(2),
                    4..=6 => Some(4),
                    10..=12 => Some(8),
                    _ => None,
                };
                match fixed {
                    Some(sz) => self.skip(n.checked_mul(sz).ok_or(HeaderLenError::Truncated {
                        offset: at,
                        file_len: self.len,
                    })?),
                    None => {
                        // Each element takes at least 8 bytes: bound the loop by the file.
                        if n > (self.len - self.pos) / 8 + 1 {
                            return Err(HeaderLenError::Truncated {
                                offset: at,
                                file_len: self.len,
                            });
                        }
                        for _ in 0..n {
                            self.value(et, depth + 1)?;
                        }
                        Ok(())
                    }
                }
            }
            _ => Err(HeaderLenError::BadValue { offset: at }),
        }
    }
}

/// Length in bytes of the GGUF header of `file` (up to the aligned start of tensor data).
pub fn header_len<P: Platform>(p: &P, file: &P::File) -> Result<u64, HeaderLenError> {
    let len = p.file_size(file);
    let mut w = Walker {
        p,
        file,
        len,
        pos: 0,
        win: [0; WINDOW],
        win_start: 0,
        win_len: 0,
    };
    if &w.bytes::<4>()? != b"GGUF" {
        return Err(HeaderLenError::BadMagic);
    }
    let _version = w.u32()?;
    let n_tensors = w.u64()?;
    let n_kv = w.u64()?;
    if n_kv > len / 12 || n_tensors > len / 24 {
        return Err(HeaderLenError::Truncated {
            offset: 8,
            file_len: len,
        });
    }
    let mut alignment = 32u64;
    for _ in 0..n_kv {
        let key_len = w.u64()?;
        let is_align = key_len == 17 && {
            let at = w.pos;
            let k = w.bytes::<17>()?;
            w.pos = at;
            &k == b"general.alignment"
        };
        w.skip(key_len)?;
        let ty = w.u32()?;
        if is_align && ty == 4 {
            alignment = w.u32()? as u64;
        } else {
            w.value(ty, 0)?;
        }
    }
    for _ in 0..n_tensors {
        w.string()?;
        let n_dims = w.u32()?;
        if n_dims > 4 {
            return Err(HeaderLenError::BadValue { offset: w.pos });
        }
        w.skip(8 * n_dims as u64 + 4 + 8)?;
    }
    let a = if alignment.is_power_of_two() {
        alignment
    } else {
        32
    };
    Ok(w.pos.div_ceil(a).saturating_mul(a).min(len))
}
