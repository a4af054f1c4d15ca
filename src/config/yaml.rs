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

use std::collections::{BTreeSet, HashMap};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A position in the file: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// An empty value, `~` or `null`.
    Null,
    Scalar(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
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

/// A problem found while reading the document: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlProblem {
    pub mark: Mark,
    pub message: String,
}

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
}

impl Document {
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
            .filter(|(name, _)| matches!(&name.kind, Kind::Scalar(text) if text == key));
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

/// Parses `text` into a tree, replacing `${VAR}` through `env`; a syntax error stops parsing.
pub(crate) fn parse(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Document, YamlProblem> {
    let mut builder = Builder {
        source: text,
        env,
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        problems: Vec::new(),
        tainted: Vec::new(),
        substituted: Vec::new(),
    };
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        let mark = Mark::from_marker(*e.marker());
        return Err(YamlProblem {
            mark,
            message: format!("YAML syntax error: {}", e.info()),
        });
    }
    Ok(Document {
        root: builder.root,
        problems: builder.problems,
        tainted: builder.tainted,
        substituted: builder.substituted,
    })
}

/// A collection being built: its node (with an empty body) and, for a mapping, a key waiting for its value.
struct Open {
    node: Node,
    anchor: usize,
    pending_key: Option<Node>,
}

struct Builder<'a> {
    source: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
    stack: Vec<Open>,
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    problems: Vec<YamlProblem>,
    tainted: Vec<Mark>,
    substituted: Vec<(Mark, String)>,
}

impl MarkedEventReceiver for Builder<'_> {
    fn on_event(&mut self, event: Event, marker: Marker) {
        let mark = Mark::from_marker(marker);
        match event {
            Event::Scalar(text, style, anchor, _tag) => {
                let plain = style == TScalarStyle::Plain;
                let kind = if plain && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL")
                {
                    Kind::Null
                } else {
                    let before = self.problems.len();
                    let value = self.substitute(&text, mark);
                    if self.problems.len() == before {
                        Kind::Scalar(value)
                    } else {
                        self.tainted.push(mark);
                        Kind::Scalar(text)
                    }
                };
                self.finish(Node { mark, kind }, anchor);
            }
            Event::SequenceStart(anchor, _) => self.open(
                Node {
                    mark,
                    kind: Kind::Seq(Vec::new()),
                },
                anchor,
            ),
            Event::MappingStart(anchor, _) => self.open(
                Node {
                    mark,
                    kind: Kind::Map(Vec::new()),
                },
                anchor,
            ),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(open) = self.stack.pop() {
                    self.finish(open.node, open.anchor);
                }
            }
            Event::Alias(id) => {
                let node = self.anchors.get(&id).cloned().unwrap_or(Node {
                    mark,
                    kind: Kind::Null,
                });
                self.finish(node, 0);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

impl Builder<'_> {
    fn open(&mut self, node: Node, anchor: usize) {
        self.stack.push(Open {
            node,
            anchor,
            pending_key: None,
        });
    }

    /// Attaches a complete node to the collection being built (or makes it the root).
    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        let Some(parent) = self.stack.last_mut() else {
            self.root = Some(node);
            return;
        };
        match &mut parent.node.kind {
            Kind::Seq(items) => items.push(node),
            Kind::Map(entries) => match parent.pending_key.take() {
                Some(key) => entries.push((key, node)),
                None => parent.pending_key = Some(node),
            },
            Kind::Null | Kind::Scalar(_) => {}
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
                    let at = locate(self.source, search_from, "${");
                    self.problem(
                        at,
                        "unterminated `${`: write `${NAME}`, or `$$` for a literal `$`".to_string(),
                    );
                    return out;
                };
                let name = &body[..close];
                let at = locate(self.source, search_from, &format!("${{{name}}}"));
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
        self.problems.push(YamlProblem { mark, message });
    }
}

/// Whether `name` is a variable name: a letter or `_`, then letters, digits and `_`.
pub(crate) fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The position of the first `needle` in `source` at or after `from`; `from` itself if there is none
/// (a scalar whose escapes changed its text, say).
fn locate(source: &str, from: Mark, needle: &str) -> Mark {
    let mut line = 1;
    let mut column = 1;
    for (offset, c) in source.char_indices() {
        if (line, column) >= (from.line, from.column) && source[offset..].starts_with(needle) {
            return Mark { line, column };
        }
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    from
}
