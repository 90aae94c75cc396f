//! The 32-bit Mersenne Twister (`std::mt19937`, C++11 [rand.predef]) and the uniform
//! double libstdc++ draws from it.
//!
//! llama.cpp's `dist` sampler keeps a `std::mt19937` seeded with the request's seed and
//! draws one `std::uniform_real_distribution<double>(0, 1)` number per sampled token;
//! pinch draws the same numbers so that the same seed picks the same tokens.
//! Written from the algorithm's definition (Matsumoto and Nishimura 1998, the C++
//! standard's parameters), not from any implementation.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;

/// `std::mt19937`: 624 words of state, one 32-bit output a call.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    next: usize,
}

impl Mt19937 {
    /// The generator `std::mt19937(seed)` constructs (the standard's linear
    /// initialisation with multiplier 1812433253).
    pub fn new(seed: u32) -> Mt19937 {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, next: N }
    }

    /// Regenerate all 624 words (the "twist").
    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 0 { 0 } else { MATRIX_A };
            self.state[i] = self.state[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.next = 0;
    }

    /// The next output (`operator()`).
    pub fn next_u32(&mut self) -> u32 {
        if self.next >= N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        // Tempering.
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `std::uniform_real_distribution<double>(0.0, 1.0)(rng)` as libstdc++ computes it:
    /// `generate_canonical<double, 53>` takes ceil(53 / 32) = 2 outputs, adds them as
    /// `lo + hi * 2^32` in double (one rounding), divides by 2^64 (exact) and returns
    /// the largest double below 1 if the rounding reached 1; the distribution then
    /// scales by (1 - 0) and adds 0, which changes nothing.
    pub fn next_f64(&mut self) -> f64 {
        const TWO_32: f64 = 4_294_967_296.0;
        let lo = self.next_u32() as f64;
        let hi = self.next_u32() as f64;
        let r = (lo + hi * TWO_32) / (TWO_32 * TWO_32);
        if r >= 1.0 {
            // nextafter(1.0, 0.0)
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C++ standard ([rand.predef]): the 10000th consecutive invocation of a
    /// default-constructed `mt19937` (seed 5489) produces 4123659995.
    #[test]
    fn ten_thousandth_output_of_default_seed() {
        let mut g = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = g.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    /// The reference implementation's first outputs for seed 5489 (mt19937ar.c's
    /// `init_genrand(5489)`, the published test output's first values).
    #[test]
    fn first_outputs_of_default_seed() {
        let mut g = Mt19937::new(5489);
        let first: [u32; 3] = [g.next_u32(), g.next_u32(), g.next_u32()];
        assert_eq!(first, [3_499_211_612, 581_869_302, 3_890_346_734]);
    }

    /// `std::uniform_real_distribution<double> d(0.0f, 1.0f)` on `std::mt19937 g(seed)`,
    /// three draws each, printed with `%.17g` by a 3-line program built with g++ 12.2 /
    /// libstdc++ (Debian 12), the toolchain the llama-cpp-python oracle is built with.
    #[test]
    // The digits as printed (17 significant: each names its double exactly).
    #[allow(clippy::excessive_precision)]
    fn uniform_doubles_match_libstdcxx() {
        let cases: [(u32, [f64; 3]); 4] = [
            (
                0,
                [
                    0.59284461651668263,
                    0.84426574425659828,
                    0.85794561998982988,
                ],
            ),
            (
                42,
                [
                    0.79654298428784598,
                    0.18343478789336848,
                    0.77969099761266125,
                ],
            ),
            (
                1234,
                [
                    0.49766366630595166,
                    0.81783844288953322,
                    0.61211189358442275,
                ],
            ),
            (
                4_294_967_294,
                [
                    0.10184899170898529,
                    0.94789751258733013,
                    0.82893340139475558,
                ],
            ),
        ];
        for (seed, want) in cases {
            let mut g = Mt19937::new(seed);
            let got = [g.next_f64(), g.next_f64(), g.next_f64()];
            assert_eq!(got, want, "seed {seed}");
        }
    }

    #[test]
    fn canonical_double_is_two_words_over_two_to_the_64() {
        let mut a = Mt19937::new(42);
        let mut b = Mt19937::new(42);
        let lo = b.next_u32() as f64;
        let hi = b.next_u32() as f64;
        let x = a.next_f64();
        assert_eq!(
            x,
            (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0
        );
        assert!((0.0..1.0).contains(&x));
    }
}
