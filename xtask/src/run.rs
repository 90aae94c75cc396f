//! `cargo xtask run -- <pinch args>`: build the host binary and run `pinch run` on the
//! test model, so trying a change is one command.
use crate::fetch;
use crate::util::{cargo, run, target_dir, Result};
use std::process::Command;

pub fn main(args: &[String]) -> Result<()> {
    let args = match args.first() {
        Some(sep) if sep == "--" => &args[1..],
        _ => args,
    };
    let model = if names_a_model(args) {
        None
    } else {
        Some(fetch::ensure("gemma3-270m")?)
    };
    run(&mut cargo(["build", "--release", "-p", "pinch-linux"]))?;
    let bin = target_dir().join("release/pinch");
    let mut cmd = Command::new(&bin);
    cmd.arg("run");
    if let Some(model) = model {
        cmd.arg("-m").arg(model);
    }
    cmd.args(args);
    exec(cmd)
}

/// Did the user pass `-m FILE`, `--model FILE` or `--model=FILE`?
fn names_a_model(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "-m" || a == "--model" || a.starts_with("--model="))
}

#[cfg(unix)]
fn exec(mut cmd: Command) -> Result<()> {
    use std::os::unix::process::CommandExt;
    // exec only returns on failure.
    let err = cmd.exec();
    Err(format!(
        "cannot run {}: {err}",
        cmd.get_program().to_string_lossy()
    ))
}

#[cfg(not(unix))]
fn exec(mut cmd: Command) -> Result<()> {
    let status = cmd.status().map_err(|e| format!("cannot run pinch: {e}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn recognises_every_model_flag_spelling() {
        assert!(names_a_model(&args(&["-m", "x.gguf", "-p", "hi"])));
        assert!(names_a_model(&args(&["--model", "x.gguf"])));
        assert!(names_a_model(&args(&["-p", "hi", "--model=x.gguf"])));
        assert!(!names_a_model(&args(&["-p", "hi", "-n", "8"])));
        assert!(!names_a_model(&args(&[])));
    }
}
