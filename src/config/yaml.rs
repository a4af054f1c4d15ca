//! A YAML document as a tree in which every node knows its line and column, with `${VAR}` replaced.
//!
//! serde_yaml 0.9 keeps no positions once a document is parsed, so errors about a value (a bad cron
//! expression, a duration, a URL) could not say where the value is. This tree is built from
//! `yaml-rust2`'s event parser, which marks every event; the validation in the parent module reads it.
//!
//! `${VAR}` is replaced inside every scalar (keys and values; comments are left alone) from the
//! environment, and `$$` stands for a literal `$`. A `$` followed by anything else is kept as it is, so
//! `echo $HOME` in a shell command reaches the shell untouched. Substituting scalars after parsing
//! rather than the raw text means a value from the environment can never change the document's shape.
//! Each replacement is recorded with the scalar it was made in, so the parent module can tell which
//! variables a section uses (the store's, which jobs must not inherit).
//!
//! An alias (`*name`) repeats the node its anchor (`&name`) marks. The repetition shares the anchor's
//! text and collections, so it costs one node of memory; but what reads the tree reads every repetition,
//! so a few hundred bytes of nested aliases would still be billions of nodes to walk (the "billion
//! laughs"), and a file nested thousands deep would overflow the stack of whatever walks it
//! recursively. So the document is read within limits: at most [`MAX_DEPTH`] collections deep,
//! [`MAX_ALIASES`] aliases, and [`MAX_ALIAS_NODES`] nodes and [`MAX_ALIAS_TEXT`] bytes of scalar text
//! repeated by aliases in all. A limit is checked before the alias is taken and stops reading, with a
//! problem at the alias (or collection) that crossed it. The events are pulled from the parser one by
//! one, not through its recursive `load`, so nothing past that point is read.

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A position in the file: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Mark {
    pub line: usize,
    pub column: usize,
}

impl Mark {
    fn from_marker(marker: Marker) -> Mark {
        Mark {
            line: marker.line(),
            column: marker.col() + 1,
        }
    }
}

/// One node of the document.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub mark: Mark,
    pub kind: Kind,
}

/// A node's body. Text and collections are shared, not copied, by the aliases that repeat them, so an
/// alias costs one node's memory whatever it names.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// An empty value, `~` or `null`.
    Null,
    Scalar(Rc<str>),
    Seq(Rc<[Node]>),
    Map(Rc<[(Node, Node)]>),
}

impl Node {
    /// What this node is, for "expected …, found …" messages.
    pub fn describe(&self) -> &'static str {
        match self.kind {
            Kind::Null => "nothing",
            Kind::Scalar(_) => "a single value",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

/// A problem found while reading the document: where, in which field (empty if not known) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlProblem {
    pub mark: Mark,
    pub field: String,
    pub message: String,
}

/// The deepest nesting of collections a document may have: real configs nest five deep (`jobs`, a job,
/// its `env`); the tree is walked recursively, so thousands of levels would overflow the stack.
pub(crate) const MAX_DEPTH: usize = 64;
/// The most aliases (`*name`) a document may use: a config of 10,000 jobs that shares a few values
/// between all of them uses tens of thousands.
pub(crate) const MAX_ALIASES: usize = 100_000;
/// The most nodes (scalars, lists, mappings) that aliases may repeat in all, each alias counting every
/// node under its anchor: four times what 10,000 jobs that each share a command, a ten-variable `env`
/// and an `inherit_env` list repeat. Reading that many takes a fraction of a second.
pub(crate) const MAX_ALIAS_NODES: usize = 1_000_000;
/// The most bytes of scalar text that aliases may repeat in all: what the config built from the tree
/// holds as its own strings.
pub(crate) const MAX_ALIAS_TEXT: usize = 16 * 1024 * 1024;

/// A parsed document: its root (`None` if empty) and the `${...}` that could not be replaced.
#[derive(Debug)]
pub(crate) struct Document {
    pub root: Option<Node>,
    /// One problem per unset or malformed `${...}`, at the `${`.
    pub problems: Vec<YamlProblem>,
    /// Scalars that kept their text because a `${...}` in them failed; what else is wrong with them
    /// follows from that and is not worth reporting.
    pub tainted: Vec<Mark>,
    /// `(scalar, variable)` for every `${VAR}` replaced, by the position of the scalar it was in.
    substituted: Vec<(Mark, String)>,
    /// The text as written of every scalar in which a `${VAR}` was replaced, by its position.
    written: HashMap<Mark, Rc<str>>,
}

impl Document {
    /// The text as written (`${VAR}` not replaced) of the scalar at `mark`, if a variable was replaced
    /// in it: what may be shown of a value that holds a secret.
    pub fn written(&self, mark: Mark) -> Option<&str> {
        self.written.get(&mark).map(|text| &**text)
    }

    /// The variables replaced inside the top-level `key:` of the document, at any depth, aliases
    /// included (an alias keeps the position of the scalar it repeats).
    pub fn variables_under(&self, key: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let Some(Node {
            kind: Kind::Map(entries),
            ..
        }) = &self.root
        else {
            return names;
        };
        let sections = entries
            .iter()
            .filter(|(name, _)| matches!(&name.kind, Kind::Scalar(text) if &**text == key));
        for (_, section) in sections {
            self.collect_variables(section, &mut names);
        }
        names
    }

    fn collect_variables(&self, node: &Node, names: &mut BTreeSet<String>) {
        match &node.kind {
            Kind::Null => {}
            Kind::Scalar(_) => names.extend(
                self.substituted
                    .iter()
                    .filter(|(mark, _)| *mark == node.mark)
                    .map(|(_, name)| name.clone()),
            ),
            Kind::Seq(items) => items
                .iter()
                .for_each(|item| self.collect_variables(item, names)),
            Kind::Map(entries) => entries.iter().for_each(|(key, value)| {
                self.collect_variables(key, names);
                self.collect_variables(value, names);
            }),
        }
    }
}

/// Parses `text` into a tree, replacing `${VAR}` through `env`; a syntax error or a crossed limit (see
/// the module's doc) stops parsing. Only the first document of the stream is read.
pub(crate) fn parse(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Document, YamlProblem> {
    let mut builder = Builder {
        locator: Locator {
            source: text,
            cursor: Cursor::START,
            until: None,
        },
        env,
        stack: Vec::new(),
        anchors: HashMap::new(),
        aliases: 0,
        copied: Size::default(),
        root: None,
        problems: Vec::new(),
        tainted: Vec::new(),
        substituted: Vec::new(),
        written: HashMap::new(),
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        let (event, marker) = parser.next_token().map_err(|e| YamlProblem {
            mark: Mark::from_marker(*e.marker()),
            field: String::new(),
            message: format!("YAML syntax error: {}", e.info()),
        })?;
        if matches!(event, Event::DocumentEnd | Event::StreamEnd) {
            break;
        }
        if matches!(event, Event::Scalar(..)) {
            // Where the scalar's `${...}` may be: before the next event (a syntax error there is
            // reported by the next turn).
            builder.locator.until = parser.peek().ok().map(|(_, next)| Mark::from_marker(*next));
        }
        builder.event(event, Mark::from_marker(marker))?;
    }
    Ok(Document {
        root: builder.root,
        problems: builder.problems,
        tainted: builder.tainted,
        substituted: builder.substituted,
        written: builder.written,
    })
}

/// How much a node is, counting what is under it: what an alias to it copies.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    nodes: usize,
    text: usize,
}

impl Size {
    fn add(&mut self, other: Size) {
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.text = self.text.saturating_add(other.text);
    }
}

/// A collection being built: where it starts, what it holds so far (with its size) and its anchor.
struct Open {
    mark: Mark,
    body: Body,
    size: Size,
    anchor: usize,
}

/// The items of a collection being built.
enum Body {
    Seq(Vec<Node>),
    /// The entries, and a key waiting for its value.
    Map(Vec<(Node, Node)>, Option<Node>),
}

struct Builder<'a> {
    locator: Locator<'a>,
    env: &'a dyn Fn(&str) -> Option<String>,
    stack: Vec<Open>,
    /// Each anchored node, with its size, by the parser's anchor id.
    anchors: HashMap<usize, (Node, Size)>,
    /// The aliases read so far.
    aliases: usize,
    /// What the aliases read so far copied.
    copied: Size,
    root: Option<Node>,
    problems: Vec<YamlProblem>,
    tainted: Vec<Mark>,
    substituted: Vec<(Mark, String)>,
    written: HashMap<Mark, Rc<str>>,
}

impl Builder<'_> {
    /// Adds one event of the parser to the tree; a crossed limit is a problem that stops reading.
    fn event(&mut self, event: Event, mark: Mark) -> Result<(), YamlProblem> {
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                let size = Size {
                    nodes: 1,
                    text: text.len(),
                };
                let plain = style == TScalarStyle::Plain;
                let kind = if plain && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL")
                {
                    Kind::Null
                } else {
                    let before = self.problems.len();
                    let replaced = self.substituted.len();
                    let value = self.substitute(&text, mark);
                    if self.substituted.len() > replaced {
                        self.written.insert(mark, text.as_str().into());
                    }
                    if self.problems.len() == before {
                        Kind::Scalar(value.into())
                    } else {
                        self.tainted.push(mark);
                        Kind::Scalar(text.into())
                    }
                };
                self.finish(Node { mark, kind }, size, anchor);
            }
            Event::SequenceStart(anchor, _) => self.open(mark, Body::Seq(Vec::new()), anchor)?,
            Event::MappingStart(anchor, _) => {
                self.open(mark, Body::Map(Vec::new(), None), anchor)?;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(open) = self.stack.pop() {
                    let kind = match open.body {
                        Body::Seq(items) => Kind::Seq(items.into()),
                        Body::Map(entries, _) => Kind::Map(entries.into()),
                    };
                    let node = Node {
                        mark: open.mark,
                        kind,
                    };
                    self.finish(node, open.size, open.anchor);
                }
            }
            Event::Alias(id) => {
                let (node, size) = self.copy(id, mark)?;
                self.finish(node, size, 0);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
        Ok(())
    }

    /// The node that anchor `id` marks, copied for an alias at `mark`, if the limits allow the copy.
    fn copy(&mut self, id: usize, mark: Mark) -> Result<(Node, Size), YamlProblem> {
        let null = (
            Node {
                mark,
                kind: Kind::Null,
            },
            Size { nodes: 1, text: 0 },
        );
        // An alias inside its own anchor's collection (which is not finished): nothing to copy.
        let Some((node, size)) = self.anchors.get(&id) else {
            return Ok(null);
        };
        self.aliases += 1;
        let mut copied = self.copied;
        copied.add(*size);
        let over = if self.aliases > MAX_ALIASES {
            Some(format!("more than {MAX_ALIASES} aliases"))
        } else if copied.nodes > MAX_ALIAS_NODES {
            Some(format!(
                "aliases up to here copy {} nodes, more than {MAX_ALIAS_NODES}",
                copied.nodes
            ))
        } else if copied.text > MAX_ALIAS_TEXT {
            Some(format!(
                "aliases up to here copy {} bytes of text, more than {MAX_ALIAS_TEXT}",
                copied.text
            ))
        } else {
            None
        };
        if let Some(over) = over {
            return Err(self.limit(
                mark,
                format!(
                    "{over}: the document is too big once its aliases are expanded (an alias \
                     bomb?); nothing was read past this alias (limits: {MAX_ALIASES} aliases, \
                     {MAX_ALIAS_NODES} nodes and {MAX_ALIAS_TEXT} bytes copied by aliases)"
                ),
            ));
        }
        self.copied = copied;
        Ok((node.clone(), *size))
    }

    /// A problem at `mark` in the field being built, that stops reading.
    fn limit(&self, mark: Mark, message: String) -> YamlProblem {
        YamlProblem {
            mark,
            field: self.field(),
            message,
        }
    }

    /// The path of the node being built, as the parent module names fields: `jobs[1].env.HOME`.
    fn field(&self) -> String {
        let mut path = String::new();
        for open in &self.stack {
            match &open.body {
                Body::Seq(items) => path.push_str(&format!("[{}]", items.len())),
                Body::Map(_, pending_key) => {
                    if let Some(Node {
                        kind: Kind::Scalar(key),
                        ..
                    }) = pending_key
                    {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(key);
                    }
                }
            }
        }
        path
    }

    fn open(&mut self, mark: Mark, body: Body, anchor: usize) -> Result<(), YamlProblem> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.limit(
                mark,
                format!("nested more than {MAX_DEPTH} lists and mappings deep; nothing was read past here"),
            ));
        }
        self.stack.push(Open {
            mark,
            body,
            size: Size { nodes: 1, text: 0 },
            anchor,
        });
        Ok(())
    }

    /// Attaches a complete node of `size` to the collection being built (or makes it the root).
    fn finish(&mut self, node: Node, size: Size, anchor: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some(parent) = self.stack.last_mut() else {
            self.root = Some(node);
            return;
        };
        parent.size.add(size);
        match &mut parent.body {
            Body::Seq(items) => items.push(node),
            Body::Map(entries, pending_key) => match pending_key.take() {
                Some(key) => entries.push((key, node)),
                None => *pending_key = Some(node),
            },
        }
    }

    /// Replaces `${VAR}` and `$$` in one scalar that starts at `mark`.
    fn substitute(&mut self, text: &str, mark: Mark) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut search_from = mark;
        while let Some(dollar) = rest.find('$') {
            out.push_str(&rest[..dollar]);
            let after = &rest[dollar + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(body) = after.strip_prefix('{') {
                let Some(close) = body.find('}') else {
                    let at = self.locator.locate(search_from, "${");
                    self.problem(
                        at,
                        "unterminated `${`: write `${NAME}`, or `$$` for a literal `$`".to_string(),
                    );
                    return out;
                };
                let name = &body[..close];
                let at = self.locator.locate(search_from, &format!("${{{name}}}"));
                search_from = Mark {
                    line: at.line,
                    column: at.column + 1,
                };
                if !is_variable_name(name) {
                    self.problem(at, format!("`${{{name}}}`: not a variable name (letters, digits and `_`); write `$$` for a literal `$`"));
                } else {
                    match (self.env)(name) {
                        Some(value) => {
                            out.push_str(&value);
                            self.substituted.push((mark, name.to_string()));
                        }
                        None => self.problem(
                            at,
                            format!(
                                "environment variable {name} is not set (used as `${{{name}}}`)"
                            ),
                        ),
                    }
                }
                rest = &body[close + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    fn problem(&mut self, mark: Mark, message: String) {
        self.problems.push(YamlProblem {
            mark,
            field: String::new(),
            message,
        });
    }
}

/// Whether `name` is a variable name: a letter or `_`, then letters, digits and `_`.
pub(crate) fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A position in the source: its byte offset and its line and column.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    offset: usize,
    mark: Mark,
}

impl Cursor {
    const START: Cursor = Cursor {
        offset: 0,
        mark: Mark { line: 1, column: 1 },
    };

    /// Steps over `c`, the character at the cursor.
    fn step(&mut self, c: char) {
        self.offset += c.len_utf8();
        if c == '\n' {
            self.mark.line += 1;
            self.mark.column = 1;
        } else {
            self.mark.column += 1;
        }
    }
}

/// Whether `a` comes before `b` in the file.
fn before(a: Mark, b: Mark) -> bool {
    (a.line, a.column) < (b.line, b.column)
}

/// Finds the `${...}` of scalars in the source. Scalars come in file order, so each search starts
/// where the last one's scalar did, and ends where the next event starts: the file is read about once
/// in all, not once per `${` (10,000 jobs with a variable each took a minute).
struct Locator<'a> {
    source: &'a str,
    /// At or before the start of the scalar being searched.
    cursor: Cursor,
    /// Where the event after the scalar being searched starts (`None`: the end of the file).
    until: Option<Mark>,
}

impl Locator<'_> {
    /// The position of the first `needle` at or after `from` and before [`Locator::until`]; `from`
    /// itself if there is none (a scalar whose escapes changed its text, say).
    fn locate(&mut self, from: Mark, needle: &str) -> Mark {
        if before(from, self.cursor.mark) {
            self.cursor = Cursor::START;
        }
        while before(self.cursor.mark, from) {
            let Some(c) = self.source[self.cursor.offset..].chars().next() else {
                return from;
            };
            self.cursor.step(c);
        }
        let mut probe = self.cursor;
        loop {
            if self.until.is_some_and(|until| !before(probe.mark, until)) {
                return from;
            }
            let rest = &self.source[probe.offset..];
            if rest.starts_with(needle) {
                return probe.mark;
            }
            let Some(c) = rest.chars().next() else {
                return from;
            };
            probe.step(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Document, YamlProblem> {
        parse(text, &|_| None)
    }

    /// An alias repeats its anchor's node, text and collections shared rather than copied.
    #[test]
    fn an_alias_repeats_its_anchor() {
        let document = read("a: &x [1, {b: c}]\nd: *x\n").expect("valid");
        let Some(Node {
            kind: Kind::Map(entries),
            ..
        }) = &document.root
        else {
            panic!("{:?}", document.root)
        };
        let (Kind::Seq(first), Kind::Seq(second)) = (&entries[0].1.kind, &entries[1].1.kind) else {
            panic!("{entries:?}")
        };
        assert!(Rc::ptr_eq(first, second));
    }

    /// Each limit stops reading at the alias or collection that crosses it, naming its field.
    #[test]
    fn limits_stop_at_the_node_that_crosses_them() {
        let nodes = MAX_ALIAS_NODES / 1000 + 1;
        let items = vec!["x"; 999].join(", ");
        let many = format!("a: &a [{items}]\nb: [{}]\n", vec!["*a"; nodes].join(", "));
        let problem = read(&many).expect_err("too many nodes copied");
        assert_eq!((problem.mark.line, problem.field.as_str()), (2, "b[1000]"));
        assert!(
            problem
                .message
                .starts_with("aliases up to here copy 1001000 nodes, more than 1000000"),
            "{problem:?}"
        );

        let aliases = format!("a: &a x\nb:\n{}", "  - *a\n".repeat(MAX_ALIASES + 1));
        let problem = read(&aliases).expect_err("too many aliases");
        assert_eq!(problem.mark.line, MAX_ALIASES + 3);
        assert!(
            problem.message.starts_with("more than 100000 aliases"),
            "{problem:?}"
        );

        let long = "y".repeat(MAX_ALIAS_TEXT / 4 + 1);
        let text = format!("a: &a {long}\nb: [*a, *a, *a, *a]\n");
        let problem = read(&text).expect_err("too much text copied");
        assert_eq!(
            (problem.mark, problem.field.as_str()),
            (
                Mark {
                    line: 2,
                    column: 17
                },
                "b[3]"
            )
        );
        assert!(
            problem
                .message
                .contains("bytes of text, more than 16777216"),
            "{problem:?}"
        );

        let deep = format!("{}x{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(read(&deep).is_ok(), "{MAX_DEPTH} deep is allowed");
        let deeper = format!("k:\n  {}x", "- ".repeat(MAX_DEPTH));
        let problem = read(&deeper).expect_err("too deep");
        assert_eq!(
            problem.mark,
            Mark {
                line: 2,
                column: 2 * MAX_DEPTH + 1
            }
        );
        assert!(
            problem.message.starts_with("nested more than 64"),
            "{problem:?}"
        );
    }

    /// Only the first document of a stream is read, as before: what follows it is not looked at.
    #[test]
    fn only_the_first_document_is_read() {
        let document = read("a: 1\n---\nb: [\n").expect("the second document is not read");
        assert!(
            matches!(document.root, Some(Node { kind: Kind::Map(ref entries), .. }) if entries.len() == 1)
        );
    }
}
