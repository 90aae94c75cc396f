//! pinch-runtime-min: the engine.
//!
//! Everything that is a *decision* lives here: reading GGUF files, planning what stays
//! resident under the memory budget, the forward pass, tokenizers, sampling and the
//! commands. It is `#![no_std]` and needs no global allocator: all memory comes from one
//! region the [`Platform`] lends once, carved by an [`Arena`] into named accounts.
//!
//! - [`platform`]: the only door to the outside (files, memory, workers, clock, output).
//! - [`arena`]: the bump arena and its per-account budget bookkeeping.
//! - [`gguf`]: GGUF v2/v3 reader (zero-copy, every field checked) and writer.
//! - [`tokenizer`]: SentencePiece, BPE (byte-level and SentencePiece-style) and unigram
//!   tokenizers as llama.cpp runs them.
//! - [`chat`]: chat templates (ChatML, Gemma, Llama 3) rendered without allocation.
//! - [`fault`]: a `Platform` wrapper that injects I/O, memory and socket faults (tests).
//! - [`tune`]: `pinch tune`'s choice of settings from device measurements, and its
//!   profile file.
//!
//! This crate has no `unsafe`: byte-to-typed views go through `pinch_kernels::blocks`.
#![no_std]
#![forbid(unsafe_code)]

pub mod arena;
pub mod chat;
pub mod cli;
pub mod commands;
pub mod draft;
pub mod engine;
pub mod fault;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod guard;
pub mod head;
pub mod head_rank;
pub mod header_len;
pub mod inspect;
pub mod model;
pub mod mt19937;
pub mod pager;
pub mod platform;
pub mod repack_cache;
pub mod residency;
pub mod sampler;
pub mod server;
pub mod tokenizer;
pub mod tune;

pub use arena::{Arena, ArenaError};
pub use platform::Platform;
