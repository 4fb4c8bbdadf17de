//! `{{...}}` placeholders in commands and environment values: `{{src}}` (the
//! job's read-only view of the sources), `{{out}}` (its empty output
//! directory) and `{{dep:NAME}}` (the output of dependency `NAME`). Spaces
//! inside the braces are allowed (`{{ dep: lib }}`). There is no escape: a
//! literal `{{` always starts a placeholder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A placeholder found in a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Placeholder<'a> {
    Src,
    Out,
    Dep(&'a str),
}

/// Why a text's placeholders cannot be substituted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    /// `{{...}}` that is none of the known placeholders.
    #[error("unknown placeholder {0:?} (expected {{{{src}}}}, {{{{out}}}} or {{{{dep:NAME}}}})")]
    Unknown(String),
    /// `{{dep:}}` without a name.
    #[error("placeholder {0:?} names no job")]
    EmptyDep(String),
    /// `{{` with no `}}` after it.
    #[error("unterminated placeholder: \"{{{{\" without a closing \"}}}}\"")]
    Unterminated,
    /// `{{dep:NAME}}` where `NAME` is not a dependency of the job, with a
    /// suggestion among its needs (or nothing).
    #[error("placeholder \"{{{{dep:{0}}}}}\" names {0:?}, which is not in needs{1}")]
    NotADependency(String, String),
    /// A path to substitute is not valid UTF-8.
    #[error("path {} is not valid UTF-8", .0.display())]
    NonUtf8Path(PathBuf),
}

/// One piece of a text: literal text or a placeholder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    Text(&'a str),
    Placeholder(Placeholder<'a>),
}

/// Splits `text` into literal pieces and placeholders. Errors stop the scan
/// only when the rest cannot be read (an unterminated `{{`).
pub(crate) fn scan(text: &str) -> (Vec<Piece<'_>>, Vec<PlaceholderError>) {
    let mut pieces = Vec::new();
    let mut errors = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        if open > 0 {
            pieces.push(Piece::Text(&rest[..open]));
        }
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            errors.push(PlaceholderError::Unterminated);
            return (pieces, errors);
        };
        let raw = &rest[open..open + 2 + close + 2];
        let inner = after[..close].trim();
        match inner {
            "src" => pieces.push(Piece::Placeholder(Placeholder::Src)),
            "out" => pieces.push(Piece::Placeholder(Placeholder::Out)),
            _ => match inner.strip_prefix("dep:") {
                Some(name) if !name.trim().is_empty() => {
                    pieces.push(Piece::Placeholder(Placeholder::Dep(name.trim())));
                }
                Some(_) => errors.push(PlaceholderError::EmptyDep(raw.to_owned())),
                None => errors.push(PlaceholderError::Unknown(raw.to_owned())),
            },
        }
        rest = &after[close + 2..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    (pieces, errors)
}

/// Every problem with the placeholders of `text` for a job whose `needs` are
/// `needs`.
pub(crate) fn check(text: &str, needs: &[String]) -> Vec<PlaceholderError> {
    let (pieces, mut errors) = scan(text);
    for piece in pieces {
        if let Piece::Placeholder(Placeholder::Dep(name)) = piece
            && !needs.iter().any(|need| need == name)
        {
            let hint = crate::suggest::did_you_mean(name, needs.iter().map(String::as_str));
            errors.push(PlaceholderError::NotADependency(name.to_owned(), hint));
        }
    }
    errors
}

fn path_str(path: &Path) -> Result<&str, PlaceholderError> {
    path.to_str().ok_or_else(|| PlaceholderError::NonUtf8Path(path.to_owned()))
}

/// Substitutes the placeholders of `command` (or of an environment value):
/// `{{src}}` by `src`, `{{out}}` by `out`, `{{dep:NAME}}` by `deps[NAME]`.
/// Paths are inserted as they are, without shell quoting.
pub fn render(
    command: &str,
    src: &Path,
    out: &Path,
    deps: &BTreeMap<String, PathBuf>,
) -> Result<String, PlaceholderError> {
    let (pieces, errors) = scan(command);
    if let Some(error) = errors.into_iter().next() {
        return Err(error);
    }
    let mut rendered = String::with_capacity(command.len());
    for piece in pieces {
        match piece {
            Piece::Text(text) => rendered.push_str(text),
            Piece::Placeholder(Placeholder::Src) => rendered.push_str(path_str(src)?),
            Piece::Placeholder(Placeholder::Out) => rendered.push_str(path_str(out)?),
            Piece::Placeholder(Placeholder::Dep(name)) => {
                let path = deps
                    .get(name)
                    .ok_or_else(|| PlaceholderError::NotADependency(name.to_owned(), String::new()))?;
                rendered.push_str(path_str(path)?);
            }
        }
    }
    Ok(rendered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_pieces() {
        let (pieces, errors) = scan("a {{src}}/x {{ dep: lib }}{{out}}");
        assert!(errors.is_empty());
        assert_eq!(
            pieces,
            vec![
                Piece::Text("a "),
                Piece::Placeholder(Placeholder::Src),
                Piece::Text("/x "),
                Piece::Placeholder(Placeholder::Dep("lib")),
                Piece::Placeholder(Placeholder::Out),
            ]
        );
    }

    #[test]
    fn check_reports_all() {
        let errors = check("{{foo}} {{dep:x}} {{dep:}} {{src", &["y".to_owned()]);
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            vec![
                "unknown placeholder \"{{foo}}\" (expected {{src}}, {{out}} or {{dep:NAME}})",
                "placeholder \"{{dep:}}\" names no job",
                "unterminated placeholder: \"{{\" without a closing \"}}\"",
                "placeholder \"{{dep:x}}\" names \"x\", which is not in needs",
            ]
        );
    }

    #[test]
    fn a_misspelled_dependency_gets_a_suggestion_among_the_needs() {
        let needs = ["cc-lzio".to_owned(), "cc-lvm".to_owned()];
        let messages: Vec<String> =
            check("ar {{dep:cc-lzoi}}/a.o", &needs).iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "placeholder \"{{dep:cc-lzoi}}\" names \"cc-lzoi\", which is not in needs (did you mean \"cc-lzio\"?)"
            ]
        );
    }
}
