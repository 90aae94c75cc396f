//! `cargo xtask size`: how big the TV/router binary is, and what makes it big.
//!
//! The release profile strips symbols, so the breakdown comes from a second, unstripped
//! build of the same binary in its own target directory: per crate and the largest
//! functions, read from the symbol table with `nm` (`cargo bloat` is not needed). Code
//! that LTO inlined is counted in the function it was inlined into.
use crate::device::{build, file_size, std_from_source_build, Device, LINUX_ARM};
use crate::util::{output, run, target_dir, Result};
use std::collections::HashMap;
use std::process::Command;

/// How many of the largest crates and functions to print.
const TOP: usize = 25;

pub fn main(_args: &[String]) -> Result<()> {
    let bin = build(Device::Tv)?;
    let size = file_size(&bin)?;
    println!(
        "tv/router binary: {size} bytes ({:.2} MB)",
        size as f64 / 1_000_000.0
    );
    let dir = target_dir().join("device-syms");
    let mut unstripped = std_from_source_build(LINUX_ARM, &dir, &[]);
    unstripped.env("CARGO_PROFILE_RELEASE_STRIP", "false");
    run(&mut unstripped)?;
    let syms = dir.join(LINUX_ARM).join("release/pinch");
    let listing = output(
        Command::new("nm")
            .args(["--size-sort", "-S", "-C"])
            .arg(&syms),
    )
    .map_err(|e| format!("{e} (nm from binutils lists the symbols)"))?;
    let symbols = parse_nm(&listing);
    let total: u64 = symbols.iter().map(|s| s.size).sum();
    println!("\nsymbols: {total} bytes in {} symbols\n", symbols.len());
    println!("| crate | bytes |\n| --- | ---: |");
    for (krate, bytes) in by_crate(&symbols).into_iter().take(TOP) {
        println!("| {krate} | {bytes} |");
    }
    println!("\n| largest symbols | kind | bytes |\n| --- | --- | ---: |");
    for s in symbols.iter().rev().take(TOP) {
        println!("| `{}` | {} | {} |", shorten(&s.name, 100), s.kind, s.size);
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
struct Symbol {
    size: u64,
    /// nm's type letter: `t` code, `r` read-only data, `d` data, `b` zeroed.
    kind: char,
    name: String,
}

/// `nm --size-sort -S -C` lines: `ADDRESS SIZE TYPE NAME` (hex), smallest first.
fn parse_nm(listing: &str) -> Vec<Symbol> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, ' ');
            let _address = fields.next()?;
            let size = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?.chars().next()?.to_ascii_lowercase();
            let name = fields.next()?.to_string();
            Some(Symbol { size, kind, name })
        })
        .collect()
}

/// Bytes per crate, largest first. A symbol belongs to the first crate its demangled name
/// mentions (`<pinch_kernels::X as core::fmt::Debug>::fmt` is pinch_kernels's); names
/// without a path (libc, compiler builtins) are "(C / no path)".
fn by_crate(symbols: &[Symbol]) -> Vec<(String, u64)> {
    let mut bytes: HashMap<String, u64> = HashMap::new();
    for s in symbols {
        *bytes.entry(crate_of(&s.name)).or_default() += s.size;
    }
    let mut rows: Vec<(String, u64)> = bytes.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows
}

fn crate_of(name: &str) -> String {
    let Some(end) = name.find("::") else {
        return "(C / no path)".into();
    };
    let head = &name[..end];
    let start = head
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let krate = &head[start..];
    if krate.is_empty() {
        "(C / no path)".into()
    } else {
        krate.into()
    }
}

fn shorten(name: &str, max: usize) -> String {
    match name.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &name[..i]),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nm_lines_and_skips_others() {
        let listing = "0000000000401000 0000000000000010 T main\n\
                       garbage\n\
                       0000000000402000 00000000000000ff r pinch_kernels::TABLE\n";
        let syms = parse_nm(listing);
        assert_eq!(syms.len(), 2);
        assert_eq!(
            syms[1],
            Symbol {
                size: 255,
                kind: 'r',
                name: "pinch_kernels::TABLE".into()
            }
        );
    }

    #[test]
    fn symbols_go_to_the_first_crate_named() {
        assert_eq!(crate_of("pinch_linux::run::main"), "pinch_linux");
        assert_eq!(
            crate_of("<pinch_kernels::Fmt as core::fmt::Debug>::fmt"),
            "pinch_kernels"
        );
        assert_eq!(crate_of("memcpy"), "(C / no path)");
        assert_eq!(crate_of("<&T as core::fmt::Display>::fmt"), "core");
    }

    #[test]
    fn crates_are_summed_largest_first() {
        let syms = parse_nm("0 10 t a::x\n0 20 t b::y\n0 15 t a::z\n0 1 t memset\n");
        assert_eq!(
            by_crate(&syms),
            vec![
                ("a".to_string(), 0x25),
                ("b".to_string(), 0x20),
                ("(C / no path)".to_string(), 1)
            ]
        );
    }
}
