//! "Did you mean" suggestions: the closest candidate to a misspelled key or
//! job name, by optimal-string-alignment distance (an adjacent transposition
//! counts as one edit, so `nmae` suggests `name`).

/// Longest word (in characters) a suggestion is looked for: a longer one
/// is no typo, and comparing it with every candidate would cost the square
/// of its length each time.
const MAX_WORD: usize = 64;

/// The candidate closest to `word`, if it is close enough to be a plausible
/// typo: at most one edit per three characters (and at least one edit),
/// and never every character of `word` (`b` is no typo of `a`). Each
/// comparison made takes its cost (the product of the two lengths) from
/// `budget`; none is made once it is spent.
fn closest_within<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    budget: &mut u64,
) -> Option<&'a str> {
    let length = word.chars().count();
    if length > MAX_WORD {
        return None;
    }
    let limit = (length / 3).max(1).min(length.saturating_sub(1));
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        if candidate == word {
            continue;
        }
        // The difference in length is a lower bound on the distance.
        let other = candidate.chars().count();
        if other.abs_diff(length) > limit {
            continue;
        }
        let cost = (length * other) as u64;
        let Some(left) = budget.checked_sub(cost) else { break };
        *budget = left;
        let d = distance(word, candidate);
        if d <= limit && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// [`closest_within`] with no limit but [`MAX_WORD`]: for a short, fixed
/// list of candidates (the keys a map may have).
pub(crate) fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut unlimited = u64::MAX;
    closest_within(word, candidates, &mut unlimited)
}

/// ` (did you mean "x"?)`, or nothing.
pub(crate) fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    hint(closest(word, candidates))
}

fn hint(found: Option<&str>) -> String {
    found.map(|c| format!(" (did you mean {c:?}?)")).unwrap_or_default()
}

/// Suggestions among a file's own names (its jobs'), which may be many:
/// all of them together cost at most a fixed amount of work, so that a file
/// with thousands of misspelled names among thousands of jobs is still
/// checked at once (the later ones then come without a suggestion).
pub(crate) struct Suggestions {
    budget: u64,
}

impl Suggestions {
    /// About a quarter of a second of comparisons, at most.
    pub(crate) fn new() -> Suggestions {
        Suggestions { budget: 50_000_000 }
    }

    /// [`did_you_mean`], within what is left of the budget.
    pub(crate) fn did_you_mean<'a>(
        &mut self,
        word: &str,
        candidates: impl IntoIterator<Item = &'a str>,
    ) -> String {
        hint(closest_within(word, candidates, &mut self.budget))
    }
}

/// Optimal string alignment distance between `a` and `b`, over characters,
/// with three rows of the table.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // before[j], above[j], row[j]: distance between a[..i-2], a[..i-1],
    // a[..i] and b[..j].
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut above: Vec<usize> = (0..=b.len()).collect();
    let mut row: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (above[j] + 1).min(row[j - 1] + 1).min(above[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            row[j] = best;
        }
        std::mem::swap(&mut before, &mut above);
        std::mem::swap(&mut above, &mut row);
    }
    above[b.len()]
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

    #[test]
    fn long_words_and_spent_budgets_get_no_suggestion() {
        let long = "a".repeat(30_000);
        assert_eq!(closest(&long, [long[1..].as_ref()]), None, "a word that long is no typo");
        let mut few = Suggestions { budget: 16 };
        assert_eq!(few.did_you_mean("nmae", ["name"]), " (did you mean \"name\"?)");
        assert_eq!(few.did_you_mean("nmae", ["name"]), "", "the budget is spent");
    }
}
