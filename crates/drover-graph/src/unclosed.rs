//! Where a YAML syntax error really is, when the parser notices it late.
//!
//! A `[` or `{` left open (`run: ["make"` with no `]`) is valid until the
//! next line that cannot belong to the collection, so the parser reports
//! that line, with a message about it ("`-` is only valid inside a block").
//! [`unclosed_flow`] looks back from the reported line for a bracket that
//! was opened and never closed, so the error can name the line the mistake
//! is on. It is a heuristic, only asked once parsing has failed: it follows
//! quotes, comments and block scalars (`|`, `>`) well enough for build
//! files, and answers only when the reported line is indented no deeper
//! than the line the bracket is on (a collection that went on over several
//! lines would be indented deeper).

/// The 1-based line and the bracket of the outermost `[` or `{` opened
/// before line `error_line` and not closed by then, if the error line is
/// indented no deeper than that line.
pub(crate) fn unclosed_flow(text: &str, error_line: usize) -> Option<(usize, char)> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |line: &str| line.len() - line.trim_start_matches(' ').len();
    let error_indent = indent(lines.get(error_line.checked_sub(1)?)?);
    let mut open: Vec<(usize, char)> = Vec::new();
    let mut quote: Option<char> = None;
    // While inside a block scalar: the indentation of the line that opened it.
    let mut block: Option<usize> = None;
    for (i, line) in lines.iter().enumerate().take(error_line - 1) {
        if let Some(at) = block {
            if line.trim().is_empty() || indent(line) > at {
                continue;
            }
            block = None;
        }
        let mut chars = line.char_indices().peekable();
        let mut prev = ' ';
        while let Some((_, c)) = chars.next() {
            match (quote, c) {
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some(q), _) if c == q => {
                    // '' inside a single-quoted string is an escaped quote.
                    if q == '\'' && chars.peek().is_some_and(|&(_, n)| n == '\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
                (Some(_), _) => {}
                (None, '"' | '\'') if prev == ' ' || "[{,:".contains(prev) => quote = Some(c),
                (None, '#') if prev == ' ' => break,
                (None, '[' | '{') => open.push((i + 1, c)),
                (None, ']' | '}') => {
                    open.pop();
                }
                _ => {}
            }
            prev = c;
        }
        if quote.is_none() && open.is_empty() && opens_block_scalar(line) {
            block = Some(indent(line));
        }
    }
    let &(line, bracket) = open.first()?;
    (error_indent <= indent(lines[line - 1])).then_some((line, bracket))
}

/// Does the line end with a block scalar's indicator (`key: |`, `- >-`)?
fn opens_block_scalar(line: &str) -> bool {
    let code = line.split(" #").next().unwrap_or_default().trim_end();
    let Some((before, indicator)) = code.rsplit_once(' ') else { return false };
    let before = before.trim_end();
    (before.ends_with(':') || before.trim_start() == "-" || before.ends_with(" -"))
        && indicator.starts_with(['|', '>'])
        && indicator[1..].chars().all(|c| "+-123456789".contains(c))
}

#[cfg(test)]
mod tests {
    use super::unclosed_flow;

    #[test]
    fn a_sequence_left_open_before_the_next_job() {
        let text = "jobs:\n  - name: a\n    run: [\"echo hi\"\n  - name: b\n    run: [x]\n";
        assert_eq!(unclosed_flow(text, 4), Some((3, '[')));
    }

    #[test]
    fn a_mapping_left_open_before_the_next_key() {
        let text = "jobs:\n  - name: a\n    run: [x]\n    env: {A: 1\n  - name: b\n";
        assert_eq!(unclosed_flow(text, 5), Some((4, '{')));
    }

    /// Brackets in quotes, comments and block scalars are text; closed
    /// collections and collections still going on (deeper lines) are no
    /// answer.
    #[test]
    fn text_and_closed_or_continued_collections_are_not_unclosed() {
        let quoted = "a: \"[\"\nb: '{'' ['\nc: x # [\nd: [1, 2]\ne: -\n";
        assert_eq!(unclosed_flow(quoted, 5), None);
        let block = "a: |\n  echo [\n  {\nb: - x\n";
        assert_eq!(unclosed_flow(block, 4), None);
        let continued = "run: [\"a\",\n      b: c]\n";
        assert_eq!(unclosed_flow(continued, 2), None);
        assert_eq!(unclosed_flow("a: [1,\n", 9), None, "a line past the end");
    }
}
