//! Drafts from a Qwen3.5 MTP block through the real binary: `--draft N` on a model
//! with one uses it (and says so with `-v`), the output is plain greedy decoding's,
//! `--spec-type lookup` keeps prompt lookup, and `--spec-type mtp` on a model without
//! a block says why and drafts by lookup.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn pinch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pinch"))
        .args(args)
        .output()
        .expect("run pinch")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// stdout and stderr of a greedy `run` of `model` with `extra` flags.
fn run(model: &Path, extra: &[&str]) -> (String, String) {
    let mut a = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "hello world the",
        "-n",
        "24",
        "--temp",
        "0",
        "--ignore-eos",
        "-v",
    ];
    a.extend_from_slice(extra);
    let o = pinch(&a);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "pinch {extra:?} failed: {err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

const MTP_LINE: &str = "drafts: the model's MTP block (blk.3)";

#[test]
fn mtp_drafts_through_the_binary_keep_greedy_output() {
    let model = repo().join("tests/data/tiny/mtp/F32.gguf");
    let (plain, err0) = run(&model, &["--draft", "0"]);
    assert!(!err0.contains(MTP_LINE), "{err0}");
    let (mtp, err1) = run(&model, &["--draft", "3"]);
    assert!(err1.contains(MTP_LINE), "{err1}");
    assert!(err1.contains("tokens drafted"), "{err1}");
    assert_eq!(mtp, plain, "MTP drafts changed the greedy output");
    let (lookup, err2) = run(&model, &["--draft", "3", "--spec-type", "lookup"]);
    assert!(!err2.contains(MTP_LINE), "{err2}");
    assert_eq!(lookup, plain);
}

#[test]
fn asking_for_mtp_drafts_without_a_block_says_why() {
    let model = repo().join("tests/data/tiny/tiny-qwen35-Q8_0.gguf");
    let (_, err) = run(&model, &["--draft", "3", "--spec-type", "mtp"]);
    assert!(
        err.contains(
            "no MTP drafts: the model has no MTP (nextn) block; prompt lookup drafts instead"
        ),
        "{err}"
    );
    let o = pinch(&["run", "-m", "x.gguf", "--spec-type", "eagle"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--spec-type"));
}

#[test]
fn a_block_that_does_not_load_costs_its_drafts_not_the_run() {
    let src = repo().join("tests/data/tiny/mtp/F32.gguf");
    let mut bytes = std::fs::read(&src).unwrap();
    // Rename one tensor of the block in the header (same length): `hnorm` goes missing.
    let from = b"blk.3.nextn.hnorm.weight";
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the fixture names blk.3.nextn.hnorm.weight");
    bytes[at + 12..at + 17].copy_from_slice(b"hnorX");
    let dir = std::env::temp_dir().join(format!("pinch-mtp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("broken-mtp.gguf");
    std::fs::write(&broken, &bytes).unwrap();
    let (plain, _) = run(&src, &["--draft", "0"]);
    let (out, err) = run(&broken, &["--draft", "3"]);
    assert!(
        err.contains("note: no MTP drafts: its block (blk.3) does not load")
            && err.contains("blk.3.nextn.hnorm.weight"),
        "{err}"
    );
    assert!(!err.contains(MTP_LINE), "{err}");
    assert_eq!(out, plain);
    let _ = std::fs::remove_dir_all(&dir);
}
