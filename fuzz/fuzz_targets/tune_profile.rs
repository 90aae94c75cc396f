//! Fuzz target for `pinch tune` profiles (`tune::profile::Profile::parse`, what
//! `--tune FILE` reads): any bytes. Checked: a parsed profile written back with
//! `Profile::write` parses to the same settings (the two recorded speeds are written
//! rounded, so they are compared to 0.005), and an error's message formats.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pinch_runtime_min::tune::profile::Profile;

fuzz_target!(|data: &[u8]| {
    match Profile::parse(data) {
        Ok(p) => {
            let mut text = String::new();
            p.write(&mut text).unwrap();
            let back = Profile::parse(text.as_bytes()).expect("a written profile parses");
            let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(x), Some(y)) => (x - y).abs() <= 0.005 + x.abs() * 1e-12,
                (None, None) => true,
                _ => false,
            };
            assert!(close(p.predicted_tps, back.predicted_tps));
            assert!(close(p.ceiling_tps, back.ceiling_tps));
            let (mut a, mut b) = (p, back);
            (a.predicted_tps, a.ceiling_tps) = (None, None);
            (b.predicted_tps, b.ceiling_tps) = (None, None);
            assert_eq!(a, b);
        }
        Err(e) => {
            let _ = format!("{e}");
        }
    }
});
