//! `cargo xtask build --device tv|router|router-armv7|ipad|host`: the shipping artifact
//! per device.
//!
//! TV boxes and routers get one static aarch64 musl binary (linked by rust-lld, see
//! `.cargo/config.toml`), so it runs on any Android or Linux userland without a loader.
//! 32-bit ARM userlands (`router-armv7`) get a static armv7-a hard-float musl binary
//! (see [`crate::armv7_musl`]); the armv7 tests run on the glibc target, whose std rustup
//! serves, linked statically by Debian's cross gcc ([`ensure_armv7_toolchain`]).
//! Both device binaries build std from source ([`std_from_source_build`]).
//! The iPad gets a static library that a Mac links into an app and signs: arm64
//! (`ipad`), or 32-bit armv7s (`ipad-armv7`, a tier-3 target built by nightly
//! `-Z build-std`; untested here, as nothing on this machine runs iOS code).
use crate::util::{cargo, have, run, target_dir, Result};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Tv,
    Router,
    RouterArmv7,
    Ipad,
    IpadArmv7,
    Host,
}

pub const LINUX_ARM: &str = "aarch64-unknown-linux-musl";
pub const IOS: &str = "aarch64-apple-ios";
/// armv7-a, VFPv3-D16 hard float, Thumb-2; NEON is detected at run time (not every
/// 32-bit ARM core has it). The tests' target; the shipped binary is the musl one.
pub const ARMV7: &str = "armv7-unknown-linux-gnueabihf";
/// 32-bit iOS (A6: iPhone 5, iPad 4). Tier 3: no std from rustup, so the nightly
/// toolchain builds std from `rust-src` (`-Z build-std`).
pub const IOS_ARMV7: &str = "armv7s-apple-ios";
/// The cross linker that `.cargo/config.toml` names for [`ARMV7`].
const ARMV7_GCC: &str = "arm-linux-gnueabihf-gcc";

impl Device {
    fn parse(s: &str) -> Option<Device> {
        match s {
            "tv" => Some(Device::Tv),
            "router" => Some(Device::Router),
            "router-armv7" => Some(Device::RouterArmv7),
            "ipad" => Some(Device::Ipad),
            "ipad-armv7" => Some(Device::IpadArmv7),
            "host" => Some(Device::Host),
            _ => None,
        }
    }
}

pub fn main(args: &[String]) -> Result<()> {
    let usage = "usage: cargo xtask build --device tv|router|router-armv7|ipad|ipad-armv7|host";
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
            ensure_rust_src()?;
            let dir = device_target_dir();
            run(&mut std_from_source_build(LINUX_ARM, &dir, &[]))?;
            let bin = dir.join(LINUX_ARM).join("release/pinch");
            check_static(&bin)?;
            report_size(&bin)?;
            Ok(bin)
        }
        Device::RouterArmv7 => crate::armv7_musl::build(),
        Device::Ipad => {
            run(&mut shipped(cargo([
                "build",
                "--release",
                "-p",
                "pinch-ios",
                "--target",
                IOS,
            ])))?;
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
        Device::IpadArmv7 => {
            // A separate target directory: the nightly std must not mix with the pinned one.
            run(std::process::Command::new("rustup").args([
                "component",
                "add",
                "--toolchain",
                "nightly",
                "rust-src",
            ]))?;
            let dir = target_dir().join("nightly");
            let mut build = std::process::Command::new("cargo");
            build
                .current_dir(crate::util::root())
                .env_remove("CARGO")
                .env_remove("RUSTC")
                .env("CARGO_TARGET_DIR", &dir)
                .args([
                    "+nightly",
                    "build",
                    "-Z",
                    "build-std=std,panic_abort",
                    "--release",
                    "-p",
                    "pinch-ios",
                    "--target",
                    IOS_ARMV7,
                ]);
            run(&mut shipped(build))?;
            let lib = dir.join(IOS_ARMV7).join("release/libpinch_ios.a");
            if !lib.is_file() {
                return Err(format!("expected {} after the build", lib.display()));
            }
            report_size(&lib)?;
            eprintln!(
                "static library for 32-bit iOS (armv7s) built with nightly build-std; \
                 link it on a Mac as for `--device ipad`, with an Xcode that still \
                 targets iOS 10 or older (32-bit apps end at iOS 10)."
            );
            Ok(lib)
        }
        Device::Host => {
            run(&mut shipped(cargo([
                "build",
                "--release",
                "-p",
                "pinch-linux",
            ])))?;
            let bin = target_dir().join("release/pinch");
            report_size(&bin)?;
            Ok(bin)
        }
    }
}

/// [`device_target_dir`], under the target directory.
pub const DEVICE_DIR: &str = "device";

/// Where the device builds with a rebuilt std go: their flags differ from the host's
/// and the tests', so sharing `target/` would rebuild everything on every switch.
pub fn device_target_dir() -> PathBuf {
    target_dir().join(DEVICE_DIR)
}

/// Profile overrides `cargo xtask test` sets for its release test builds (no LTO, 16
/// codegen units: the same code and bits, built and linked faster); a device build
/// removes them so what it produces is what ships.
pub const TEST_PROFILE_ENV: [(&str, &str); 2] = [
    ("CARGO_PROFILE_RELEASE_LTO", "false"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16"),
];

/// `cmd` without [`TEST_PROFILE_ENV`]: the shipping release profile.
pub fn shipped(mut cmd: std::process::Command) -> std::process::Command {
    for (k, _) in TEST_PROFILE_ENV {
        cmd.env_remove(k);
    }
    cmd
}

/// `cargo build --release` of `pinch-linux` for `target` with std compiled from source
/// (`rust-src`) under the release profile instead of rustup's prebuilt one, which is
/// what brings the binary toward 1 MB:
/// - `panic_abort` std: the prebuilt std carries the unwinder and the landing pads of
///   panic=unwind, dead weight when the profile aborts;
/// - `optimize_for_size` picks std's small algorithms (sorting, formatting); naming the
///   features replaces cargo's default `backtrace panic-unwind`, so the DWARF symbolizer
///   (addr2line, gimli, miniz) that only prints a panic's backtrace is left out;
/// - std gets the profile's opt-level, LTO and one codegen unit like our crates, so LTO
///   drops what pinch never calls;
/// - `-C force-unwind-tables=no`: nothing unwinds with panic=abort, so `.eh_frame` is
///   dead weight.
///
/// `-Z build-std` is unstable; `RUSTC_BOOTSTRAP=1` lets the pinned stable toolchain
/// accept it, so no second (nightly) toolchain is needed. A panic still prints its
/// message and location before aborting.
///
/// `rustflags` are the target's own flags (a linker route), added after ours.
pub fn std_from_source_build(
    target: &'static str,
    dir: &Path,
    rustflags: &[String],
) -> std::process::Command {
    let mut build = cargo([
        "build",
        "--release",
        "-p",
        "pinch-linux",
        "--target",
        target,
        "-Z",
        "build-std=std,panic_abort",
        "-Z",
        "build-std-features=optimize_for_size",
    ]);
    // With `--target`, these flags reach the target's crates (std included) but not
    // build scripts; a caller's own RUSTFLAGS are kept in front. The encoded form
    // (0x1f between flags) keeps paths with spaces whole.
    let mut flags: Vec<String> = std::env::var("RUSTFLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    flags.extend(["-C".to_string(), "force-unwind-tables=no".to_string()]);
    flags.extend_from_slice(rustflags);
    build
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    shipped(build)
}

/// `-Z build-std` compiles std from the toolchain's `rust-src` component
/// (`rust-toolchain.toml` lists it; an older install may lack it).
pub fn ensure_rust_src() -> Result<()> {
    let mut print = std::process::Command::new("rustc");
    print
        .current_dir(crate::util::root())
        .args(["--print", "sysroot"]);
    let sysroot = crate::util::output(&mut print)?;
    let library = Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library");
    if library.is_dir() {
        return Ok(());
    }
    if !have("rustup") {
        return Err(format!(
            "{} is missing: the device build compiles std from the rust-src component",
            library.display()
        ));
    }
    let mut add = std::process::Command::new("rustup");
    add.current_dir(crate::util::root())
        .args(["component", "add", "rust-src"]);
    run(&mut add)
}

/// Install what the armv7 build links with when it is missing: rustup's std for
/// [`ARMV7`], and Debian's cross gcc with the armhf glibc (`libc6-dev-armhf-cross`).
pub fn ensure_armv7_toolchain() -> Result<()> {
    if have("rustup") {
        let mut add = std::process::Command::new("rustup");
        add.current_dir(crate::util::root())
            .args(["target", "add", ARMV7]);
        run(&mut add)?;
    }
    // The gcc alone is not enough: installed for the musl build (musl-dev:armhf) it
    // comes without the glibc sysroot, and links then fail on crt1.o.
    let glibc_crt = Path::new("/usr/arm-linux-gnueabihf/lib/crt1.o");
    if !have(ARMV7_GCC) || !glibc_crt.is_file() {
        if !have("apt-get") {
            return Err(format!(
                "{ARMV7_GCC} is missing; install gcc-arm-linux-gnueabihf and libc6-dev-armhf-cross"
            ));
        }
        let install = [
            "install",
            "-y",
            "--no-install-recommends",
            "gcc-arm-linux-gnueabihf",
            "libc6-dev-armhf-cross",
        ];
        if run(&mut crate::test::apt_get(&install)).is_err() {
            run(&mut crate::test::apt_get(&["update"]))?;
            run(&mut crate::test::apt_get(&install))?;
        }
    }
    Ok(())
}

pub fn file_size(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))
}

pub fn report_size(path: &Path) -> Result<()> {
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
pub fn check_static(bin: &Path) -> Result<()> {
    let bytes = std::fs::read(bin).map_err(|e| format!("cannot read {}: {e}", bin.display()))?;
    match elf_has_interp(&bytes) {
        Some(false) => Ok(()),
        Some(true) => Err(format!(
            "{} is dynamically linked (has PT_INTERP); the device build must be static",
            bin.display()
        )),
        None => Err(format!("{} is not a little-endian ELF file", bin.display())),
    }
}

/// `Some(true)` if the little-endian ELF file (32- or 64-bit) has a PT_INTERP program
/// header, `None` if it is not a little-endian ELF file.
fn elf_has_interp(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.get(..4)? != b"\x7fELF" || *b.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    // e_phoff, e_phentsize and e_phnum sit at different offsets in ELF32 and ELF64.
    let (phoff, at_ent) = match *b.get(4)? {
        1 => (u64::from(u32_at(0x1C)?), 0x2A),
        2 => (u64_at(0x20)?, 0x36),
        _ => return None,
    };
    let phoff = usize::try_from(phoff).ok()?;
    let phentsize = usize::from(u16_at(at_ent)?);
    let phnum = usize::from(u16_at(at_ent + 2)?);
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
        assert_eq!(Device::parse("router-armv7"), Some(Device::RouterArmv7));
        assert_eq!(Device::parse("ipad-armv7"), Some(Device::IpadArmv7));
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

    /// A minimal ELF32 LE header with one program header of type `p_type`.
    fn elf32_with_one_header(p_type: u32) -> Vec<u8> {
        let mut b = vec![0u8; 52 + 32];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 1;
        b[5] = 1;
        b[0x1C..0x20].copy_from_slice(&52u32.to_le_bytes());
        b[0x2A..0x2C].copy_from_slice(&32u16.to_le_bytes());
        b[0x2C..0x2E].copy_from_slice(&1u16.to_le_bytes());
        b[52..56].copy_from_slice(&p_type.to_le_bytes());
        b
    }

    #[test]
    fn reads_program_headers_of_32_bit_elf_files() {
        assert_eq!(elf_has_interp(&elf32_with_one_header(3)), Some(true));
        assert_eq!(elf_has_interp(&elf32_with_one_header(1)), Some(false));
        let mut odd_class = elf32_with_one_header(3);
        odd_class[4] = 3;
        assert_eq!(elf_has_interp(&odd_class), None);
    }
}
