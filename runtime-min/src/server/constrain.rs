//! Constrained output in the server: the buffers a grammar needs (carved once at start)
//! and a request's `grammar` / `json_schema` / `response_format` turned into a parsed
//! grammar ([`crate::grammar`]), or a 400 that says what is wrong with it.
use super::jraw::Val;
use super::json::{self, Constraint, ToolChoice};
use crate::arena::{Arena, ArenaError};
use crate::commands::run::SliceWriter;
use crate::grammar::json_schema::{self, SchemaError};
use crate::grammar::parse::Parsed;
use crate::grammar::{parse, GrammarError, Matcher, MatcherBufs, SortedVocab, Store};
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

/// Bytes [`GrammarBufs::carve`] takes for a vocabulary of `n_vocab` tokens.
pub fn bytes(n_vocab: usize) -> usize {
    TEXT_BYTES
        + 4 * (ELEMS + SETS + RULES + 4 * RULES)
        + 4 * MatcherBufs::words(NODES, TOPS)
        + n_vocab * (4 + 2 + 4)
        + 8 * 64
}

/// Everything a constrained generation uses, lent by the arena once.
pub struct GrammarBufs<'a> {
    /// GBNF text written from a schema.
    pub text: &'a mut [u8],
    pub store: Store<'a>,
    pub nodes: &'a mut [u32],
    pub spare: &'a mut [u32],
    pub fwd: &'a mut [u32],
    pub tops: &'a mut [u32],
    pub vocab: SortedVocab<'a>,
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
            store: Store {
                elems: arena.slice::<u32>(a, ELEMS)?,
                sets: arena.slice::<u32>(a, SETS)?,
                rules: arena.slice::<u32>(a, RULES)?,
                work: arena.slice::<u32>(a, 4 * RULES)?,
            },
            nodes: arena.slice::<u32>(a, 2 * NODES)?,
            spare: arena.slice::<u32>(a, 2 * NODES)?,
            fwd: arena.slice::<u32>(a, NODES)?,
            tops: arena.slice::<u32>(a, TOPS)?,
            vocab: SortedVocab::build(tok, ids, lcp),
            masked: arena.slice::<f32>(a, n)?,
        })
    }

    /// Parse the grammar `c` asks for (`strs`: room to unescape a `grammar` string).
    /// `None` for no constraint.
    ///
    /// # Errors
    /// What is wrong with the grammar or schema.
    pub fn prepare(
        &mut self,
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
        parse(text, &mut self.store)
            .map(Some)
            .map_err(ConstraintError::Grammar)
    }

    /// Parse GBNF `text` as it is (`pinch run --grammar`, `--grammar-file`), or (with
    /// `schema`) the grammar of the JSON schema `text` (`--json-schema`).
    ///
    /// # Errors
    /// What is wrong with the grammar or schema.
    pub fn prepare_text(&mut self, text: &str, schema: bool) -> Result<Parsed, ConstraintError> {
        if !schema {
            return parse(text, &mut self.store).map_err(ConstraintError::Grammar);
        }
        let v = super::jraw::root(text.as_bytes()).ok_or(ConstraintError::Schema(
            SchemaError::NotASchema {
                at: "--json-schema",
            },
        ))?;
        let got = self.prepare(Constraint::Schema(v), None, &mut &mut [][..])?;
        got.ok_or(ConstraintError::Schema(SchemaError::NotASchema {
            at: "--json-schema",
        }))
    }

    /// A matcher at the start of the grammar `p` (parsed into this store), with the
    /// sorted vocabulary and the mask buffer beside it.
    pub fn split(&mut self, p: &Parsed) -> Option<(Matcher<'_, '_>, &SortedVocab<'a>, &mut [f32])> {
        let g = p.view(&self.store);
        let m = Matcher::new(
            g,
            MatcherBufs {
                nodes: &mut self.nodes[..],
                spare: &mut self.spare[..],
                fwd: &mut self.fwd[..],
                tops: &mut self.tops[..],
            },
        )
        .ok()?;
        Some((m, &self.vocab, &mut self.masked[..]))
    }
}
