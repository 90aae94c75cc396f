//! The shipped device binary itself against llama.cpp's tiny goldens: `cargo xtask test`
//! cross-builds it (`cargo xtask build --device router-armv7`, static musl) and runs this
//! test with `PINCH_DEVICE_BIN` naming it and `PINCH_DEVICE_RUNNER` the emulator
//! (`qemu-arm`, the core from `QEMU_CPU`). Every fixture is run through `pinch logits`:
//! the f32 oracle (`--reference`) against the oracle goldens, and for quantized files
//! the fast path (the NEON kernels users run) batched and one token at a time against
//! `f32kv`, with the tolerances of `golden_tiny` (`pinch_tests::tiny`). Device binaries
//! are ARM builds, whose NEON kernels sum Q8_0/Q5_0 per block, so the fast path is
//! judged as ARM's is there.
use std::path::PathBuf;
use std::process::Command;

use pinch_tests::tiny::*;
use pinch_tests::*;

/// How the binary is started: `RUNNER BIN` or `BIN`.
struct Device {
    bin: PathBuf,
    runner: Option<String>,
    out_dir: PathBuf,
}

impl Device {
    fn from_env() -> Device {
        let bin = std::env::var_os("PINCH_DEVICE_BIN")
            .expect("PINCH_DEVICE_BIN must name the device binary (cargo xtask test sets it)");
        let out_dir = std::env::temp_dir().join(format!("pinch-device-{}", std::process::id()));
        std::fs::create_dir_all(&out_dir).unwrap();
        Device {
            bin: PathBuf::from(bin),
            runner: std::env::var("PINCH_DEVICE_RUNNER")
                .ok()
                .filter(|r| !r.is_empty()),
            out_dir,
        }
    }

    /// `pinch logits` of `tokens` on fixture `name` with `flags`; the rows it wrote.
    fn logits(&self, name: &str, tokens: &[u32], flags: &[&str]) -> Vec<Vec<f32>> {
        let out = self.out_dir.join(format!("{name}.f32"));
        let _ = std::fs::remove_file(&out);
        let ids: Vec<String> = tokens.iter().map(u32::to_string).collect();
        let model = data_dir().join("tiny").join(name);
        let mut cmd = match &self.runner {
            Some(r) => {
                let mut c = Command::new(r);
                c.arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.arg("logits")
            .arg("-m")
            .arg(&model)
            .args(["-p", &ids.join(","), "-o"])
            .arg(&out)
            .args(["-ctk", "f32", "-ctv", "f32", "--no-attn-skip"])
            .args(flags);
        let o = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        assert!(
            o.status.success(),
            "{name}: pinch logits {flags:?} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        read_rows(&out, N_VOCAB)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.out_dir);
    }
}

fn top1_mismatches(got: &[Vec<f32>], want: &[Vec<f32>]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(g, w)| argmax(g) != argmax(w))
        .count()
}

#[test]
#[ignore = "needs a cross-built device binary: cargo xtask test sets PINCH_DEVICE_BIN"]
fn device_binary_matches_llama_cpp_on_the_tiny_fixtures() {
    let dev = Device::from_env();
    let mut report = String::new();
    let mut failures = Vec::new();
    let mut runs = 0;
    for name in fixtures().into_iter().filter(|n| !pending_arch(n)) {
        let meta = Meta::load(&data_dir().join("tiny").join(format!("{name}.meta")));
        let tokens = meta.u32s("token_ids");
        let cfg = oracle_config(&name);
        let got = dev.logits(&name, &tokens, &["--reference", "-b", "24", "-t", "1"]);
        let want = golden(&name, cfg, "batched");
        let (w, top1_bad) = (worst(&got, &want), top1_mismatches(&got, &want));
        report += &format!("{name:32} oracle {cfg:14} {w}, top-1 mismatches {top1_bad}\n");
        if w.diff > oracle_tol(&name) || top1_bad > 0 {
            failures.push(format!(
                "{name} --reference against llama.cpp {cfg}: {w} (allowed {:.0e}), top-1 mismatches {top1_bad}",
                oracle_tol(&name)
            ));
        }
        runs += 1;
        if is_f32(&name) {
            continue;
        }
        for (batch, kind) in [("24", "batched"), ("1", "seq")] {
            let got = dev.logits(&name, &tokens, &["-b", batch, "-t", "2"]);
            let check = FastCheck::new(
                &got,
                &golden(&name, "f32kv", kind),
                &golden(&name, "dequant-f32kv", kind),
            );
            report += &format!("{name:32} fast -b {batch:2}          {check}\n");
            if !check.passes(true) {
                failures.push(format!(
                    "{name} fast path -b {batch} against llama.cpp f32kv {kind}: {check}"
                ));
            }
            runs += 1;
        }
    }
    println!("{}: {runs} runs\n{report}", dev.bin.display());
    assert!(runs >= 40, "only {runs} runs: fixtures missing?");
    assert!(
        failures.is_empty(),
        "{} differs from llama.cpp:\n{}",
        dev.bin.display(),
        failures.join("\n")
    );
}
