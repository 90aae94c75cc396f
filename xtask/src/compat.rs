//! `cargo xtask compat`: llama.cpp's own server tests (`tools/server/tests` at commit
//! 0c1e570, as the PyPI sdist of llama-cpp-python 0.3.36 vendors them) run against
//! `pinch serve`.
//!
//! - The suite is not in the repo: it is copied from the sdist in
//!   `$HOME/.cache/pinch/sdist` (fetched with `pip download` the first time) into
//!   `target/compat/`, fresh each run.
//! - Its `utils.py` starts `$LLAMA_SERVER_BIN_PATH`: that is `tools/llama-server-shim`,
//!   which maps llama-server's flags onto `pinch serve`'s and replaces the hub models
//!   by local ones (`$PINCH_COMPAT_MODEL`: the tiny llama fixture).
//! - pytest and the client libraries are installed with pip into
//!   `$HOME/.cache/pinch/py-server-tests`.
//! - `tools/compat_plugin.py` applies `tools/compat-exclusions.md` (each excluded test
//!   with its reason; an excluded test is counted as excluded, never as passed) and
//!   records every outcome; this module prints the table per file.
//!
//! `cargo xtask compat [--files basic,completion,...] [-k EXPR]`: fails when a test
//! that is not excluded fails.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, root, run, target_dir, Result};

const SDIST: &str = "llama_cpp_python-0.3.36";
/// The suite's files that apply to pinch (the others test the router, embeddings,
/// rerank, LoRA, vision, server-side tools, speculative decoding, slot files, sleep mode, the
/// Anthropic/GCP/Responses front ends and MCP, which pinch deliberately lacks).
const FILES: &[&str] = &[
    "basic",
    "completion",
    "chat_completion",
    "tokenize",
    "metrics",
    "security",
    "ctx_shift",
    "infill",
    "ignore_eos",
    "tool_call",
];
const PY_PACKAGES: &[&str] = &[
    "pytest~=8.3",
    "openai~=2.14",
    "requests~=2.32",
    "prometheus-client",
    "filelock",
    "wget",
];

fn home_cache() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/pinch"))
}

/// llama.cpp's source inside the sdist, downloaded and unpacked if missing.
pub(crate) fn llama_cpp_src() -> Result<PathBuf> {
    let sdist = home_cache()?.join("sdist");
    let src = sdist.join(SDIST).join("vendor/llama.cpp");
    if src.join("tools/server/tests/utils.py").is_file() {
        return Ok(src);
    }
    let tar = sdist.join(format!("{SDIST}.tar.gz"));
    if !tar.is_file() {
        // Preparing the sdist's metadata needs its build backend; without build
        // isolation pip uses the one installed here.
        let build = home_cache()?.join("py-build");
        run(Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .arg("--target")
            .arg(&build)
            .args(["scikit-build-core", "cmake"]))?;
        run(Command::new("python3")
            .env("PYTHONPATH", &build)
            .args(["-m", "pip", "download", "--disable-pip-version-check"])
            .args([
                "llama-cpp-python==0.3.36",
                "--no-deps",
                "--no-binary",
                ":all:",
            ])
            .arg("--no-build-isolation")
            .arg("-d")
            .arg(&sdist))?;
    }
    run(Command::new("tar")
        .arg("xzf")
        .arg(&tar)
        .arg("-C")
        .arg(&sdist))?;
    Ok(src)
}

/// pytest and the suite's client libraries, installed once.
fn py_deps() -> Result<PathBuf> {
    let site = home_cache()?.join("py-server-tests");
    if !site.join("pytest").is_dir() || !site.join("openai").is_dir() {
        run(Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .arg("--target")
            .arg(&site)
            .args(PY_PACKAGES))?;
    }
    Ok(site)
}

/// Copy the directory tree `from` to `to` (plain files and directories).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", from.display()))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

/// Outcomes of one test file.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub excluded: usize,
}

/// Sum the plugin's result lines (`outcome<TAB>nodeid<TAB>detail`) per test file.
pub fn tally(results: &str) -> BTreeMap<String, Tally> {
    let mut by_file: BTreeMap<String, Tally> = BTreeMap::new();
    for line in results.lines() {
        let mut f = line.splitn(3, '\t');
        let (Some(outcome), Some(id)) = (f.next(), f.next()) else {
            continue;
        };
        let file = id.split("::").next().unwrap_or(id);
        let file = file.strip_prefix("unit/").unwrap_or(file);
        let t = by_file.entry(file.to_string()).or_default();
        match outcome {
            "passed" => t.passed += 1,
            "failed" => t.failed += 1,
            "skipped" => t.skipped += 1,
            "excluded" => t.excluded += 1,
            _ => {}
        }
    }
    by_file
}

fn print_table(by_file: &BTreeMap<String, Tally>) -> Tally {
    println!("\n| file | passed | failed | skipped by the suite | excluded |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut sum = Tally::default();
    for (file, t) in by_file {
        println!(
            "| {file} | {} | {} | {} | {} |",
            t.passed, t.failed, t.skipped, t.excluded
        );
        sum.passed += t.passed;
        sum.failed += t.failed;
        sum.skipped += t.skipped;
        sum.excluded += t.excluded;
    }
    println!(
        "| **total** | **{}** | **{}** | {} | {} |",
        sum.passed, sum.failed, sum.skipped, sum.excluded
    );
    println!(
        "\n{} of {} applicable tests pass ({} excluded, see tools/compat-exclusions.md)",
        sum.passed,
        sum.passed + sum.failed,
        sum.excluded
    );
    sum
}

pub fn main(args: &[String]) -> Result<()> {
    suite(args).map(|_| ())
}

/// Run the suite; the totals when every failure is a known one.
pub fn suite(args: &[String]) -> Result<Tally> {
    let mut files: Vec<String> = FILES.iter().map(|s| s.to_string()).collect();
    let mut k: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--files" => {
                let v = it.next().ok_or("--files needs a comma-separated list")?;
                files = v.split(',').map(str::to_string).collect();
            }
            "-k" => k = Some(it.next().ok_or("-k needs an expression")?.clone()),
            other => return Err(format!("compat: unknown argument `{other}`")),
        }
    }
    let src = llama_cpp_src()?;
    let site = py_deps()?;
    run(&mut cargo(["build", "--release", "--bin", "pinch"]))?;
    let pinch = target_dir().join("release/pinch");

    // A fresh copy laid out as in llama.cpp (the suite reaches ../../../models).
    let work = target_dir().join("compat");
    let _ = std::fs::remove_dir_all(&work);
    let tests = work.join("tools/server/tests");
    copy_tree(&src.join("tools/server/tests"), &tests)?;
    copy_tree(
        &src.join("models/templates"),
        &work.join("models/templates"),
    )?;
    let results = work.join("results.tsv");

    let r = root();
    let tiny = r.join("tests/data/tiny/tiny-llama-Q8_0.gguf");
    let mut py = Command::new("python3");
    py.current_dir(&tests)
        .env(
            "PYTHONPATH",
            format!("{}:{}", site.display(), r.join("tools").display()),
        )
        .env("LLAMA_SERVER_BIN_PATH", r.join("tools/llama-server-shim"))
        .env("PINCH_BIN", &pinch)
        .env("PINCH_COMPAT_MODEL", &tiny)
        .env("PINCH_COMPAT_RESULTS", &results)
        .env(
            "PINCH_COMPAT_EXCLUSIONS",
            r.join("tools/compat-exclusions.md"),
        )
        .args([
            "-m",
            "pytest",
            "-p",
            "compat_plugin",
            "-p",
            "no:cacheprovider",
        ])
        .args(["-q", "--tb=no", "-rN"]);
    if let Some(k) = &k {
        py.args(["-k", k]);
    }
    for f in &files {
        py.arg(format!("unit/test_{f}.py"));
    }
    // pytest's exit code says "some failed"; the table says which.
    let _ = run(&mut py);
    let text = std::fs::read_to_string(&results).unwrap_or_default();
    let sum = print_table(&tally(&text));
    let table = std::fs::read_to_string(r.join("tools/compat-exclusions.md"))
        .map_err(|e| format!("tools/compat-exclusions.md: {e}"))?;
    let known = known_failures(&table);
    let (mut unexpected, mut fixed) = (Vec::new(), Vec::new());
    for l in text.lines() {
        let mut f = l.splitn(3, '\t');
        let (Some(outcome), Some(id)) = (f.next(), f.next()) else {
            continue;
        };
        let listed = is_listed(&known, id);
        match outcome {
            "failed" if !listed => unexpected.push(l.trim_start_matches("failed\t")),
            "failed" => println!("known failure: {id}"),
            "passed" if listed => fixed.push(id),
            _ => {}
        }
    }
    for id in &fixed {
        println!("now passes (remove it from the known failures): {id}");
    }
    if sum.passed == 0 {
        return Err("no compat test ran".into());
    }
    if !unexpected.is_empty() {
        println!("\nfailed (not in the known failures):");
        for l in &unexpected {
            println!("  {l}");
        }
        return Err(format!("{} compat test(s) failed", unexpected.len()));
    }
    Ok(sum)
}

/// The id prefixes of the `## Known failures` table.
fn known_failures(md: &str) -> Vec<String> {
    md.split("## Known failures")
        .nth(1)
        .unwrap_or("")
        .lines()
        .filter_map(|l| {
            let (id, _) = l.strip_prefix("| `")?.split_once('`')?;
            Some(id.to_string())
        })
        .collect()
}

/// Whether the node id `id` (`unit/test_x.py::name[params]`) starts with a listed prefix.
fn is_listed(known: &[String], id: &str) -> bool {
    let short = id.strip_prefix("unit/").unwrap_or(id);
    known.iter().any(|k| short.starts_with(k.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_failures_come_from_their_own_table_only() {
        let md = "| `test_a.py::excluded` | why |\n## Known failures\n| id | what |\n| --- | --- |\n| `test_b.py::t[1` | x |\n";
        let k = known_failures(md);
        assert_eq!(k, vec!["test_b.py::t[1".to_string()]);
        assert!(is_listed(&k, "unit/test_b.py::t[1-2]"));
        assert!(!is_listed(&k, "unit/test_b.py::t[2]"));
        assert!(!is_listed(&k, "unit/test_a.py::excluded"));
    }

    #[test]
    fn tally_counts_outcomes_per_file_and_never_counts_excluded_as_passed() {
        let t = tally(
            "passed\tunit/test_basic.py::test_a\t\nfailed\tunit/test_basic.py::test_b\tx\n\
             excluded\tunit/test_basic.py::test_c[1]\twhy\nskipped\tunit/test_tokenize.py::t\t\n",
        );
        assert_eq!(
            t["test_basic.py"],
            Tally {
                passed: 1,
                failed: 1,
                skipped: 0,
                excluded: 1
            }
        );
        assert_eq!(t["test_tokenize.py"].skipped, 1);
    }
}
