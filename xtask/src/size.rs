//! `cargo xtask size`: how big the TV/router binary is, and what makes it big.
//!
//! The release profile strips symbols, so the per-crate breakdown (only when `cargo bloat`
//! is installed) comes from a separate unstripped build in its own target directory.
use crate::device::{build, file_size, Device, LINUX_ARM};
use crate::util::{cargo, run, target_dir, Result};
use std::process::Command;

pub fn main(_args: &[String]) -> Result<()> {
    let bin = build(Device::Tv)?;
    let size = file_size(&bin)?;
    println!(
        "tv/router binary: {size} bytes ({:.2} MB)",
        size as f64 / 1_000_000.0
    );
    let have_bloat = Command::new("cargo")
        .args(["bloat", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_bloat {
        println!("(install `cargo bloat` for a per-crate breakdown)");
        return Ok(());
    }
    let mut bloat = cargo([
        "bloat",
        "--release",
        "-p",
        "pinch-linux",
        "--target",
        LINUX_ARM,
    ]);
    bloat
        .args(["--crates", "-n", "20"])
        .env("CARGO_PROFILE_RELEASE_STRIP", "false")
        .env("CARGO_TARGET_DIR", target_dir().join("bloat"));
    run(&mut bloat)
}
