//! pinch for iOS: the system-call side of the engine, built as a static library.
//!
//! `pinch-runtime-min` reaches the outside world only through its `Platform` trait;
//! [`platform::IosPlatform`] implements it for iOS. An app (built and signed on a Mac, see
//! `README.md`) links `libpinch_ios.a` and drives the engine.
//!
//! What differs from Linux: uncached reads use `F_NOCACHE` (iOS has no `O_DIRECT`), the
//! memory guard must respect jetsam (iOS kills a process long before memory is "full"),
//! and CPU features come from sysctl (through std's feature detection). The worker pool is
//! the portable one from `pinch-linux`.
//!
//! The crate also compiles on Linux (the `F_NOCACHE` call is compiled only for Apple
//! targets), so `cargo clippy --workspace` checks it on any host.
pub mod memory;
pub mod platform;

pub use platform::IosPlatform;
