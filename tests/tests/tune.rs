//! `pinch tune` in-process on the tiny Q8_0 llama ([`MemFs`]: settable available
//! memory, one worker): it writes a profile that `run --tune` reads (flags winning), it
//! refuses memory that holds no plan, and a bad profile is an error naming file and line.
use pinch_runtime_min::commands;
use pinch_runtime_min::tune::profile::Profile;
use pinch_tests::data_dir;
use pinch_tests::memfs::MemFs;

const MODEL: &str = "m.gguf";

fn platform() -> MemFs {
    let fs = MemFs::new();
    fs.put(
        MODEL,
        std::fs::read(data_dir().join("tiny/tiny-llama-Q8_0.gguf")).unwrap(),
    );
    fs
}

/// Exit code, stdout and stderr of `args` through `commands::main`.
fn run(p: &MemFs, args: &[&str]) -> (i32, String, String) {
    let mut region = vec![0u64; (64 << 20) / 8];
    let region = pinch_kernels::blocks::bytes_of_mut(&mut region[..]);
    let code = commands::main(p, args, region);
    let (out, err) = p.take_output();
    (code, out, err)
}

#[test]
fn tune_writes_a_profile_that_run_reads_and_flags_override() {
    let p = platform();
    let (code, out, err) = run(&p, &["tune", "-m", MODEL, "-o", "m.tune"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for step in [
        "[1/4] storage",
        "[2/4] memory",
        "[3/4] cpu: 1 cores",
        "[4/4] kernels",
    ] {
        assert!(err.contains(step), "{err}");
    }
    assert!(
        out.contains("recommended: pinch run -m m.gguf -t 1 "),
        "{out}"
    );
    assert!(out.contains("predicted: "), "{out}");
    let text = p.get("m.tune").expect("profile written");
    let prof = Profile::parse(&text).unwrap();
    assert_eq!(prof.threads, Some(1));
    assert_eq!(prof.model, Some(MODEL));
    let batch = prof.batch.unwrap();
    assert!(prof.budget.is_some() && prof.predicted_tps.unwrap() > 0.0);

    let gen = [
        "run", "-m", MODEL, "--tune", "m.tune", "-p", "hi", "-n", "2",
    ];
    let (code, _, err) = run(&p, &[&gen[..], &["--temp", "0", "-v"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("batch {batch},")), "{err}");
    assert!(
        err.contains("of budget"),
        "the profile's budget applies: {err}"
    );
    // A flag on the command line wins over the profile.
    let (code, _, err) = run(&p, &[&gen[..], &["-b", "3", "-v"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("batch 3,"), "{err}");
}

#[test]
fn memory_under_the_guard_floor_is_refused_with_what_was_usable() {
    let p = platform();
    *p.available.lock().unwrap() = Some(100 << 20); // under the 180 MiB floor
    let (code, _, err) = run(&p, &["tune", "-m", MODEL, "-o", "m.tune"]);
    assert_eq!(code, 1);
    assert!(err.contains("only 0 MiB is usable"), "{err}");
    assert!(p.get("m.tune").is_none());
    // With the guard off, the same memory is enough.
    let (code, out, err) = run(&p, &["tune", "-m", MODEL, "--guard", "0", "-o", "m.tune"]);
    assert_eq!(code, 0, "{out}\n{err}");
}

#[test]
fn a_bad_profile_names_its_file_and_line() {
    let p = platform();
    p.put("bad.tune", b"# ok\nthreads=1\nbudget=lots\n".to_vec());
    let (code, _, err) = run(&p, &["run", "-m", MODEL, "--tune", "bad.tune", "-p", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.tune: line 3: bad value"), "{err}");
    let (code, _, err) = run(&p, &["run", "-m", MODEL, "--tune", "none.tune"]);
    assert_eq!(code, 2);
    assert!(err.contains("none.tune: cannot open"), "{err}");
}
