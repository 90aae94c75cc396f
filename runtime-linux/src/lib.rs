//! pinch for Linux and Android: the system-call side of the engine.
//!
//! `pinch-runtime-min` decides everything and reaches the outside world only through its
//! `Platform` trait; this crate implements that trait with std (the binary `pinch`, in
//! `main.rs`, wires it to the command line).
//! - [`platform`]: [`LinuxPlatform`]: files (buffered and O_DIRECT reads), the arena
//!   region, `/proc` memory figures, CPU feature detection, clock and output.
//! - [`pool`]: the persistent worker pool behind `Platform::parallel`.
//! - [`net`]: non-blocking TCP sockets behind the `Platform` socket handles (`pinch serve`).
//!
//! `unsafe` is allowed here (an OS crate) and used in two places only: the pool's
//! lifetime erasure of the borrowed job and the leaked arena allocation, each with a
//! `// SAFETY:` note.
pub mod net;
pub mod platform;
pub mod pool;

pub use platform::LinuxPlatform;
