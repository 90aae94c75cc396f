//! `cargo xtask build --device tv|router|ipad|host`: the shipping artifact per device.
//!
//! TV boxes and routers get one static aarch64 musl binary (linked by rust-lld, see
//! `.cargo/config.toml`), so it runs on any Android or Linux userland without a loader.
//! The iPad gets a static library that a Mac links into an app and signs.
use crate::util::{cargo, run, target_dir, Result};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Tv,
    Router,
    Ipad,
    Host,
}

pub const LINUX_ARM: &str = "aarch64-unknown-linux-musl";
pub const IOS: &str = "aarch64-apple-ios";

impl Device {
    fn parse(s: &str) -> Option<Device> {
        match s {
            "tv" => Some(Device::Tv),
            "router" => Some(Device::Router),
            "ipad" => Some(Device::Ipad),
            "host" => Some(Device::Host),
            _ => None,
        }
    }
}

pub fn main(args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask build --device tv|router|ipad|host";
    let device = match args {
        [flag, d] if flag == "--device" => Device::parse(d),
        [d] => d.strip_prefix("--device=").and_then(Device::parse),
        _ => None,
    }
    .ok_or(usage)?;
    let path = build(device)?;
    println!("{}", path.display());
    Ok(())
}

/// Build for `device` and return the artifact's path.
pub fn build(device: Device) -> Result<PathBuf> {
    match device {
        Device::Tv | Device::Router => {
            run(&mut cargo([
                "build",
                "--release",
                "-p",
                "pinch-linux",
                "--target",
                LINUX_ARM,
            ]))?;
            let bin = target_dir().join(LINUX_ARM).join("release/pinch");
            check_static(&bin)?;
            report_size(&bin)?;
            Ok(bin)
        }
        Device::Ipad => {
            run(&mut cargo([
                "build",
                "--release",
                "-p",
                "pinch-ios",
                "--target",
                IOS,
            ]))?;
            let lib = target_dir().join(IOS).join("release/libpinch_ios.a");
            if !lib.is_file() {
                return Err(format!("expected {} after the build", lib.display()));
            }
            report_size(&lib)?;
            eprintln!(
                "static library for iOS built. To make an app, on a Mac with Xcode: \
                 add it to an Xcode target (Link Binary With Libraries), then sign and \
                 install from Xcode; see runtime-ios/README.md."
            );
            Ok(lib)
        }
        Device::Host => {
            run(&mut cargo(["build", "--release", "-p", "pinch-linux"]))?;
            let bin = target_dir().join("release/pinch");
            report_size(&bin)?;
            Ok(bin)
        }
    }
}

pub fn file_size(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))
}

fn report_size(path: &Path) -> Result<()> {
    let size = file_size(path)?;
    eprintln!(
        "{}: {size} bytes ({:.2} MB)",
        path.display(),
        size as f64 / 1_000_000.0
    );
    Ok(())
}

/// A binary is static when it asks for no program interpreter (no PT_INTERP header);
/// a dynamic one would fail on a device with a different or missing libc.
fn check_static(bin: &Path) -> Result<()> {
    let bytes = std::fs::read(bin).map_err(|e| format!("cannot read {}: {e}", bin.display()))?;
    match elf_has_interp(&bytes) {
        Some(false) => Ok(()),
        Some(true) => Err(format!(
            "{} is dynamically linked (has PT_INTERP); the device build must be static",
            bin.display()
        )),
        None => Err(format!(
            "{} is not a 64-bit little-endian ELF file",
            bin.display()
        )),
    }
}

/// `Some(true)` if the ELF64 LE file has a PT_INTERP program header, `None` if not ELF64 LE.
fn elf_has_interp(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.get(..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let p_type = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
        if p_type == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!(Device::parse("tv"), Some(Device::Tv));
        assert_eq!(Device::parse("ipad"), Some(Device::Ipad));
        assert_eq!(Device::parse("toaster"), None);
    }

    #[test]
    fn rejects_non_elf() {
        assert_eq!(elf_has_interp(b"#!/bin/sh\n"), None);
        assert_eq!(elf_has_interp(b""), None);
    }

    #[test]
    fn the_running_test_binary_is_elf_and_its_interp_is_reported() {
        // The host test binary is dynamically linked on glibc hosts and static on musl;
        // either way it must parse, and the answer must agree with a PT_INTERP-free build.
        let me = std::env::current_exe().unwrap();
        let bytes = std::fs::read(me).unwrap();
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert_eq!(elf_has_interp(&bytes), Some(true));
        }
    }

    #[test]
    fn truncated_headers_are_not_elf() {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        // phoff points past the end with one header: no panic, just None.
        b[0x20] = 200;
        b[0x38] = 1;
        b[0x36] = 56;
        assert_eq!(elf_has_interp(&b), None);
    }
}
