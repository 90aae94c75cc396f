//! A JSON schema -> GBNF text, for `response_format` and `json_schema`.
//!
//! The subset covered (what llama.cpp's `json-schema-to-grammar` tests use most):
//! `type` (one or a list of `object array string number integer boolean null`),
//! `properties` + `required` (required members first, in `properties` order, then the
//! optional ones, each optional, in order), `additionalProperties` without
//! `properties`, `items` (one schema, or a list: a tuple), `prefixItems`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `enum`, `const`, `anyOf`/`oneOf`,
//! local `$ref`s (`#/$defs/...`, `#/definitions/...`, recursion allowed), `true`/`{}`
//! (any value). `format`, `title`, `description`, `default`, `examples` are
//! annotations and do not constrain. Keywords that would constrain but are not
//! implemented (`pattern`, `minimum`, `maximum`, `multipleOf`, `allOf`, `not`, ...) are
//! refused with [`SchemaError::Unsupported`], never silently ignored: the output
//! always satisfies the schema as far as it was accepted.
//!
//! The value may be followed by whitespace (`space`, as llama.cpp's grammars allow), so
//! a model can end its answer in its own way.
use core::fmt::Write;

use crate::server::jraw::{root as json_root, Kind, Val};

/// Most `$ref` targets in one schema.
pub const MAX_REFS: usize = 32;
/// Most optional properties of one object (their grammar grows with the square).
pub const MAX_OPTIONAL: usize = 16;

/// Why a schema cannot become a grammar (answered with 400).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaError {
    /// A schema (or a sub-schema at `at`) is not an object or boolean.
    NotASchema { at: &'static str },
    /// `type` is not one of the JSON schema types (or a list of them).
    BadType,
    /// A keyword pinch does not enforce.
    Unsupported { keyword: &'static str },
    /// A `$ref` that is not a local definition of this schema.
    BadRef,
    /// The grammar does not fit the buffer (or too many refs).
    TooLarge,
}

impl core::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SchemaError::NotASchema { at } => write!(f, "JSON schema: '{at}' must be a schema (an object or a boolean)"),
            SchemaError::BadType => write!(f, "JSON schema: 'type' must be one of object, array, string, number, integer, boolean, null (or a list of them)"),
            SchemaError::Unsupported { keyword } => write!(f, "JSON schema: '{keyword}' is not supported by this server"),
            SchemaError::BadRef => write!(f, "JSON schema: '$ref' must point into this schema's '$defs' or 'definitions'"),
            SchemaError::TooLarge => write!(f, "JSON schema: the grammar it needs is too large for this server"),
        }
    }
}

impl core::error::Error for SchemaError {}

/// The rules every schema grammar may use (llama.cpp's primitives).
pub const PRIMITIVES: &str = r#"space ::= | " " | "\n" [ \t]{0,20}
boolean ::= ("true" | "false") space
null ::= "null" space
integral-part ::= [0] | [1-9] [0-9]{0,15}
decimal-part ::= [0-9]{1,16}
integer ::= ("-"? integral-part) space
number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\"" space
value ::= object | array | string | number | boolean | null
object ::= "{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space
array ::= "[" space ( value ( "," space value )* )? "]" space
"#;

const TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];
/// Keywords that constrain values and are not implemented.
const REFUSED: [&str; 14] = [
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "allOf",
    "not",
    "if",
    "patternProperties",
    "propertyNames",
    "contains",
    "uniqueItems",
    "dependentRequired",
];

struct Conv<'v, 'w> {
    root: Val<'v>,
    w: &'w mut dyn Write,
    refs: heapless::Vec<Val<'v>, MAX_REFS>,
}

/// Write the GBNF grammar for `schema` (with a `root` rule) to `w`.
///
/// # Errors
/// [`SchemaError`] naming what is not a schema or not supported.
pub fn to_gbnf(schema: Val<'_>, w: &mut dyn Write) -> Result<(), SchemaError> {
    let mut c = Conv {
        root: schema,
        w,
        refs: heapless::Vec::new(),
    };
    c.put("root ::= ")?;
    c.expr(schema, "schema")?;
    c.put("\n")?;
    let mut i = 0;
    while i < c.refs.len() {
        let target = c.refs[i];
        write!(c.w, "ref-{i} ::= ").map_err(|_| SchemaError::TooLarge)?;
        c.expr(target, "$ref")?;
        c.put("\n")?;
        i += 1;
    }
    c.put(PRIMITIVES)
}

/// Write the grammar expression for `schema` alone (for a rule written by the caller,
/// such as a tool's `arguments`); `$ref`s are refused here. `_prefix` is reserved for
/// naming the rules of local definitions.
///
/// # Errors
/// As [`to_gbnf`], and [`SchemaError::Unsupported`] for a `$ref`.
pub fn sub_schema(
    w: &mut dyn Write,
    schema: Val<'_>,
    _prefix: &dyn core::fmt::Display,
) -> Result<(), SchemaError> {
    let mut c = Conv {
        root: schema,
        w,
        refs: heapless::Vec::new(),
    };
    c.expr(schema, "parameters")?;
    if !c.refs.is_empty() {
        return Err(SchemaError::Unsupported {
            keyword: "$ref (in tool parameters)",
        });
    }
    Ok(())
}

/// The grammar of any JSON object (`response_format: {"type": "json_object"}`).
pub fn any_object(w: &mut dyn Write) -> Result<(), SchemaError> {
    w.write_str("root ::= object\n")
        .and_then(|_| w.write_str(PRIMITIVES))
        .map_err(|_| SchemaError::TooLarge)
}

/// Whether `s` is a string naming one of the schema types.
fn is_type(s: Val<'_>) -> bool {
    s.str().is_some_and(|t| TYPES.contains(&t.0))
}

/// Write the JSON text `v` as a GBNF literal (whitespace outside strings dropped).
pub fn write_literal(w: &mut dyn Write, v: Val<'_>) -> core::fmt::Result {
    w.write_char('"')?;
    let mut in_str = false;
    let mut esc = false;
    for &b in v.0 {
        if !in_str && matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else if b == b'"' {
            in_str = true;
        }
        match b {
            b'"' => w.write_str("\\\"")?,
            b'\\' => w.write_str("\\\\")?,
            0x20..=0x7E => w.write_char(b as char)?,
            _ => write!(w, "\\x{b:02X}")?,
        }
    }
    w.write_char('"')
}

impl<'v> Conv<'v, '_> {
    fn put(&mut self, s: &str) -> Result<(), SchemaError> {
        self.w.write_str(s).map_err(|_| SchemaError::TooLarge)
    }

    fn lit(&mut self, v: Val<'_>) -> Result<(), SchemaError> {
        write_literal(self.w, v).map_err(|_| SchemaError::TooLarge)?;
        self.put(" space")
    }

    /// The grammar expression (one parenthesized item) for schema `s`.
    fn expr(&mut self, s: Val<'v>, at: &'static str) -> Result<(), SchemaError> {
        match (s.kind(), s.bool()) {
            (Kind::Bool, Some(true)) => return self.put("value"),
            (Kind::Obj, _) => {}
            _ => return Err(SchemaError::NotASchema { at }),
        }
        for k in REFUSED {
            if let Some(v) = s.get(k) {
                // `uniqueItems: false` constrains nothing.
                if !(k == "uniqueItems" && v.bool() == Some(false)) {
                    return Err(SchemaError::Unsupported { keyword: k });
                }
            }
        }
        if let Some(r) = s.get("$ref") {
            return self.reference(r);
        }
        if let Some(c) = s.get("const") {
            self.put("(")?;
            self.lit(c)?;
            return self.put(")");
        }
        if let Some(e) = s.get("enum") {
            if e.kind() != Kind::Arr || e.items().next().is_none() {
                return Err(SchemaError::NotASchema { at: "enum" });
            }
            self.put("(")?;
            for (k, v) in e.items().enumerate() {
                if k > 0 {
                    self.put(" | ")?;
                }
                self.lit(v)?;
            }
            return self.put(")");
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = s.get(key) {
                if list.kind() != Kind::Arr || list.items().next().is_none() {
                    return Err(SchemaError::NotASchema { at: key });
                }
                self.put("(")?;
                for (k, v) in list.items().enumerate() {
                    if k > 0 {
                        self.put(" | ")?;
                    }
                    self.expr(v, key)?;
                }
                return self.put(")");
            }
        }
        match s.get("type") {
            Some(t) if t.kind() == Kind::Arr => {
                if t.items().next().is_none() || !t.items().all(is_type) {
                    return Err(SchemaError::BadType);
                }
                self.put("(")?;
                for (k, ty) in t.items().enumerate() {
                    if k > 0 {
                        self.put(" | ")?;
                    }
                    self.typed(s, ty.str().map_or("", |x| x.0))?;
                }
                self.put(")")
            }
            Some(t) if is_type(t) => self.typed(s, t.str().map_or("", |x| x.0)),
            Some(_) => Err(SchemaError::BadType),
            None if s.get("properties").is_some() || s.get("additionalProperties").is_some() => {
                self.typed(s, "object")
            }
            None if s.get("items").is_some() || s.get("prefixItems").is_some() => {
                self.typed(s, "array")
            }
            None => self.put("value"),
        }
    }

    fn reference(&mut self, r: Val<'v>) -> Result<(), SchemaError> {
        let path = r.str().ok_or(SchemaError::BadRef)?.0;
        let rest = path.strip_prefix("#/").ok_or(SchemaError::BadRef)?;
        let mut target = self.root;
        for part in rest.split('/') {
            target = target.get(part).ok_or(SchemaError::BadRef)?;
        }
        let k = match self
            .refs
            .iter()
            .position(|v| v.0.as_ptr() == target.0.as_ptr())
        {
            Some(k) => k,
            None => {
                self.refs.push(target).map_err(|_| SchemaError::TooLarge)?;
                self.refs.len() - 1
            }
        };
        write!(self.w, "ref-{k}").map_err(|_| SchemaError::TooLarge)
    }

    fn count(s: Val<'_>, key: &'static str) -> Result<Option<u32>, SchemaError> {
        match s.get(key) {
            None => Ok(None),
            Some(v) => match v.u32() {
                Some(n) if n <= super::parse::MAX_REPEAT => Ok(Some(n)),
                Some(_) => Err(SchemaError::TooLarge),
                None => Err(SchemaError::NotASchema { at: key }),
            },
        }
    }

    /// `{m,n}` after an item (nothing for {1,1}).
    fn reps(&mut self, min: u32, max: Option<u32>) -> Result<(), SchemaError> {
        let r = match max {
            Some(n) if n == min && n == 1 => return Ok(()),
            Some(n) => write!(self.w, "{{{min},{n}}}"),
            None => write!(self.w, "{{{min},}}"),
        };
        r.map_err(|_| SchemaError::TooLarge)
    }

    fn typed(&mut self, s: Val<'v>, ty: &str) -> Result<(), SchemaError> {
        match ty {
            "object" => self.object(s),
            "array" => self.array(s),
            "string" => {
                let (min, max) = (Self::count(s, "minLength")?, Self::count(s, "maxLength")?);
                if min.is_none() && max.is_none() {
                    return self.put("string");
                }
                let min = min.unwrap_or(0);
                if max.is_some_and(|m| m < min) {
                    return Err(SchemaError::NotASchema { at: "maxLength" });
                }
                self.put("(\"\\\"\" char")?;
                if max == Some(0) {
                    // No characters at all.
                    return self.put("{0,0} \"\\\"\" space)");
                }
                self.reps(min, max)?;
                self.put(" \"\\\"\" space)")
            }
            "number" => self.put("number"),
            "integer" => self.put("integer"),
            "boolean" => self.put("boolean"),
            _ => self.put("null"),
        }
    }

    fn member(&mut self, key: Val<'v>, value: Val<'v>) -> Result<(), SchemaError> {
        write_literal(self.w, key).map_err(|_| SchemaError::TooLarge)?;
        self.put(" space \":\" space ")?;
        self.expr(value, "properties")
    }

    fn object(&mut self, s: Val<'v>) -> Result<(), SchemaError> {
        let props = s.get("properties").filter(|p| p.kind() != Kind::Null);
        let extra = s.get("additionalProperties");
        let Some(props) = props.filter(|p| p.members().next().is_some()) else {
            // No named members: any object, or one whose values follow a schema.
            return match extra {
                Some(x) if x.kind() == Kind::Obj => {
                    self.put("(\"{\" space ( string \":\" space ")?;
                    self.expr(x, "additionalProperties")?;
                    self.put(" ( \",\" space string \":\" space ")?;
                    self.expr(x, "additionalProperties")?;
                    self.put(" )* )? \"}\" space)")
                }
                Some(x) if x.bool() == Some(false) => self.put("(\"{\" space \"}\" space)"),
                _ => self.put("object"),
            };
        };
        if props.kind() != Kind::Obj {
            return Err(SchemaError::NotASchema { at: "properties" });
        }
        if extra.is_some_and(|x| x.bool() != Some(false)) {
            return Err(SchemaError::Unsupported {
                keyword: "additionalProperties (beside properties)",
            });
        }
        let required = s.get("required");
        if required.is_some_and(|r| r.kind() != Kind::Arr) {
            return Err(SchemaError::NotASchema { at: "required" });
        }
        let is_required = |k: Val<'_>| required.is_some_and(|r| r.items().any(|x| x.0 == k.0));
        let mut optional: heapless::Vec<(Val<'v>, Val<'v>), MAX_OPTIONAL> = heapless::Vec::new();
        self.put("(\"{\" space ")?;
        let mut any_required = false;
        for (k, v) in props.members() {
            if is_required(k) {
                if any_required {
                    self.put(" \",\" space ")?;
                }
                self.member(k, v)?;
                any_required = true;
            } else {
                optional.push((k, v)).map_err(|_| SchemaError::TooLarge)?;
            }
        }
        if any_required {
            for &(k, v) in optional.iter() {
                self.put(" ( \",\" space ")?;
                self.member(k, v)?;
                self.put(" )?")?;
            }
        } else if !optional.is_empty() {
            // The first member present has no comma before it.
            self.put("( ")?;
            for first in 0..optional.len() {
                if first > 0 {
                    self.put(" | ")?;
                }
                let (k, v) = optional[first];
                self.member(k, v)?;
                for &(k, v) in optional[first + 1..].iter() {
                    self.put(" ( \",\" space ")?;
                    self.member(k, v)?;
                    self.put(" )?")?;
                }
            }
            self.put(" )?")?;
        }
        self.put(" \"}\" space)")
    }

    fn array(&mut self, s: Val<'v>) -> Result<(), SchemaError> {
        let tuple = s
            .get("prefixItems")
            .or_else(|| s.get("items").filter(|i| i.kind() == Kind::Arr));
        if let Some(t) = tuple {
            if t.kind() != Kind::Arr {
                return Err(SchemaError::NotASchema { at: "prefixItems" });
            }
            self.put("(\"[\" space ")?;
            for (k, item) in t.items().enumerate() {
                if k > 0 {
                    self.put(" \",\" space ")?;
                }
                self.expr(item, "items")?;
            }
            return self.put(" \"]\" space)");
        }
        let item = s.get("items");
        let (min, max) = (Self::count(s, "minItems")?, Self::count(s, "maxItems")?);
        if item.is_none() && min.is_none() && max.is_none() {
            return self.put("array");
        }
        let min = min.unwrap_or(0);
        if max.is_some_and(|m| m < min) {
            return Err(SchemaError::NotASchema { at: "maxItems" });
        }
        self.put("(\"[\" space ")?;
        if max == Some(0) {
            return self.put("\"]\" space)");
        }
        // First item, then the others after commas: {min-1, max-1} of them.
        let one = |c: &mut Self| match item {
            Some(i) => c.expr(i, "items"),
            None => c.put("value"),
        };
        self.put("(")?;
        one(self)?;
        self.put(" ( \",\" space ")?;
        one(self)?;
        self.put(" )")?;
        let more_max = max.map(|m| m - 1);
        match more_max {
            Some(n) => write!(self.w, "{{{},{n}}}", min.saturating_sub(1)),
            None => write!(self.w, "{{{},}}", min.saturating_sub(1)),
        }
        .map_err(|_| SchemaError::TooLarge)?;
        self.put(")")?;
        if min == 0 {
            self.put("?")?;
        }
        self.put(" \"]\" space)")
    }
}

/// Parse `text` as a JSON schema and write its grammar (for `--json-schema` on the
/// command line).
///
/// # Errors
/// [`SchemaError::NotASchema`] when `text` is not one JSON value.
pub fn text_to_gbnf(text: &str, w: &mut dyn Write) -> Result<(), SchemaError> {
    let v = json_root(text.as_bytes()).ok_or(SchemaError::NotASchema { at: "schema" })?;
    to_gbnf(v, w)
}
