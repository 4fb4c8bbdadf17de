//! "Did you mean" suggestions: the closest candidate to a misspelled key or
//! job name, by optimal-string-alignment distance (an adjacent transposition
//! counts as one edit, so `nmae` suggests `name`).

/// The candidate closest to `word`, if it is close enough to be a plausible
/// typo: at most one edit per three characters (and at least one edit),
/// and never every character of `word` (`b` is no typo of `a`).
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let length = word.chars().count();
    let limit = (length / 3).max(1).min(length.saturating_sub(1));
    candidates
        .into_iter()
        .filter(|candidate| *candidate != word)
        .map(|candidate| (distance(word, candidate), candidate))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, candidate)| candidate)
}

/// ` (did you mean "x"?)`, or nothing.
pub(crate) fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(word, candidates).map(|c| format!(" (did you mean {c:?}?)")).unwrap_or_default()
}

/// Optimal string alignment distance between `a` and `b`, over characters.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // rows[i][j]: distance between a[..i] and b[..j].
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("name", "name"), 0);
        assert_eq!(distance("nmae", "name"), 1);
        assert_eq!(distance("compil-a", "compile-a"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggestions() {
        let keys = ["name", "run", "needs", "env"];
        assert_eq!(closest("nmae", keys), Some("name"));
        assert_eq!(closest("neds", keys), Some("needs"));
        assert_eq!(closest("rn", keys), Some("run"));
        assert_eq!(closest("command", keys), None);
        assert_eq!(did_you_mean("envv", keys), " (did you mean \"env\"?)");
        assert_eq!(did_you_mean("zzzzzz", keys), "");
        assert_eq!(closest("b", ["a", "c"]), None, "a one-letter name is no typo of another");
        assert_eq!(closest("ab", ["a", "abc"]), Some("a"));
    }
}
