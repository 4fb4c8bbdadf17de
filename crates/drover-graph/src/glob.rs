//! Glob patterns over `/`-separated relative paths, used by `sources` (matched
//! against the files under the build directory) and by a job's `inputs`
//! (matched against the build's source paths).
//!
//! Syntax: `*` matches any run of characters within one path segment, `?`
//! matches one character within a segment, and a segment that is exactly `**`
//! matches zero or more whole segments (`**/*.h` is every `.h` file at any
//! depth), except at the end of a pattern, where it matches one or more:
//! `src/**` is everything under `src`, but not `src` itself. Everything else is literal. `.` and
//! empty segments are ignored (`./src//a.c` is `src/a.c`).
//!
//! Hidden names: a wildcard never matches a segment that starts with `.`; such
//! a segment is only matched by a pattern segment that itself starts with a
//! literal `.`. So `**` skips `.git` and `.drover`, while `.drover/**` or
//! `src/.*` name them explicitly.
//!
//! A pattern is matched by stepping a set of positions (an NFA over segments)
//! one path segment at a time, which lets a directory walk stop descending as
//! soon as no position is left.

use std::fmt;

/// A parsed pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pattern {
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// `**`: zero or more whole segments.
    AnyDepth,
    /// A single segment, possibly with `*` and `?`.
    Name(Vec<Token>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`
    One,
    /// `*`
    Many,
}

/// Why a pattern is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PatternError {
    Empty,
    Absolute,
    ParentDir,
    PartialDoubleStar,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PatternError::Empty => "is empty",
            PatternError::Absolute => "is an absolute path; it must be relative to the build directory",
            PatternError::ParentDir => "contains \"..\" and would escape the build directory",
            PatternError::PartialDoubleStar => "uses \"**\" inside a segment; \"**\" must be a whole segment",
        })
    }
}

/// A set of positions in a pattern's segments (sorted, without repeats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct States(Vec<usize>);

impl States {
    /// No position left: nothing below can match.
    pub(crate) fn is_dead(&self) -> bool {
        self.0.is_empty()
    }
}

impl Pattern {
    pub(crate) fn parse(text: &str) -> Result<Pattern, PatternError> {
        if text.trim().is_empty() {
            return Err(PatternError::Empty);
        }
        if text.starts_with('/') || text.starts_with('\\') || has_drive_prefix(text) {
            return Err(PatternError::Absolute);
        }
        let mut segments = Vec::new();
        for part in text.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(PatternError::ParentDir),
                "**" => {
                    // `**/**` is the same as `**`.
                    if segments.last() != Some(&Segment::AnyDepth) {
                        segments.push(Segment::AnyDepth);
                    }
                }
                _ if part.contains("**") => return Err(PatternError::PartialDoubleStar),
                _ => segments.push(Segment::Name(
                    part.chars()
                        .map(|c| match c {
                            '*' => Token::Many,
                            '?' => Token::One,
                            c => Token::Literal(c),
                        })
                        .collect(),
                )),
            }
        }
        if segments.is_empty() {
            return Err(PatternError::Empty);
        }
        // A trailing `**` means "everything below", never the directory
        // itself: `src/**` is `src/*/**`.
        if segments.last() == Some(&Segment::AnyDepth) {
            segments.insert(segments.len() - 1, Segment::Name(vec![Token::Many]));
        }
        Ok(Pattern { segments })
    }

    /// The positions before any segment is read.
    pub(crate) fn start(&self) -> States {
        self.closure(vec![0])
    }

    /// The positions after reading one more path segment `name`.
    pub(crate) fn step(&self, states: &States, name: &str) -> States {
        let hidden = name.starts_with('.');
        let mut next = Vec::new();
        for &at in &states.0 {
            match self.segments.get(at) {
                Some(Segment::AnyDepth) if !hidden => next.push(at),
                Some(Segment::Name(tokens)) if segment_matches(tokens, name) => next.push(at + 1),
                _ => {}
            }
        }
        self.closure(next)
    }

    /// Whether a path that led to `states` is matched.
    pub(crate) fn accepts(&self, states: &States) -> bool {
        states.0.last() == Some(&self.segments.len())
    }

    /// Whether the whole `/`-separated relative `path` is matched.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let mut states = self.start();
        for name in path.split('/') {
            states = self.step(&states, name);
            if states.is_dead() {
                return false;
            }
        }
        self.accepts(&states)
    }

    /// The path the pattern names when it has no wildcard at all.
    pub(crate) fn literal_path(&self) -> Option<String> {
        let mut parts = Vec::with_capacity(self.segments.len());
        for segment in &self.segments {
            match segment {
                Segment::Name(tokens) => parts.push(
                    tokens
                        .iter()
                        .map(|t| match t {
                            Token::Literal(c) => Some(*c),
                            Token::One | Token::Many => None,
                        })
                        .collect::<Option<String>>()?,
                ),
                Segment::AnyDepth => return None,
            }
        }
        Some(parts.join("/"))
    }

    /// Adds the positions reachable by letting a `**` match zero segments.
    fn closure(&self, mut states: Vec<usize>) -> States {
        let mut i = 0;
        while i < states.len() {
            let at = states[i];
            if self.segments.get(at) == Some(&Segment::AnyDepth) {
                states.push(at + 1);
            }
            i += 1;
        }
        states.sort_unstable();
        states.dedup();
        States(states)
    }
}

/// `C:` or `C:\...`: absolute on Windows, refused everywhere for portability.
fn has_drive_prefix(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Wildcard match of one segment. Leading `.` must be matched literally.
fn segment_matches(tokens: &[Token], name: &str) -> bool {
    if name.starts_with('.') && tokens.first() != Some(&Token::Literal('.')) {
        return false;
    }
    let name: Vec<char> = name.chars().collect();
    // Classic single-backtrack wildcard matching: on a mismatch, let the last
    // `*` absorb one more character.
    let (mut t, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(t) {
            Some(Token::Many) => {
                star = Some((t, n));
                t += 1;
            }
            Some(Token::One) => {
                t += 1;
                n += 1;
            }
            Some(Token::Literal(c)) if *c == name[n] => {
                t += 1;
                n += 1;
            }
            _ => match star {
                Some((star_t, star_n)) => {
                    t = star_t + 1;
                    n = star_n + 1;
                    star = Some((star_t, star_n + 1));
                }
                None => return false,
            },
        }
    }
    tokens[t.min(tokens.len())..].iter().all(|token| *token == Token::Many)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        Pattern::parse(pattern).unwrap().matches(path)
    }

    #[test]
    fn single_segment_wildcards() {
        assert!(m("*.h", "a.h"));
        assert!(!m("*.h", "include/a.h"));
        assert!(m("include/*.h", "include/a.h"));
        assert!(!m("include/*.h", "include/sub/a.h"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(!m("a?c", "abbc"));
        assert!(m("*", "x"));
        assert!(m("a*b*c", "aXbYbZc"));
        assert!(!m("a*b*c", "aXbYbZ"));
        assert!(m("*a", "aaa"));
        assert!(m("**/x", "x"));
    }

    #[test]
    fn double_star_crosses_segments() {
        assert!(m("src/**", "src/a.c"));
        assert!(m("src/**", "src/deep/er/a.c"));
        assert!(!m("src/**", "src"));
        assert!(!m("src/**", "srcx/a.c"));
        assert!(m("**/*.c", "a.c"));
        assert!(m("**/*.c", "x/y/a.c"));
        assert!(m("a/**/b", "a/b"));
        assert!(m("a/**/b", "a/x/y/b"));
        assert!(!m("a/**/b", "a/x/y/c"));
        assert!(m("**", "anything/at/all"));
        assert!(m("**", "x"));
        assert!(!m("a/**", "a"));
    }

    #[test]
    fn hidden_names_need_an_explicit_dot() {
        assert!(!m("*", ".env"));
        assert!(!m("**", ".git/config"));
        assert!(!m("src/**", "src/.cache/x"));
        assert!(!m("**", ".drover/state"));
        assert!(m(".*", ".env"));
        assert!(m(".drover/**", ".drover/state"));
        assert!(m("src/.cache/*", "src/.cache/x"));
        assert!(m("*.env", "x.env"));
    }

    #[test]
    fn normalization_and_errors() {
        assert!(m("./src//a.c", "src/a.c"));
        assert_eq!(Pattern::parse(""), Err(PatternError::Empty));
        assert_eq!(Pattern::parse("./"), Err(PatternError::Empty));
        assert_eq!(Pattern::parse("/etc/*"), Err(PatternError::Absolute));
        assert_eq!(Pattern::parse("C:/x"), Err(PatternError::Absolute));
        assert_eq!(Pattern::parse("../x"), Err(PatternError::ParentDir));
        assert_eq!(Pattern::parse("src/../../x"), Err(PatternError::ParentDir));
        assert_eq!(Pattern::parse("src/a**"), Err(PatternError::PartialDoubleStar));
    }

    #[test]
    fn literal_paths() {
        assert_eq!(Pattern::parse("./src/a.c").unwrap().literal_path().as_deref(), Some("src/a.c"));
        assert_eq!(Pattern::parse("src/*.c").unwrap().literal_path(), None);
        assert_eq!(Pattern::parse("src/**").unwrap().literal_path(), None);
    }

    #[test]
    fn stepping_prunes() {
        let pattern = Pattern::parse("src/*.c").unwrap();
        let start = pattern.start();
        assert!(pattern.step(&start, "docs").is_dead());
        let in_src = pattern.step(&start, "src");
        assert!(!in_src.is_dead());
        assert!(!pattern.accepts(&in_src));
        assert!(pattern.accepts(&pattern.step(&in_src, "a.c")));
        assert!(pattern.step(&pattern.step(&in_src, "sub"), "a.c").is_dead());
    }
}
