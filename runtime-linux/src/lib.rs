//! pinch for Linux and Android: the system-call side of the engine.
//!
//! `pinch-runtime-min` decides everything and reaches the outside world only through its
//! `Platform` trait; this crate implements that trait with std (the binary `pinch`, in
//! `main.rs`, wires it to the command line).
//! - [`platform`]: [`LinuxPlatform`]: files (buffered and O_DIRECT reads), the arena
//!   region, `/proc` memory figures, CPU feature detection, clock and output.
//! - [`pool`]: the persistent worker pool behind `Platform::parallel`.
//! - [`readers`]: the persistent expert reader pool behind `Platform::with_readers`.
//! - [`net`]: non-blocking TCP sockets behind the `Platform` socket handles (`pinch serve`).
//!
//! `unsafe` is allowed here (an OS crate) and used only for the two pools'
//! lifetime erasure of the borrowed job, the leaked arena allocation and `madvise`, each with a
//! `// SAFETY:` note.
pub mod net;
pub mod platform;
pub mod pool;
pub mod readers;

pub use platform::LinuxPlatform;
