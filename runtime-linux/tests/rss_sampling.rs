//! The RSS sampler the `--budget` tests use (`rss_sampler`) sees what the process
//! reports about itself, and fails a budget it went over.
mod rss_sampler;

use std::process::Command;

#[test]
fn sampled_rss_matches_the_reported_peak_and_fails_a_smaller_budget() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/tiny/tiny-llama-Q8_0.gguf"
    );
    let (out, rss) = rss_sampler::output_sampled(Command::new(env!("CARGO_BIN_EXE_pinch")).args([
        "run",
        "-m",
        model,
        "-p",
        "Once upon a time",
        "-n",
        "64",
        "--ignore-eos",
        "--json",
        "-t",
        "1",
    ]));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap();
    let j: serde_json::Value = serde_json::from_str(line).unwrap();
    let peak = j["peak_rss"].as_u64().unwrap();
    eprintln!(
        "sampled max {} B over {} samples, reported peak {peak} B",
        rss.max, rss.samples
    );
    assert!(rss.samples > 0);
    // Samples can miss moments, and the process reads its VmHWM before it formats and
    // writes the JSON line, so a few pages touched after that read (CI saw 28 KiB) may
    // show in a late sample; anything beyond that allowance means the sampler and the
    // report disagree.
    const AFTER_REPORT: u64 = 256 << 10;
    assert!(
        rss.max <= peak + AFTER_REPORT && rss.max * 2 >= peak,
        "sampled {} vs peak {peak}",
        rss.max
    );
    rss.assert_under(peak + AFTER_REPORT, "pinch run");
    let over = std::panic::catch_unwind(|| rss.assert_under(rss.max - 1, "pinch run"));
    assert!(over.is_err(), "a budget below the sampled RSS must fail");
}
