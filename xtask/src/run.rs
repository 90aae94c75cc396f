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
    let has_model = args
        .iter()
        .any(|a| a == "-m" || a == "--model" || a.starts_with("--model="));
    let model = if has_model {
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
