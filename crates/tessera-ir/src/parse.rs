//! The IR text parser: reads what `print::print` writes (grammar in `docs/ir.md`) and returns a
//! graph, or an error with line and column. It never panics, whatever the text.
//!
//! Hostile text cannot exhaust memory or the stack: every written type must pass
//! `TensorType::check_size` (element counts and byte sizes computed with checked arithmetic),
//! a constant declares at most [`MAX_CONSTANT_ELEMENTS`] elements (a splat is expanded in
//! memory, so `constant 1.0 : f32[100000000000]` would otherwise allocate 400 GB), and
//! attribute lists nest at most [`MAX_NESTING`] deep (the attribute parser recurses), and a
//! type has rank at most [`MAX_RANK`].
//!
//! `#` starts a location comment, kept on the node it ends; `//` starts a comment that is
//! ignored, as is a `#` comment on a line of its own.

use std::collections::HashMap;

use crate::gather::{GatherDims, IndexMode, ScatterDims, ScatterKind};
use crate::graph::{Graph, NodeId};
use crate::literal::{Data, Literal, bf16, f16};
use crate::op::{BinaryOp, CollectiveOp, CompareOp, DotDims, Op, ReduceKind, UnaryOp};
use crate::region::{MAX_REGION_DEPTH, RegionOp};
use crate::sharding::{AxisType, DimSharding, Mesh, Sharding};
use crate::types::{DType, TensorType};

/// The most elements one `constant` may declare (16,777,216: 64 MiB of f32). A larger value
/// belongs in a parameter.
pub const MAX_CONSTANT_ELEMENTS: usize = 1 << 24;

/// The largest rank of a written type (NumPy's limit).
pub const MAX_RANK: usize = 64;

/// The deepest nesting of `[` in one attribute value.
pub const MAX_NESTING: usize = 64;

/// Malformed IR text, located by 1-based line and column.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// Parses one module: an optional mesh line and one function.
pub fn parse(text: &str) -> Result<Graph, ParseError> {
    let mut p = Parser {
        chars: text.chars().collect(),
        pos: 0,
        depth: 0,
        regions: 0,
    };
    p.module()
}

#[derive(Clone, Debug)]
enum Attr {
    Int(i64),
    Str(String),
    List(Vec<Attr>),
    /// `[..]x[..]`, the lhs and rhs halves of dot dimension numbers.
    Cross(Vec<Attr>, Vec<Attr>),
    Sharding(Sharding),
    /// A scalar literal element as written.
    Word(String),
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
    /// How many attribute lists enclose the current position.
    depth: usize,
    /// How many regions enclose the current position.
    regions: usize,
}

type PResult<T> = Result<T, ParseError>;

impl Parser {
    fn error_at(&self, pos: usize, message: impl Into<String>) -> ParseError {
        let pos = pos.min(self.chars.len());
        let before = &self.chars[..pos];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let col = pos - before.iter().rposition(|&c| c == '\n').map_or(0, |i| i + 1) + 1;
        ParseError {
            line,
            col,
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        self.error_at(self.pos, message)
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.pos + k).copied()
    }

    /// Skips blanks, newlines and `//` comments, and `#` comments that stand on a line of their
    /// own (a `#` after code on the same line is a location and is left for the caller).
    fn skip_space(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => self.pos += 1,
                Some('/') if self.peek_at(1) == Some('/') => self.skip_line(),
                Some('#') if self.at_line_start() => self.skip_line(),
                _ => return,
            }
        }
    }

    /// Skips blanks on the current line only.
    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
            self.pos += 1;
        }
    }

    fn at_line_start(&self) -> bool {
        self.chars[..self.pos]
            .iter()
            .rev()
            .take_while(|&&c| c != '\n')
            .all(|c| c.is_whitespace())
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                break;
            }
            self.pos += 1;
        }
    }

    /// A `# text` comment to the end of the line, if one follows on this line (its
    /// `[sharding: ...]` tail, the node's `why`, is split off by `split_why`).
    fn location(&mut self) -> Option<String> {
        self.skip_blanks();
        if self.peek() != Some('#') {
            return None;
        }
        self.pos += 1;
        let start = self.pos;
        self.skip_line();
        let text: String = self.chars[start..self.pos].iter().collect();
        Some(text.trim().to_string())
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> PResult<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error(format!("expected '{c}'{}", self.found())))
        }
    }

    fn found(&self) -> String {
        match self.peek() {
            Some(c) => format!(", found '{c}'"),
            None => ", found the end of the text".into(),
        }
    }

    fn ident(&mut self) -> PResult<String> {
        self.skip_space();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                self.pos += 1;
            } else {
                break;
            }
        }
        if start == self.pos || self.chars[start].is_ascii_digit() {
            self.pos = start;
            return Err(self.error(format!("expected a name{}", self.found())));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn keyword(&mut self, kw: &str) -> PResult<()> {
        let at = {
            self.skip_space();
            self.pos
        };
        match self.ident() {
            Ok(w) if w == kw => Ok(()),
            _ => Err(self.error_at(at, format!("expected '{kw}'"))),
        }
    }

    fn symbol_name(&mut self) -> PResult<String> {
        self.expect('@')?;
        self.ident()
    }

    /// `%name`: a value name (digits or an identifier).
    fn value_name(&mut self) -> PResult<String> {
        self.expect('%')?;
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                self.pos += 1;
            } else {
                break;
            }
        }
        if start == self.pos {
            return Err(self.error("expected a value name after '%'"));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn uint(&mut self) -> PResult<usize> {
        let at = {
            self.skip_space();
            self.pos
        };
        match self.int()? {
            n if n >= 0 => Ok(n as usize),
            n => Err(self.error_at(at, format!("expected a non-negative integer, found {n}"))),
        }
    }

    fn int(&mut self) -> PResult<i64> {
        self.skip_space();
        let start = self.pos;
        if self.peek() == Some('-') {
            self.pos += 1;
        }
        while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
            self.pos += 1;
        }
        let text: String = self.chars[start..self.pos].iter().collect();
        text.parse().map_err(|_| {
            self.pos = start;
            self.error(format!("expected an integer{}", self.found()))
        })
    }

    fn string(&mut self) -> PResult<String> {
        self.expect('"')?;
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c == '"' {
                let s = self.chars[start..self.pos].iter().collect();
                self.pos += 1;
                return Ok(s);
            }
            if c == '\n' {
                break;
            }
            self.pos += 1;
        }
        Err(self.error_at(start, "unterminated string"))
    }

    /// A scalar literal element: everything up to a delimiter.
    fn word(&mut self) -> PResult<String> {
        self.skip_space();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, ',' | '[' | ']' | ':' | '#' | '<' | '>') {
                break;
            }
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(format!("expected a value{}", self.found())));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn module(&mut self) -> PResult<Graph> {
        self.skip_space();
        let mut mesh = None;
        while self.starts_with("mesh") {
            let at = self.pos;
            let m = self.mesh()?;
            if mesh.is_some() {
                return Err(self.error_at(at, "a module declares at most one mesh"));
            }
            mesh = Some(m);
            self.skip_space();
        }
        let g = self.func(mesh)?;
        self.skip_space();
        if self.peek().is_some() {
            return Err(self.error("expected the end of the text after the function"));
        }
        Ok(g)
    }

    fn starts_with(&self, word: &str) -> bool {
        let w: Vec<char> = word.chars().collect();
        self.chars[self.pos..].starts_with(&w)
            && !matches!(self.chars.get(self.pos + w.len()), Some(c) if c.is_ascii_alphanumeric() || *c == '_')
    }

    fn mesh(&mut self) -> PResult<Mesh> {
        self.keyword("mesh")?;
        let name = self.symbol_name()?;
        self.expect('=')?;
        self.expect('<')?;
        let mut axes: Vec<(String, usize)> = Vec::new();
        let mut types = Vec::new();
        if !self.eat('>') {
            loop {
                let at = {
                    self.skip_space();
                    self.pos
                };
                let axis = self.string()?;
                if axes.iter().any(|(a, _)| *a == axis) {
                    return Err(
                        self.error_at(at, format!("mesh axis \"{axis}\" is declared twice"))
                    );
                }
                self.expect('=')?;
                let size = self.uint()?;
                if size == 0 {
                    return Err(self.error_at(at, format!("mesh axis \"{axis}\" has size 0")));
                }
                axes.push((axis, size));
                self.skip_space();
                types.push(if self.starts_with("explicit") {
                    self.keyword("explicit")?;
                    AxisType::Explicit
                } else if self.starts_with("manual") {
                    self.keyword("manual")?;
                    AxisType::Manual
                } else {
                    AxisType::Auto
                });
                if self.eat('>') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(Mesh::new(name, axes).with_types(types))
    }

    fn dtype(&mut self) -> PResult<DType> {
        let at = {
            self.skip_space();
            self.pos
        };
        let name = self.ident()?;
        DType::from_name(&name)
            .ok_or_else(|| self.error_at(at, format!("unknown element type '{name}'")))
    }

    fn tensor_type(&mut self) -> PResult<TensorType> {
        let at = {
            self.skip_space();
            self.pos
        };
        let dtype = self.dtype()?;
        if self.peek() != Some('[') {
            return Err(self.error(format!(
                "expected '[' right after the element type{}",
                self.found()
            )));
        }
        let dims = self.uint_list()?;
        if dims.len() > MAX_RANK {
            return Err(self.error_at(
                at,
                format!("a type of rank {} (the limit is {MAX_RANK})", dims.len()),
            ));
        }
        let ty = TensorType::new(dtype, dims);
        ty.check_size().map_err(|m| self.error_at(at, m))?;
        Ok(ty)
    }

    fn uint_list(&mut self) -> PResult<Vec<usize>> {
        self.expect('[')?;
        let mut v = Vec::new();
        if self.eat(']') {
            return Ok(v);
        }
        loop {
            v.push(self.uint()?);
            if self.eat(']') {
                return Ok(v);
            }
            self.expect(',')?;
        }
    }

    fn axis_set(&mut self) -> PResult<DimSharding> {
        self.expect('{')?;
        let mut d = DimSharding::default();
        loop {
            if self.eat('}') {
                return Ok(d);
            }
            if self.eat('?') {
                d.open = true;
            } else {
                if d.open {
                    return Err(self.error("'?' must come last in an axis list"));
                }
                d.axes.push(self.string()?);
            }
            if self.eat('}') {
                return Ok(d);
            }
            self.expect(',')?;
        }
    }

    fn sharding(&mut self) -> PResult<Sharding> {
        self.expect('<')?;
        let mesh = self.symbol_name()?;
        self.expect(',')?;
        self.expect('[')?;
        let mut dims = Vec::new();
        if !self.eat(']') {
            loop {
                dims.push(self.axis_set()?);
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let (mut replicated, mut unreduced) = (Vec::new(), Vec::new());
        while self.eat(',') {
            self.skip_space();
            let which = if self.starts_with("replicated") {
                self.keyword("replicated")?;
                "replicated"
            } else {
                self.keyword("unreduced")?;
                "unreduced"
            };
            self.expect('=')?;
            let set = self.axis_set()?;
            if set.open {
                return Err(self.error(format!("the {which} axes cannot be open")));
            }
            match which {
                "replicated" => replicated = set.axes,
                _ => unreduced = set.axes,
            }
        }
        self.expect('>')?;
        Ok(Sharding {
            mesh,
            dims,
            replicated,
            unreduced,
        })
    }

    fn optional_sharding(&mut self) -> PResult<Option<Sharding>> {
        self.skip_blanks();
        if self.peek() == Some('<') {
            Ok(Some(self.sharding()?))
        } else {
            Ok(None)
        }
    }

    fn func(&mut self, mesh: Option<Mesh>) -> PResult<Graph> {
        self.keyword("func")?;
        let name = self.symbol_name()?;
        self.func_rest(name, mesh)
    }

    /// One region of a region op: `label(params) { ... return ... }`, at most
    /// [`MAX_REGION_DEPTH`] deep.
    fn region(&mut self, label: &str, mesh: Option<Mesh>) -> PResult<Graph> {
        self.skip_space();
        if self.regions >= MAX_REGION_DEPTH {
            return Err(self.error(format!(
                "regions nest deeper than {MAX_REGION_DEPTH} levels"
            )));
        }
        self.keyword(label)?;
        self.regions += 1;
        let g = self.func_rest(label.to_string(), mesh);
        self.regions -= 1;
        g
    }

    /// The parameters and body of a function or region, after its name.
    fn func_rest(&mut self, name: String, mesh: Option<Mesh>) -> PResult<Graph> {
        let mut g = Graph::new(name);
        g.mesh = mesh;
        let mut names: HashMap<String, NodeId> = HashMap::new();
        self.expect('(')?;
        loop {
            if self.eat(')') {
                break;
            }
            let at = {
                self.skip_space();
                self.pos
            };
            let v = self.value_name()?;
            self.expect(':')?;
            let ty = self.tensor_type()?;
            let sharding = self.optional_sharding()?;
            let id = g.add_param(ty);
            g.node_mut(id).sharding = sharding;
            if names.insert(v.clone(), id).is_some() {
                return Err(self.error_at(at, format!("%{v} is defined twice")));
            }
            let comma = self.eat(',');
            let (loc, why) = split_why(self.location());
            g.node_mut(id).loc = loc;
            g.node_mut(id).why = why;
            if !comma {
                self.expect(')')?;
                break;
            }
        }
        self.expect('{')?;
        loop {
            self.skip_space();
            if self.starts_with("return") {
                self.keyword("return")?;
                let mut outs = Vec::new();
                self.skip_blanks();
                if self.peek() == Some('%') {
                    loop {
                        outs.push(self.use_value(&names)?);
                        self.skip_blanks();
                        if self.peek() != Some(',') {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                g.set_outputs(outs);
                self.expect('}')?;
                return Ok(g);
            }
            self.statement(&mut g, &mut names)?;
        }
    }

    fn use_value(&mut self, names: &HashMap<String, NodeId>) -> PResult<NodeId> {
        let at = {
            self.skip_space();
            self.pos
        };
        let v = self.value_name()?;
        names
            .get(&v)
            .copied()
            .ok_or_else(|| self.error_at(at, format!("%{v} is used before it is defined")))
    }

    fn statement(&mut self, g: &mut Graph, names: &mut HashMap<String, NodeId>) -> PResult<()> {
        let start = {
            self.skip_space();
            self.pos
        };
        let v = self.value_name()?;
        if names.contains_key(&v) {
            return Err(self.error_at(start, format!("%{v} is defined twice")));
        }
        self.expect('=')?;
        let op_at = {
            self.skip_space();
            self.pos
        };
        let mnemonic = self.ident()?;
        let mut operands = Vec::new();
        self.skip_blanks();
        if self.peek() == Some('%') {
            loop {
                operands.push(self.use_value(names)?);
                self.skip_blanks();
                if self.peek() != Some(',') {
                    break;
                }
                self.pos += 1;
            }
        }
        let mut kind: Option<String> = None;
        let mut attrs: Vec<(String, Attr)> = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(':') => break,
                Some('[') if mnemonic == "constant" => {
                    attrs.push(("value".into(), self.attr_value()?))
                }
                Some(c)
                    if mnemonic == "constant"
                        && (c == '-' || c == '+' || c.is_ascii_alphanumeric()) =>
                {
                    attrs.push(("value".into(), Attr::Word(self.word()?)))
                }
                Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                    let at = self.pos;
                    let key = self.ident()?;
                    if self.eat('=') {
                        let val = self.attr_value()?;
                        if attrs.iter().any(|(k, _)| *k == key) {
                            return Err(
                                self.error_at(at, format!("attribute '{key}' is given twice"))
                            );
                        }
                        attrs.push((key, val));
                    } else if kind.is_none() {
                        kind = Some(key);
                    } else {
                        return Err(self.error_at(at, format!("unexpected word '{key}'")));
                    }
                }
                _ => {
                    return Err(self.error(format!("expected an attribute or ':'{}", self.found())));
                }
            }
        }
        self.expect(':')?;
        if let Some(labels) = region_labels(&mnemonic) {
            return self.region_statement(
                g,
                names,
                (v, op_at),
                &mnemonic,
                labels,
                kind,
                &attrs,
                operands,
            );
        }
        let ty = self.tensor_type()?;
        let sharding = self.optional_sharding()?;
        let loc = self.location();
        let op = build_op(&mnemonic, kind.as_deref(), &attrs, &ty)
            .map_err(|m| self.error_at(op_at, format!("{mnemonic}: {m}")))?;
        let id = g
            .add(op, &operands)
            .map_err(|e| self.error_at(op_at, e.to_string()))?;
        if *g.ty(id) != ty {
            return Err(self.error_at(
                op_at,
                format!(
                    "{mnemonic}: the result is written {ty} but the type rule gives {}",
                    g.ty(id)
                ),
            ));
        }
        let node = g.node_mut(id);
        node.sharding = sharding;
        (node.loc, node.why) = split_why(loc);
        names.insert(v, id);
        Ok(())
    }

    /// The rest of a region op's statement after its `:`: the result types in parentheses, the
    /// node's sharding (as the printer writes it), the location, then its regions.
    #[allow(clippy::too_many_arguments)]
    fn region_statement(
        &mut self,
        g: &mut Graph,
        names: &mut HashMap<String, NodeId>,
        (v, op_at): (String, usize),
        mnemonic: &str,
        labels: &[&str],
        kind: Option<String>,
        attrs: &[(String, Attr)],
        operands: Vec<NodeId>,
    ) -> PResult<()> {
        self.expect('(')?;
        let mut types = Vec::new();
        if !self.eat(')') {
            loop {
                types.push(self.tensor_type()?);
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let sharding = self.optional_sharding()?;
        let loc = self.location();
        let mut bodies = Vec::new();
        for label in labels {
            bodies.push(self.region(label, g.mesh.clone())?);
        }
        if mnemonic == "case" {
            loop {
                self.skip_space();
                if !self.starts_with("branch") {
                    break;
                }
                bodies.push(self.region("branch", g.mesh.clone())?);
            }
        }
        let op = build_region(mnemonic, kind.as_deref(), attrs, bodies)
            .map_err(|m| self.error_at(op_at, format!("{mnemonic}: {m}")))?;
        let id = g
            .add(Op::Region(Box::new(op)), &operands)
            .map_err(|e| self.error_at(op_at, e.to_string()))?;
        let have = g
            .result_types(id)
            .map_err(|e| self.error_at(op_at, e.to_string()))?;
        if have != types {
            let text: Vec<String> = have.iter().map(|t| t.to_string()).collect();
            return Err(self.error_at(
                op_at,
                format!(
                    "{mnemonic}: the results are written ({}) but the regions give ({})",
                    types
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    text.join(", ")
                ),
            ));
        }
        let node = g.node_mut(id);
        node.sharding = sharding;
        (node.loc, node.why) = split_why(loc);
        names.insert(v, id);
        Ok(())
    }

    /// The items of a list after its `[`, through its `]`.
    fn attr_items(&mut self) -> PResult<Vec<Attr>> {
        let mut items = Vec::new();
        if !self.eat(']') {
            loop {
                items.push(self.attr_value()?);
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        Ok(items)
    }

    fn attr_value(&mut self) -> PResult<Attr> {
        self.skip_space();
        match self.peek() {
            Some('[') => {
                if self.depth >= MAX_NESTING {
                    return Err(self.error(format!(
                        "attribute lists nest deeper than {MAX_NESTING} levels"
                    )));
                }
                self.pos += 1;
                self.depth += 1;
                let items = self.attr_items();
                self.depth -= 1;
                let items = items?;
                if self.peek() == Some('x') && self.peek_at(1) == Some('[') {
                    self.pos += 1;
                    let Attr::List(rhs) = self.attr_value()? else {
                        return Err(self.error("expected a list after 'x'"));
                    };
                    return Ok(Attr::Cross(items, rhs));
                }
                Ok(Attr::List(items))
            }
            Some('"') => Ok(Attr::Str(self.string()?)),
            Some('<') => Ok(Attr::Sharding(self.sharding()?)),
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let at = self.pos;
                let w = self.word()?;
                match w.parse::<i64>() {
                    Ok(n) => Ok(Attr::Int(n)),
                    Err(_) => {
                        self.pos = at + w.chars().count();
                        Ok(Attr::Word(w))
                    }
                }
            }
            Some(c) if c.is_ascii_alphabetic() => Ok(Attr::Word(self.word()?)),
            _ => Err(self.error(format!("expected an attribute value{}", self.found()))),
        }
    }
}

fn get<'a>(attrs: &'a [(String, Attr)], key: &str) -> Option<&'a Attr> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn need<'a>(attrs: &'a [(String, Attr)], key: &str) -> Result<&'a Attr, String> {
    get(attrs, key).ok_or_else(|| format!("missing attribute '{key}'"))
}

fn as_int(a: &Attr, key: &str) -> Result<i64, String> {
    match a {
        Attr::Int(n) => Ok(*n),
        _ => Err(format!("attribute '{key}' must be an integer")),
    }
}

fn as_uint(a: &Attr, key: &str) -> Result<usize, String> {
    usize::try_from(as_int(a, key)?).map_err(|_| format!("attribute '{key}' must be non-negative"))
}

fn as_list<'a>(a: &'a Attr, key: &str) -> Result<&'a [Attr], String> {
    match a {
        Attr::List(v) => Ok(v),
        _ => Err(format!("attribute '{key}' must be a list")),
    }
}

fn uints(items: &[Attr], key: &str) -> Result<Vec<usize>, String> {
    items.iter().map(|a| as_uint(a, key)).collect()
}

fn ints(items: &[Attr], key: &str) -> Result<Vec<i64>, String> {
    items.iter().map(|a| as_int(a, key)).collect()
}

fn uint_attr(attrs: &[(String, Attr)], key: &str) -> Result<usize, String> {
    as_uint(need(attrs, key)?, key)
}

fn uint_list_attr(attrs: &[(String, Attr)], key: &str) -> Result<Vec<usize>, String> {
    uints(as_list(need(attrs, key)?, key)?, key)
}

fn axes_attr(attrs: &[(String, Attr)]) -> Result<Vec<String>, String> {
    as_list(need(attrs, "axes")?, "axes")?
        .iter()
        .map(|a| match a {
            Attr::Str(s) => Ok(s.clone()),
            _ => Err("attribute 'axes' must list quoted mesh axis names".to_string()),
        })
        .collect()
}

fn reduce_kind(kind: Option<&str>) -> Result<ReduceKind, String> {
    let k = kind.ok_or("missing the reduction (sum, max or min)")?;
    ReduceKind::from_name(k).ok_or_else(|| format!("unknown reduction '{k}'"))
}

fn parse_element(dtype: DType, w: &str) -> Result<f64, String> {
    let bad = || format!("'{w}' is not a {dtype} value");
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => w.parse::<f64>().map_err(|_| bad()),
        DType::I32 => w.parse::<i32>().map(f64::from).map_err(|_| bad()),
        DType::I64 => w.parse::<i64>().map(|x| x as f64).map_err(|_| bad()),
        DType::U32 => w.parse::<u32>().map(f64::from).map_err(|_| bad()),
        DType::Bool => match w {
            "true" => Ok(1.0),
            "false" => Ok(0.0),
            _ => Err(bad()),
        },
    }
}

/// Builds a constant's elements from their text. Floats parse straight into their own width, so
/// an f32 goes through no double rounding.
fn literal(value: &Attr, ty: &TensorType) -> Result<Literal, String> {
    let words: Vec<String> = match value {
        Attr::Word(w) => vec![w.clone()],
        Attr::List(items) => items
            .iter()
            .map(|a| match a {
                Attr::Word(w) => Ok(w.clone()),
                Attr::Int(n) => Ok(n.to_string()),
                _ => Err("a constant's list holds scalar elements only".to_string()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("expected a constant value".into()),
    };
    let n = ty.numel();
    if n > MAX_CONSTANT_ELEMENTS {
        return Err(format!(
            "{ty} declares {n} elements, more than the {MAX_CONSTANT_ELEMENTS} a constant may hold"
        ));
    }
    let splat = matches!(value, Attr::Word(_));
    if !splat && words.len() != n {
        return Err(format!("{} elements written for {ty}", words.len()));
    }
    for w in &words {
        parse_element(ty.dtype, w)?;
    }
    let pick = |i: usize| {
        if splat {
            words[0].as_str()
        } else {
            words[i].as_str()
        }
    };
    let bad = |w: &str| format!("'{w}' is not a {} value", ty.dtype);
    let data = match ty.dtype {
        DType::F32 => Data::F32(
            (0..n)
                .map(|i| pick(i).parse::<f32>().map_err(|_| bad(pick(i))))
                .collect::<Result<_, _>>()?,
        ),
        DType::F64 => Data::F64(
            (0..n)
                .map(|i| pick(i).parse::<f64>().map_err(|_| bad(pick(i))))
                .collect::<Result<_, _>>()?,
        ),
        DType::I32 => Data::I32(
            (0..n)
                .map(|i| pick(i).parse::<i32>().map_err(|_| bad(pick(i))))
                .collect::<Result<_, _>>()?,
        ),
        DType::U32 => Data::U32(
            (0..n)
                .map(|i| pick(i).parse::<u32>().map_err(|_| bad(pick(i))))
                .collect::<Result<_, _>>()?,
        ),
        DType::Bool => Data::Bool((0..n).map(|i| pick(i) == "true").collect()),
        DType::I64 => Data::I64(
            (0..n)
                .map(|i| pick(i).parse::<i64>().map_err(|_| bad(pick(i))))
                .collect::<Result<_, _>>()?,
        ),
        // Through f32 (exact for every f16 and bf16), then rounded once more: the printed
        // text of a narrow float is its exact value, so it parses back to the same bits.
        DType::F16 => Data::F16(
            (0..n)
                .map(|i| {
                    pick(i)
                        .parse::<f32>()
                        .map(f16::from_f32)
                        .map_err(|_| bad(pick(i)))
                })
                .collect::<Result<_, _>>()?,
        ),
        DType::BF16 => Data::BF16(
            (0..n)
                .map(|i| {
                    pick(i)
                        .parse::<f32>()
                        .map(bf16::from_f32)
                        .map_err(|_| bad(pick(i)))
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(Literal {
        ty: ty.clone(),
        data,
    })
}

/// The labels of the regions a region op's statement is followed by (`case` has one or more
/// `branch` regions), `None` for ops without regions.
fn region_labels(mnemonic: &str) -> Option<&'static [&'static str]> {
    Some(match mnemonic {
        "scan" | "checkpoint" => &["body"],
        "while" => &["cond", "body"],
        "case" => &["branch"],
        "custom_vjp" => &["fwd", "bwd"],
        _ => return None,
    })
}

/// Builds a region op from its attributes and its parsed regions (in label order).
fn build_region(
    mnemonic: &str,
    kind: Option<&str>,
    attrs: &[(String, Attr)],
    mut bodies: Vec<Graph>,
) -> Result<RegionOp, String> {
    let allowed: &[&str] = match mnemonic {
        "scan" => &["length", "consts", "carries"],
        "while" => &["consts"],
        "custom_vjp" => &["primals"],
        _ => &[],
    };
    if let Some((k, _)) = attrs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(format!("unknown attribute '{k}'"));
    }
    let reverse = match kind {
        None => false,
        Some("reverse") if mnemonic == "scan" => true,
        Some(w) => return Err(format!("unexpected word '{w}'")),
    };
    let mut next = || bodies.remove(0);
    Ok(match mnemonic {
        "scan" => RegionOp::Scan {
            length: uint_attr(attrs, "length")?,
            reverse,
            consts: uint_attr(attrs, "consts")?,
            carries: uint_attr(attrs, "carries")?,
            body: next(),
        },
        "while" => {
            let cond = next();
            RegionOp::While {
                consts: uint_attr(attrs, "consts")?,
                cond,
                body: next(),
            }
        }
        "checkpoint" => RegionOp::Checkpoint { body: next() },
        "custom_vjp" => {
            let fwd = next();
            RegionOp::CustomVjp {
                primals: uint_attr(attrs, "primals")?,
                fwd,
                bwd: next(),
            }
        }
        "case" => RegionOp::Case { branches: bodies },
        _ => return Err("unknown region op".into()),
    })
}

/// Builds the op named `mnemonic` from its written attributes and its result type (which states
/// the attributes the printer leaves out: shapes, target dtypes).
fn build_op(
    mnemonic: &str,
    kind: Option<&str>,
    attrs: &[(String, Attr)],
    ty: &TensorType,
) -> Result<Op, String> {
    let allowed: &[&str] = match mnemonic {
        "constant" => &["value"],
        "iota" | "concatenate" => &["dim"],
        "broadcast_in_dim" => &["dims"],
        "transpose" => &["perm"],
        "slice" => &["start", "limit", "stride"],
        "pad" => &["low", "high", "interior"],
        "reduce_sum" | "reduce_max" | "reduce_min" => &["axes"],
        "argmax" => &["axis"],
        "dot_general" => &["batch", "contracting"],
        "all_reduce" | "axis_index" => &["axes"],
        "all_gather" | "reduce_scatter" => &["dim", "axes"],
        "all_to_all" => &["split_dim", "concat_dim", "axes"],
        "collective_permute" => &["axes", "pairs"],
        "sharding_constraint" => &["sharding"],
        "get_result" => &["index"],
        "conv_general_dilated" => &[
            "lhs_spec",
            "rhs_spec",
            "out_spec",
            "strides",
            "padding",
            "lhs_dilation",
            "rhs_dilation",
            "feature_group_count",
            "batch_group_count",
            "window_reversal",
        ],
        "reduce_window_sum" | "reduce_window_max" | "reduce_window_min" => &[
            "window",
            "strides",
            "padding",
            "base_dilation",
            "window_dilation",
        ],
        "gather" => crate::gather::GATHER_ATTRS,
        "scatter" => crate::gather::SCATTER_ATTRS,
        "sort" => &["dim", "keys", "output"],
        "cumsum" | "cumprod" | "cummax" | "cummin" => &["axis", "reverse"],
        "rev" => &["dims"],
        _ => &[],
    };
    if let Some((k, _)) = attrs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(format!("unknown attribute '{k}'"));
    }
    if kind.is_some() && !matches!(mnemonic, "all_reduce" | "reduce_scatter" | "scatter") {
        return Err(format!("unexpected word '{}'", kind.unwrap_or_default()));
    }
    if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == mnemonic) {
        return Ok(Op::Unary(u));
    }
    if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == mnemonic) {
        return Ok(Op::Binary(b));
    }
    if let Some(c) = CompareOp::ALL.into_iter().find(|c| c.name() == mnemonic) {
        return Ok(Op::Compare(c));
    }
    Ok(match mnemonic {
        "constant" => Op::Constant(literal(need(attrs, "value")?, ty)?),
        "iota" => Op::Iota {
            dim: uint_attr(attrs, "dim")?,
            ty: ty.clone(),
        },
        "select" => Op::Select,
        "convert" => Op::Convert(ty.dtype),
        "bitcast" => Op::Bitcast(ty.dtype),
        "broadcast_in_dim" => Op::BroadcastInDim {
            shape: ty.shape.clone(),
            dims: uint_list_attr(attrs, "dims")?,
        },
        "reshape" => Op::Reshape(ty.shape.clone()),
        "transpose" => Op::Transpose(uint_list_attr(attrs, "perm")?),
        "slice" => {
            let start = uint_list_attr(attrs, "start")?;
            let stride = match get(attrs, "stride") {
                Some(a) => uints(as_list(a, "stride")?, "stride")?,
                None => vec![1; start.len()],
            };
            Op::Slice {
                limit: uint_list_attr(attrs, "limit")?,
                start,
                stride,
            }
        }
        "concatenate" => Op::Concatenate {
            dim: uint_attr(attrs, "dim")?,
        },
        "pad" => {
            let low = ints(as_list(need(attrs, "low")?, "low")?, "low")?;
            let interior = match get(attrs, "interior") {
                Some(a) => uints(as_list(a, "interior")?, "interior")?,
                None => vec![0; low.len()],
            };
            Op::Pad {
                high: ints(as_list(need(attrs, "high")?, "high")?, "high")?,
                low,
                interior,
            }
        }
        "reduce_sum" | "reduce_max" | "reduce_min" => Op::Reduce {
            kind: reduce_kind(mnemonic.strip_prefix("reduce_"))?,
            axes: uint_list_attr(attrs, "axes")?,
        },
        "argmax" => Op::ArgMax {
            axis: uint_attr(attrs, "axis")?,
        },
        "dot_general" => {
            let cross = |key: &str| -> Result<(Vec<usize>, Vec<usize>), String> {
                match get(attrs, key) {
                    None => Ok((vec![], vec![])),
                    Some(Attr::Cross(l, r)) => Ok((uints(l, key)?, uints(r, key)?)),
                    Some(_) => Err(format!("attribute '{key}' must read [..]x[..]")),
                }
            };
            let (lhs_batch, rhs_batch) = cross("batch")?;
            need(attrs, "contracting")?;
            let (lhs_contract, rhs_contract) = cross("contracting")?;
            Op::DotGeneral(DotDims {
                lhs_batch,
                rhs_batch,
                lhs_contract,
                rhs_contract,
            })
        }
        "all_reduce" => Op::Collective(CollectiveOp::AllReduce {
            kind: reduce_kind(kind)?,
            axes: axes_attr(attrs)?,
        }),
        "all_gather" => Op::Collective(CollectiveOp::AllGather {
            dim: uint_attr(attrs, "dim")?,
            axes: axes_attr(attrs)?,
        }),
        "reduce_scatter" => Op::Collective(CollectiveOp::ReduceScatter {
            kind: reduce_kind(kind)?,
            dim: uint_attr(attrs, "dim")?,
            axes: axes_attr(attrs)?,
        }),
        "all_to_all" => Op::Collective(CollectiveOp::AllToAll {
            split_dim: uint_attr(attrs, "split_dim")?,
            concat_dim: uint_attr(attrs, "concat_dim")?,
            axes: axes_attr(attrs)?,
        }),
        "collective_permute" => {
            let pairs = as_list(need(attrs, "pairs")?, "pairs")?
                .iter()
                .map(|p| match uints(as_list(p, "pairs")?, "pairs")?.as_slice() {
                    [s, d] => Ok((*s, *d)),
                    _ => Err("each entry of 'pairs' is [source,target]".to_string()),
                })
                .collect::<Result<_, _>>()?;
            Op::Collective(CollectiveOp::CollectivePermute {
                axes: axes_attr(attrs)?,
                pairs,
            })
        }
        "axis_index" => Op::Collective(CollectiveOp::AxisIndex {
            axes: axes_attr(attrs)?,
        }),
        "sharding_constraint" => match need(attrs, "sharding")? {
            Attr::Sharding(s) => Op::ShardingConstraint(s.clone()),
            _ => return Err("attribute 'sharding' must be <@mesh, [...]>".into()),
        },
        "stop_gradient" => Op::StopGradient,
        "get_result" => Op::GetResult {
            index: uint_attr(attrs, "index")?,
            ty: ty.clone(),
        },
        "conv_general_dilated" => {
            let lhs_spec = uint_list_attr(attrs, "lhs_spec")?;
            let s = lhs_spec.len().saturating_sub(2);
            let opt_list = |key: &str| -> Result<Vec<usize>, String> {
                match get(attrs, key) {
                    Some(a) => uints(as_list(a, key)?, key),
                    None => Ok(vec![1; s]),
                }
            };
            let opt_uint = |key: &str| -> Result<usize, String> {
                match get(attrs, key) {
                    Some(a) => as_uint(a, key),
                    None => Ok(1),
                }
            };
            Op::Conv(Box::new(crate::conv::ConvDims {
                rhs_spec: uint_list_attr(attrs, "rhs_spec")?,
                out_spec: uint_list_attr(attrs, "out_spec")?,
                strides: uint_list_attr(attrs, "strides")?,
                padding: pad_pairs(need(attrs, "padding")?)?,
                lhs_dilation: opt_list("lhs_dilation")?,
                rhs_dilation: opt_list("rhs_dilation")?,
                feature_group_count: opt_uint("feature_group_count")?,
                batch_group_count: opt_uint("batch_group_count")?,
                window_reversal: match get(attrs, "window_reversal") {
                    None => false,
                    Some(a) => match as_uint(a, "window_reversal")? {
                        0 => false,
                        1 => true,
                        _ => return Err("attribute 'window_reversal' is 0 or 1".into()),
                    },
                },
                lhs_spec,
            }))
        }
        "reduce_window_sum" | "reduce_window_max" | "reduce_window_min" => {
            let window = uint_list_attr(attrs, "window")?;
            let n = window.len();
            let opt_list = |key: &str| -> Result<Vec<usize>, String> {
                match get(attrs, key) {
                    Some(a) => uints(as_list(a, key)?, key),
                    None => Ok(vec![1; n]),
                }
            };
            Op::ReduceWindow {
                kind: reduce_kind(mnemonic.strip_prefix("reduce_window_"))?,
                win: Box::new(crate::conv::WindowDims {
                    strides: uint_list_attr(attrs, "strides")?,
                    padding: match get(attrs, "padding") {
                        Some(a) => pad_pairs(a)?,
                        None => vec![(0, 0); n],
                    },
                    base_dilation: opt_list("base_dilation")?,
                    window_dilation: opt_list("window_dilation")?,
                    window,
                }),
            }
        }
        "gather" => Op::Gather(Box::new(gather_attrs(attrs)?)),
        "scatter" => Op::Scatter(Box::new(scatter_attrs(kind, attrs)?)),
        "sort" => Op::Sort {
            dim: uint_attr(attrs, "dim")?,
            num_keys: uint_attr(attrs, "keys")?,
            output: uint_attr(attrs, "output")?,
        },
        "cumsum" | "cumprod" | "cummax" | "cummin" => Op::Cumulative {
            kind: tessera_cumulative_kind(mnemonic)?,
            axis: uint_attr(attrs, "axis")?,
            reverse: match get(attrs, "reverse") {
                None => false,
                Some(_) => match uint_attr(attrs, "reverse")? {
                    0 => false,
                    1 => true,
                    r => return Err(format!("attribute 'reverse' must be 0 or 1, got {r}")),
                },
            },
        },
        "rev" => Op::Rev {
            dims: uint_list_attr(attrs, "dims")?,
        },
        "parameter" => return Err("parameters are declared in the function signature".into()),
        _ => return Err("unknown op".into()),
    })
}

/// A `padding=[[lo,hi],...]` attribute.
fn pad_pairs(a: &Attr) -> Result<Vec<(i64, i64)>, String> {
    as_list(a, "padding")?
        .iter()
        .map(
            |p| match ints(as_list(p, "padding")?, "padding")?.as_slice() {
                [lo, hi] => Ok((*lo, *hi)),
                _ => Err("each entry of 'padding' is [lo,hi]".to_string()),
            },
        )
        .collect()
}

fn cross_attr(attrs: &[(String, Attr)], key: &str) -> Result<(Vec<usize>, Vec<usize>), String> {
    match get(attrs, key) {
        None => Ok((vec![], vec![])),
        Some(Attr::Cross(l, r)) => Ok((uints(l, key)?, uints(r, key)?)),
        Some(_) => Err(format!("attribute '{key}' must read [..]x[..]")),
    }
}

fn mode_attr(attrs: &[(String, Attr)], scatter: bool) -> Result<IndexMode, String> {
    let word = match need(attrs, "mode")? {
        Attr::Word(w) => w.as_str(),
        _ => return Err("attribute 'mode' must be a word".into()),
    };
    [IndexMode::Clip, IndexMode::Fill]
        .into_iter()
        .find(|m| m.name(scatter) == word)
        .ok_or_else(|| {
            format!(
                "unknown mode '{word}' (clip or {})",
                IndexMode::Fill.name(scatter)
            )
        })
}

fn gather_attrs(attrs: &[(String, Attr)]) -> Result<GatherDims, String> {
    let (operand_batching_dims, start_indices_batching_dims) = cross_attr(attrs, "batching")?;
    let mode = mode_attr(attrs, false)?;
    let fill = match (mode, get(attrs, "fill")) {
        (IndexMode::Fill, Some(Attr::Int(n))) => *n as f64,
        (IndexMode::Fill, Some(Attr::Word(w))) => w
            .parse::<f64>()
            .map_err(|_| format!("fill '{w}' is not a number"))?,
        (IndexMode::Fill, _) => return Err("a gather of mode fill needs 'fill=<value>'".into()),
        (IndexMode::Clip, None) => 0.0,
        (IndexMode::Clip, Some(_)) => return Err("only a gather of mode fill has a 'fill'".into()),
    };
    Ok(GatherDims {
        offset_dims: uint_list_attr(attrs, "offset_dims")?,
        collapsed_slice_dims: uint_list_attr(attrs, "collapsed")?,
        start_index_map: uint_list_attr(attrs, "start_index_map")?,
        operand_batching_dims,
        start_indices_batching_dims,
        index_vector_dim: uint_attr(attrs, "index_vector_dim")?,
        slice_sizes: uint_list_attr(attrs, "slice_sizes")?,
        mode,
        fill,
    })
}

fn scatter_attrs(kind: Option<&str>, attrs: &[(String, Attr)]) -> Result<ScatterDims, String> {
    let k = kind.ok_or("missing the combiner (set, add, mul, min or max)")?;
    let kind = ScatterKind::from_name(k).ok_or_else(|| format!("unknown combiner '{k}'"))?;
    let (input_batching_dims, scatter_indices_batching_dims) = cross_attr(attrs, "batching")?;
    Ok(ScatterDims {
        kind,
        update_window_dims: uint_list_attr(attrs, "window_dims")?,
        inserted_window_dims: uint_list_attr(attrs, "inserted")?,
        scatter_dims_to_operand_dims: uint_list_attr(attrs, "to_operand")?,
        input_batching_dims,
        scatter_indices_batching_dims,
        index_vector_dim: uint_attr(attrs, "index_vector_dim")?,
        mode: mode_attr(attrs, true)?,
    })
}

fn tessera_cumulative_kind(mnemonic: &str) -> Result<crate::sorting::CumulativeKind, String> {
    crate::sorting::CumulativeKind::from_name(mnemonic)
        .ok_or_else(|| format!("unknown cumulative op '{mnemonic}'"))
}

/// A location comment split into the location and the `[sharding: ...]` tail the printer
/// writes for a node's `why`.
fn split_why(comment: Option<String>) -> (Option<String>, Option<String>) {
    let Some(c) = comment else {
        return (None, None);
    };
    match c.rfind("[sharding: ") {
        Some(at) if c.ends_with(']') => {
            let why = c[at + "[sharding: ".len()..c.len() - 1].to_string();
            let loc = c[..at].trim_end().to_string();
            ((!loc.is_empty()).then_some(loc), Some(why))
        }
        _ => (Some(c), None),
    }
}
