//! A format-neutral document tree with line numbers.
//!
//! Build files are YAML or TOML. Both are first read into this small tree,
//! every node and every mapping key carrying the 1-based line it starts on, so
//! that one schema walk (`schema.rs`) can validate either format and report
//! every problem at its exact line. Unknown keys and wrong types are therefore
//! our own diagnostics, not serde's first-error-wins messages.
//!
//! YAML goes through `serde-saphyr` with [`serde_saphyr::Spanned`] around each
//! node (its `referenced` location gives the line); TOML through
//! [`toml::de::DeTable`], whose byte spans are turned into lines here.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned as YSpanned;

/// A node of the document tree.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// 1-based line where the node starts.
    pub(crate) line: usize,
    pub(crate) kind: Kind,
}

/// What a node holds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// An empty value (`key:` or `~` in YAML).
    Null,
    Bool(bool),
    /// An integer, with its source spelling.
    Int(i128, String),
    /// A float, with its source spelling.
    Float(f64, String),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
    /// A TOML date or time.
    Datetime(String),
}

/// One `key: value` entry of a mapping, in source order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) key_line: usize,
    pub(crate) value: Node,
}

impl Kind {
    /// The kind's name, for "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Kind::Null => "nothing",
            Kind::Bool(_) => "a boolean",
            Kind::Int(..) => "an integer",
            Kind::Float(..) => "a number",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
            Kind::Datetime(_) => "a date",
        }
    }
}

/// A syntax error of the underlying parser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) line: Option<usize>,
    pub(crate) message: String,
}

/// The most nodes (scalars, lists and mappings) a YAML build file may hold.
const MAX_YAML_NODES: usize = 3_000_000;

/// The deepest nesting of lists and mappings accepted.
const MAX_DEPTH: usize = 16;

/// Parses YAML text into a tree. An empty document is [`Kind::Null`].
pub(crate) fn parse_yaml(text: &str) -> Result<Node, SyntaxError> {
    let mut options = serde_saphyr::Options::default();
    // `on`, `yes`, `no` stay strings (`labels: {gpu: no}` means the text "no").
    options.strict_booleans = true;
    // `0755` stays the text `0755` instead of becoming a number.
    options.leading_zero_numbers_as_strings = true;
    // Duplicate keys reach our visitor, which reports them with both lines.
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;
    options.with_snippet = false;
    // The default budget (250,000 nodes) is below what a build file at the
    // job limit needs; allow about 30 nodes per job at 100,000 jobs. Inputs
    // are already capped at 16 MiB, and aliases keep their default limits.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = MAX_YAML_NODES;
    budget.max_events = 2 * MAX_YAML_NODES;
    // A build file nests about six levels deep. Deserialization recurses per
    // level with large frames (tens of KiB each in debug builds), so a small
    // limit keeps hostile nesting from overflowing a 2 MiB thread stack.
    budget.max_depth = MAX_DEPTH;
    options.budget = Some(budget);
    match serde_saphyr::from_str_with_options::<YSpanned<YNode>>(text, options) {
        Ok(root) => Ok(convert_yaml(root, text)),
        Err(err) => {
            let line = err.location().map(|l| l.line()).filter(|&l| l > 0);
            // An error met while expanding an alias comes wrapped with where
            // the alias was defined and used; the line above is the use.
            let mut inner = &err;
            while let serde_saphyr::Error::AliasError { error, .. }
            | serde_saphyr::Error::WithSnippet { error, .. } = inner
            {
                inner = error;
            }
            let message = match inner {
                serde_saphyr::Error::Budget { breach, .. } => {
                    format!("YAML document exceeds the parser's limits ({breach:?})")
                }
                serde_saphyr::Error::NullIntoString { .. } => {
                    "a mapping key is empty or null (`~`): keys are text".to_owned()
                }
                serde_saphyr::Error::MultipleDocuments { .. } => {
                    "a build file is one YAML document (a `---` line starts another)".to_owned()
                }
                _ => {
                    let mut message = inner.to_string();
                    // The message goes on with " at line L, column C" (and,
                    // for an alias, where it was defined and used): we
                    // print the line ourselves.
                    if let Some(at) = message.find(" at line ") {
                        message.truncate(at);
                    }
                    // The parser notices a bracket left open only at a
                    // later line: name the bracket's line instead.
                    let reported = line.and_then(|l| usize::try_from(l).ok());
                    if let Some(at) = reported
                        && let Some((opened, bracket)) = crate::unclosed::unclosed_flow(text, at)
                    {
                        let message = format!(
                            "YAML syntax error: this \"{bracket}\" is never closed (the parser stopped at \
                             line {at}: {message})"
                        );
                        return Err(SyntaxError { line: Some(opened), message });
                    }
                    format!("YAML syntax error: {message}")
                }
            };
            Err(SyntaxError { line: line.map(|l| usize::try_from(l).unwrap_or(usize::MAX)), message })
        }
    }
}

/// Parses TOML text into a tree.
pub(crate) fn parse_toml(text: &str) -> Result<Node, SyntaxError> {
    let lines = LineIndex::new(text);
    match toml::de::DeTable::parse(text) {
        Ok(table) => {
            let line = lines.line_of(table.span().start);
            Ok(Node { line, kind: convert_toml_table(table.get_ref(), &lines) })
        }
        Err(err) => Err(SyntaxError {
            line: err.span().map(|span| lines.line_of(span.start)),
            message: format!("TOML syntax error: {}", err.message().trim_end()),
        }),
    }
}

/// YAML node as read by serde: a value whose children carry saphyr locations.
#[derive(Debug)]
enum YNode {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<YSpanned<YNode>>),
    Map(Vec<(YSpanned<String>, YSpanned<YNode>)>),
}

impl<'de> Deserialize<'de> for YNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<YNode, D::Error> {
        struct NodeVisitor;

        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = YNode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<YNode, E> {
                Ok(YNode::Null)
            }
            fn visit_none<E>(self) -> Result<YNode, E> {
                Ok(YNode::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<YNode, D::Error> {
                YNode::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<YNode, E> {
                Ok(YNode::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<YNode, E> {
                Ok(YNode::Int(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<YNode, E> {
                Ok(YNode::Int(v.into()))
            }
            fn visit_i128<E>(self, v: i128) -> Result<YNode, E> {
                Ok(YNode::Int(v))
            }
            fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<YNode, E> {
                i128::try_from(v).map(YNode::Int).map_err(|_| E::custom("integer out of range"))
            }
            fn visit_f64<E>(self, v: f64) -> Result<YNode, E> {
                Ok(YNode::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<YNode, E> {
                Ok(YNode::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<YNode, E> {
                Ok(YNode::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<YNode, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(YNode::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<YNode, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key()? {
                    let value = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(YNode::Map(entries))
            }
        }

        deserializer.deserialize_any(NodeVisitor)
    }
}

fn yaml_line(location: &serde_saphyr::Location) -> usize {
    usize::try_from(location.line()).unwrap_or(usize::MAX).max(1)
}

/// The source spelling of a scalar, when saphyr knows its byte range.
fn yaml_raw(location: &serde_saphyr::Location, text: &str) -> Option<String> {
    let span = location.span();
    let start = usize::try_from(span.byte_offset()?).ok()?;
    let len = usize::try_from(span.byte_len()?).ok()?;
    text.get(start..start.checked_add(len)?).map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

fn convert_yaml(node: YSpanned<YNode>, text: &str) -> Node {
    let line = yaml_line(&node.referenced);
    let kind = match node.value {
        YNode::Null => Kind::Null,
        YNode::Bool(b) => Kind::Bool(b),
        YNode::Int(i) => Kind::Int(i, yaml_raw(&node.referenced, text).unwrap_or_else(|| i.to_string())),
        YNode::Float(f) => Kind::Float(f, yaml_raw(&node.referenced, text).unwrap_or_else(|| f.to_string())),
        YNode::Str(s) => Kind::Str(s),
        YNode::Seq(items) => Kind::Seq(items.into_iter().map(|item| convert_yaml(item, text)).collect()),
        YNode::Map(entries) => Kind::Map(
            entries
                .into_iter()
                .map(|(key, value)| Entry {
                    key_line: yaml_line(&key.referenced),
                    key: key.value,
                    value: convert_yaml(value, text),
                })
                .collect(),
        ),
    };
    Node { line, kind }
}

/// Byte offset → 1-based line.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(at, _)| at + 1));
        LineIndex { starts }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset).max(1)
    }
}

fn convert_toml_table(table: &toml::de::DeTable<'_>, lines: &LineIndex) -> Kind {
    let mut entries: Vec<Entry> = table
        .iter()
        .map(|(key, value)| Entry {
            key: key.get_ref().to_string(),
            key_line: lines.line_of(key.span().start),
            value: convert_toml(value, lines),
        })
        .collect();
    // The table is sorted by key; give the entries back their source order.
    entries.sort_by_key(|entry| entry.key_line);
    Kind::Map(entries)
}

fn convert_toml(value: &toml::Spanned<toml::de::DeValue<'_>>, lines: &LineIndex) -> Node {
    use toml::de::DeValue;

    let line = lines.line_of(value.span().start);
    let kind = match value.get_ref() {
        DeValue::String(s) => Kind::Str(s.to_string()),
        DeValue::Integer(i) => {
            let parsed = i128::from_str_radix(i.as_str(), i.radix()).unwrap_or(i128::MAX);
            Kind::Int(parsed, i.to_string())
        }
        DeValue::Float(f) => Kind::Float(f.as_str().parse().unwrap_or(f64::NAN), f.to_string()),
        DeValue::Boolean(b) => Kind::Bool(*b),
        DeValue::Datetime(d) => Kind::Datetime(d.to_string()),
        DeValue::Array(items) => Kind::Seq(items.iter().map(|item| convert_toml(item, lines)).collect()),
        DeValue::Table(table) => convert_toml_table(table, lines),
    };
    Node { line, kind }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(node: &Node) -> String {
        match &node.kind {
            Kind::Seq(items) => {
                format!("[{}]@{}", items.iter().map(render).collect::<Vec<_>>().join(", "), node.line)
            }
            Kind::Map(entries) => format!(
                "{{{}}}@{}",
                entries
                    .iter()
                    .map(|e| format!("{}@{}: {}", e.key, e.key_line, render(&e.value)))
                    .collect::<Vec<_>>()
                    .join(", "),
                node.line
            ),
            Kind::Int(_, raw) | Kind::Float(_, raw) => format!("#{raw}@{}", node.line),
            Kind::Str(s) => format!("{s:?}@{}", node.line),
            other => format!("{other:?}@{}", node.line),
        }
    }

    #[test]
    fn yaml_tree_has_lines_and_source_spellings() {
        let text = "a: 1\nb:\n  - x\n  - 0755\nc: {d: 1.10, e: on, f: ~}\n";
        let node = parse_yaml(text).unwrap();
        assert_eq!(
            render(&node),
            "{a@1: #1@1, b@2: [\"x\"@3, \"0755\"@4]@3, c@5: {d@5: #1.10@5, e@5: \"on\"@5, f@5: Null@5}@5}@1"
        );
    }

    #[test]
    fn yaml_duplicate_keys_reach_the_tree() {
        let node = parse_yaml("a: 1\na: 2\n").unwrap();
        assert_eq!(render(&node), "{a@1: #1@1, a@2: #2@2}@1");
    }

    #[test]
    fn yaml_syntax_error_has_line() {
        let err = parse_yaml("a: 1\nb: [1,\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(err.message.starts_with("YAML syntax error: "), "{}", err.message);
    }

    /// The parser's own wording (which names its Rust API) does not reach
    /// the user: a null key, a second document and an alias bomb each get a
    /// plain message, with no internals and nothing cut off.
    #[test]
    fn yaml_errors_are_in_plain_words() {
        let err = parse_yaml("jobs:\n  - name: a\n    env: {~: c}\n").unwrap_err();
        assert_eq!(err.message, "a mapping key is empty or null (`~`): keys are text");
        let err = parse_yaml("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(err.message, "a build file is one YAML document (a `---` line starts another)");
        let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
        for (name, prev) in [("b", "a"), ("c", "b"), ("d", "c"), ("e", "d"), ("f", "e")] {
            bomb.push_str(&format!("{name}: &{name} [{}]\n", vec![format!("*{prev}"); 10].join(",")));
        }
        bomb.push_str("jobs: [{name: j, run: x, env: *f}]\n");
        let err = parse_yaml(&bomb).unwrap_err();
        assert!(err.message.starts_with("YAML document exceeds the parser's limits ("), "{}", err.message);
        assert!(!err.message.contains("(used"), "{}", err.message);
        assert!(err.line.is_some_and(|l| l <= 7), "a line of the file: {:?}", err.line);
    }

    /// Parses on a thread with a 2 MiB stack, the size of tokio's workers and
    /// of test threads, so hostile nesting would overflow it if unbounded.
    fn on_small_stack<T: Send + 'static>(parse: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new().stack_size(2 << 20).spawn(parse).unwrap().join().unwrap()
    }

    #[test]
    fn yaml_nesting_is_limited() {
        let nested = |depth: usize| format!("a: {}1{}\n", "[".repeat(depth), "]".repeat(depth));
        assert!(on_small_stack(move || parse_yaml(&nested(MAX_DEPTH - 1))).is_ok());
        for depth in [MAX_DEPTH, 200, 100_000] {
            let err = on_small_stack(move || parse_yaml(&nested(depth))).unwrap_err();
            assert_eq!(err.line, Some(1));
            assert!(err.message.starts_with("YAML "), "{}", err.message);
        }
        let err = on_small_stack(move || parse_yaml(&nested(200))).unwrap_err();
        assert!(
            err.message.starts_with("YAML document exceeds the parser's limits (Depth"),
            "{}",
            err.message
        );
    }

    #[test]
    fn toml_nesting_is_limited() {
        for text in [
            format!("a = {}1{}\n", "[".repeat(100_000), "]".repeat(100_000)),
            format!("{}a = 1\n", "a.".repeat(100_000)),
            format!("a = {}{}\n", "{b = ".repeat(100_000), "}".repeat(100_000)),
        ] {
            let err = on_small_stack(move || parse_toml(&text)).unwrap_err();
            assert!(err.message.starts_with("TOML syntax error: "), "{}", err.message);
        }
    }

    #[test]
    fn toml_tree_keeps_source_order_and_lines() {
        let text = "z = 1\na = [\"x\",\n  0x10]\n\n[[jobs]]\nname = \"j\"\n[[jobs]]\nname = \"k\"\n";
        let node = parse_toml(text).unwrap();
        assert_eq!(
            render(&node),
            "{z@1: #1@1, a@2: [\"x\"@2, #0x10@3]@2, jobs@5: [{name@6: \"j\"@6}@5, {name@8: \"k\"@8}@7]@5}@1"
        );
    }

    #[test]
    fn toml_syntax_error_has_line() {
        let err = parse_toml("a = 1\nb = = 2\n").unwrap_err();
        assert_eq!(err.line, Some(2));
    }
}
