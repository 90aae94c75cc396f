//! Helpers shared by the commands: where things are and how to run a child process.
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub type Result<T> = std::result::Result<T, String>;

/// The workspace root (the parent of this crate's manifest directory).
pub fn root() -> PathBuf {
    let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask_dir.parent().unwrap_or(xtask_dir).to_path_buf()
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR` the way cargo does.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// A `cargo` command (the same cargo that runs us) in the workspace root.
pub fn cargo<I: IntoIterator<Item = &'static str>>(args: I) -> Command {
    let bin = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(bin);
    cmd.current_dir(root()).args(args);
    cmd
}

/// Is `tool` an executable somewhere on PATH?
pub fn have(tool: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
}

fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    // `$CARGO` is a long toolchain path; the file name says enough.
    let program = Path::new(cmd.get_program());
    s.push_str(
        &program
            .file_name()
            .unwrap_or(program.as_os_str())
            .to_string_lossy(),
    );
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Run `cmd` with inherited stdio; an unsuccessful exit is an error naming the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = describe(cmd);
    eprintln!("$ {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// Run `cmd` and return its stdout (stderr is shown), failing on a bad exit.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = describe(cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{shown}` failed ({})", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Test totals summed from libtest's `test result:` lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
}

impl Counts {
    pub fn add(&mut self, other: Counts) {
        self.passed += other.passed;
        self.failed += other.failed;
    }
}

/// Parse one libtest summary line, e.g.
/// `test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; ...`.
pub fn parse_result_line(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_status, fields) = rest.split_once(". ")?;
    let mut counts = Counts::default();
    for field in fields.split(';') {
        let mut words = field.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => counts.passed = n,
            "failed" => counts.failed = n,
            _ => {}
        }
    }
    Some(counts)
}

/// Run a `cargo test` command, streaming its output while summing the test counts.
/// Only stdout is captured (libtest prints there); cargo's own messages go to stderr.
pub fn run_tests(cmd: &mut Command) -> Result<Counts> {
    let shown = describe(cmd);
    eprintln!("$ {shown}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    let mut counts = Counts::default();
    if let Some(out) = child.stdout.take() {
        let stdout = std::io::stdout();
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading output of `{shown}`: {e}"))?;
            let _ = writeln!(stdout.lock(), "{line}");
            if let Some(c) = parse_result_line(&line) {
                counts.add(c);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for `{shown}`: {e}"))?;
    if status.success() {
        Ok(counts)
    } else {
        Err(format!(
            "`{shown}` failed ({status}; {} passed, {} failed before it stopped)",
            counts.passed, counts.failed
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summary_line() {
        let line = "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.02s";
        assert_eq!(
            parse_result_line(line),
            Some(Counts {
                passed: 12,
                failed: 0
            })
        );
    }

    #[test]
    fn parses_failed_summary_line() {
        let line = "test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out";
        assert_eq!(
            parse_result_line(line),
            Some(Counts {
                passed: 3,
                failed: 2
            })
        );
    }

    #[test]
    fn ignores_other_lines() {
        assert_eq!(parse_result_line("test foo ... ok"), None);
        assert_eq!(parse_result_line("running 3 tests"), None);
    }
}
