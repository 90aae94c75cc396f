//! Constrained output in the server: the buffers a grammar needs (carved once at start)
//! and a request's `grammar` / `json_schema` / `response_format` turned into a parsed
//! grammar ([`crate::grammar`]), or a 400 that says what is wrong with it.
use super::jraw::Val;
use super::json::{self, Constraint, ToolChoice};
use crate::arena::{Arena, ArenaError};
use crate::commands::run::SliceWriter;
use crate::grammar::json_schema::{self, SchemaError};
use crate::grammar::matcher::Saved;
use crate::grammar::parse::Parsed;
use crate::grammar::{parse, Grammar, GrammarError, Matcher, MatcherBufs, SortedVocab, Store};
use crate::tokenizer::Tokenizer;

/// Longest GBNF text a schema may become.
pub const TEXT_BYTES: usize = 32 << 10;
/// Store capacities (elements, set words, rules).
pub const ELEMS: usize = 16 << 10;
pub const SETS: usize = 8 << 10;
pub const RULES: usize = 2 << 10;
/// Matcher capacities (nodes, stack tops).
pub const NODES: usize = 16 << 10;
pub const TOPS: usize = 8 << 10;

/// Bytes [`GrammarBufs::carve`] takes for a vocabulary of `n_vocab` tokens (shared by
/// all generation slots).
pub fn bytes(n_vocab: usize) -> usize {
    TEXT_BYTES + 4 * 4 * RULES + n_vocab * (4 + 2) + 8 * 64
}

/// Bytes [`SlotGrammar::carve`] takes for a vocabulary of `n_vocab` tokens (one per
/// generation slot: with 16 Ki nodes, 8 Ki stack tops and the store, 456 KiB plus 4
/// bytes per token).
pub fn slot_bytes(n_vocab: usize) -> usize {
    4 * (ELEMS + SETS + RULES) + 4 * MatcherBufs::words(NODES, TOPS) + n_vocab * 4 + 8 * 64
}

/// What constrained generation uses only while a grammar is prepared, or only reads:
/// lent by the arena once and shared by all generation slots.
pub struct GrammarBufs<'a> {
    /// GBNF text written from a schema.
    pub text: &'a mut [u8],
    /// The parser's scratch ([`Store::work`]).
    pub work: &'a mut [u32],
    pub vocab: SortedVocab<'a>,
}

/// What one constrained answer keeps while it runs: its parsed grammar, its matcher's
/// buffers and its masked logits (one set per generation slot, so that constrained
/// answers run in one batch, each with its own state).
#[derive(Default)]
pub struct SlotGrammar<'a> {
    /// The parsed grammar ([`Store::elems`], `sets`, `rules`).
    pub elems: &'a mut [u32],
    pub sets: &'a mut [u32],
    pub rules: &'a mut [u32],
    pub nodes: &'a mut [u32],
    pub spare: &'a mut [u32],
    pub fwd: &'a mut [u32],
    pub tops: &'a mut [u32],
    /// The masked logits (one vocabulary).
    pub masked: &'a mut [f32],
}

/// Why a request's constraint was refused (400).
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintError {
    Body(json::BodyError),
    Grammar(GrammarError),
    Schema(SchemaError),
}

impl core::fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConstraintError::Body(e) => write!(f, "{e}"),
            ConstraintError::Grammar(e) => write!(f, "{e}"),
            ConstraintError::Schema(e) => write!(f, "{e}"),
        }
    }
}

impl<'a> GrammarBufs<'a> {
    /// Carve the buffers and sort `tok`'s vocabulary.
    ///
    /// # Errors
    /// The arena is too small.
    pub fn carve(arena: &mut Arena<'a>, tok: &Tokenizer<'_>) -> Result<Self, ArenaError> {
        let a = "grammar";
        let n = tok.n_vocab() as usize;
        let ids = arena.slice::<u32>(a, n)?;
        let lcp = arena.slice::<u16>(a, n)?;
        Ok(GrammarBufs {
            text: arena.bytes(a, TEXT_BYTES)?,
            work: arena.slice::<u32>(a, 4 * RULES)?,
            vocab: SortedVocab::build(tok, ids, lcp),
        })
    }

    /// Parse the grammar `c` asks for into `slot` (`strs`: room to unescape a `grammar`
    /// string). `None` for no constraint.
    ///
    /// # Errors
    /// What is wrong with the grammar or schema.
    pub fn prepare(
        &mut self,
        slot: &mut SlotGrammar<'_>,
        c: Constraint<'_>,
        tool_call: Option<(Val<'_>, ToolChoice<'_>, super::tools::Format)>,
        strs: &mut &mut [u8],
    ) -> Result<Option<Parsed>, ConstraintError> {
        let mut w = SliceWriter {
            buf: &mut self.text[..],
            len: 0,
        };
        let text: &str = match c {
            Constraint::None => match tool_call {
                None => return Ok(None),
                Some((list, choice, fmt)) => {
                    super::tools::call_gbnf(&mut w, list, choice, fmt)
                        .map_err(ConstraintError::Schema)?;
                    core::str::from_utf8(&w.buf[..w.len]).unwrap_or("")
                }
            },
            Constraint::Grammar(g) => json::unescape(&g, strs).map_err(ConstraintError::Body)?,
            Constraint::AnyObject => {
                json_schema::any_object(&mut w).map_err(ConstraintError::Schema)?;
                core::str::from_utf8(&w.buf[..w.len]).unwrap_or("")
            }
            Constraint::Schema(s) => {
                json_schema::to_gbnf(s, &mut w).map_err(ConstraintError::Schema)?;
                core::str::from_utf8(&w.buf[..w.len]).unwrap_or("")
            }
        };
        parse(text, &mut slot.store(&mut self.work[..]))
            .map(Some)
            .map_err(ConstraintError::Grammar)
    }

    /// Parse GBNF `text` as it is (`pinch run --grammar`, `--grammar-file`), or (with
    /// `schema`) the grammar of the JSON schema `text` (`--json-schema`), into `slot`.
    ///
    /// # Errors
    /// What is wrong with the grammar or schema.
    pub fn prepare_text(
        &mut self,
        slot: &mut SlotGrammar<'_>,
        text: &str,
        schema: bool,
    ) -> Result<Parsed, ConstraintError> {
        if !schema {
            return parse(text, &mut slot.store(&mut self.work[..]))
                .map_err(ConstraintError::Grammar);
        }
        let v = super::jraw::root(text.as_bytes()).ok_or(ConstraintError::Schema(
            SchemaError::NotASchema {
                at: "--json-schema",
            },
        ))?;
        let got = self.prepare(slot, Constraint::Schema(v), None, &mut &mut [][..])?;
        got.ok_or(ConstraintError::Schema(SchemaError::NotASchema {
            at: "--json-schema",
        }))
    }
}

impl<'a> SlotGrammar<'a> {
    /// Carve one slot's buffers for a vocabulary of `n_vocab` tokens.
    ///
    /// # Errors
    /// The arena is too small.
    pub fn carve(arena: &mut Arena<'a>, n_vocab: usize) -> Result<Self, ArenaError> {
        let a = "grammar (per slot)";
        Ok(SlotGrammar {
            elems: arena.slice::<u32>(a, ELEMS)?,
            sets: arena.slice::<u32>(a, SETS)?,
            rules: arena.slice::<u32>(a, RULES)?,
            nodes: arena.slice::<u32>(a, 2 * NODES)?,
            spare: arena.slice::<u32>(a, 2 * NODES)?,
            fwd: arena.slice::<u32>(a, NODES)?,
            tops: arena.slice::<u32>(a, TOPS)?,
            masked: arena.slice::<f32>(a, n_vocab)?,
        })
    }

    /// The parser's view of this slot's grammar buffers, with the shared scratch `work`.
    fn store<'s>(&'s mut self, work: &'s mut [u32]) -> Store<'s> {
        Store {
            elems: &mut self.elems[..],
            sets: &mut self.sets[..],
            rules: &mut self.rules[..],
            work,
        }
    }

    /// A matcher of the grammar `p` (parsed into this slot): at its start, or (`at`)
    /// where it was saved from over these buffers, with the mask buffer beside it.
    /// `None` when the buffers cannot hold the start state.
    pub fn matcher(
        &mut self,
        p: &Parsed,
        at: Option<Saved>,
    ) -> Option<(Matcher<'_, '_>, &mut [f32])> {
        let g = Grammar {
            elems: self.elems.get(..p.n_elems)?,
            sets: self.sets.get(..p.n_sets)?,
            rules: self.rules.get(..p.n_rules)?,
            root: p.root,
        };
        let b = MatcherBufs {
            nodes: &mut self.nodes[..],
            spare: &mut self.spare[..],
            fwd: &mut self.fwd[..],
            tops: &mut self.tops[..],
        };
        let m = match at {
            None => Matcher::new(g, b),
            Some(s) => Matcher::resume(g, b, s),
        };
        Some((m.ok()?, &mut self.masked[..]))
    }
}
