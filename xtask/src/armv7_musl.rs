//! The shipping build of `--device router-armv7`: a static armv7-a hard-float binary on
//! musl, smaller than the glibc one and free of glibc's static-linking caveats (NSS,
//! `dlopen`).
//!
//! rustup serves no std for `armv7-unknown-linux-musleabihf` here, so std is compiled
//! from `rust-src` like the TV build's ([`device::std_from_source_build`]); without
//! rustup's std there are no self-contained crt objects or libc either, so Debian's
//! `musl-dev:armhf` supplies musl (crt1.o, libc.a) and its `arm-linux-musleabihf-gcc`
//! wrapper (gcc-arm-linux-gnueabihf with musl's specs) links, taking the unwinder from
//! gcc's `libgcc_eh.a`. `cargo xtask test` runs this very binary under qemu-arm on the
//! tiny goldens (`tests/tests/device_binary.rs`, through `pinch logits`); the kernel
//! and engine test binaries stay on the glibc target ([`device::ARMV7`]), whose std
//! rustup serves: built for musl they need a second std build in the test profile
//! (`-Z build-std=std,test,panic_unwind` and `-C link-arg=-lgcc_eh` for the unwinder;
//! measured: they link and run, at about 2.4 CPU-minutes more than CI's budget allows).
use crate::device;
use crate::util::{have, run, Result};
use std::path::{Path, PathBuf};

pub const TARGET: &str = "armv7-unknown-linux-musleabihf";
/// Debian's wrapper that runs `arm-linux-gnueabihf-gcc` with musl's specs.
const MUSL_GCC: &str = "arm-linux-musleabihf-gcc";
/// An `ar` archive with no members.
const EMPTY_ARCHIVE: &[u8] = b"!<arch>\n";

/// Build the static armv7 musl binary and return its path.
pub fn build() -> Result<PathBuf> {
    device::ensure_rust_src()?;
    ensure_musl_cross()?;
    let dir = device::device_target_dir();
    let link_dir = placeholder_libunwind(&dir)?;
    let link_dir = link_dir
        .to_str()
        .ok_or("the target directory's path is not UTF-8")?;
    let rustflags = [
        // rustc would add the self-contained crt objects of rustup's std, absent here;
        // gcc adds musl's instead.
        "-C".to_string(),
        "link-self-contained=no".to_string(),
        "-C".to_string(),
        "target-feature=+crt-static".to_string(),
        "-L".to_string(),
        format!("native={link_dir}"),
    ];
    let mut build = device::std_from_source_build(TARGET, &dir, &rustflags);
    build.env(
        "CARGO_TARGET_ARMV7_UNKNOWN_LINUX_MUSLEABIHF_LINKER",
        MUSL_GCC,
    );
    run(&mut build)?;
    let bin = dir.join(TARGET).join("release/pinch");
    device::check_static(&bin)?;
    device::report_size(&bin)?;
    Ok(bin)
}

/// std's `unwind` crate asks a static musl build for `-lunwind` (LLVM's libunwind, which
/// rustup's std ships and Debian does not). musl's specs already link gcc's unwinder
/// (`libgcc_eh.a`), so an empty `libunwind.a` satisfies the request; were anything to
/// need an `_Unwind_*` symbol gcc does not provide, the link would fail, not the binary.
fn placeholder_libunwind(dir: &Path) -> Result<PathBuf> {
    let link_dir = dir.join("armv7-musl-link");
    std::fs::create_dir_all(&link_dir)
        .map_err(|e| format!("cannot create {}: {e}", link_dir.display()))?;
    let lib = link_dir.join("libunwind.a");
    std::fs::write(&lib, EMPTY_ARCHIVE)
        .map_err(|e| format!("cannot write {}: {e}", lib.display()))?;
    Ok(link_dir)
}

/// Install the cross gcc and Debian's armhf musl when the wrapper is missing (musl-dev
/// for armhf needs the armhf architecture in dpkg).
fn ensure_musl_cross() -> Result<()> {
    if have(MUSL_GCC) && have("arm-linux-gnueabihf-gcc") {
        return Ok(());
    }
    if !have("apt-get") {
        return Err(format!(
            "{MUSL_GCC} is missing; install gcc-arm-linux-gnueabihf and musl-dev:armhf"
        ));
    }
    run(&mut crate::test::as_root(
        "dpkg",
        &["--add-architecture", "armhf"],
    ))?;
    run(&mut crate::test::apt_get(&["update"]))?;
    run(&mut crate::test::apt_get(&[
        "install",
        "-y",
        "--no-install-recommends",
        "gcc-arm-linux-gnueabihf",
        "musl-dev:armhf",
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_libunwind_is_an_empty_ar_archive_and_is_rewritten() {
        let dir = std::env::temp_dir().join(format!("pinch-armv7-musl-{}", std::process::id()));
        let link_dir = placeholder_libunwind(&dir).unwrap();
        let lib = link_dir.join("libunwind.a");
        std::fs::write(&lib, b"stale").unwrap();
        placeholder_libunwind(&dir).unwrap();
        assert_eq!(std::fs::read(&lib).unwrap(), b"!<arch>\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
