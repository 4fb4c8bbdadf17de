//! Jobs come back in topological order: dependencies first, ties in file
//! order.

use crate::common::Dir;

fn order(yaml: &str) -> Vec<String> {
    Dir::new().parse(yaml).jobs.into_iter().map(|job| job.name).collect()
}

#[test]
fn independent_jobs_keep_file_order() {
    assert_eq!(
        order("jobs:\n  - {name: c, run: x}\n  - {name: a, run: x}\n  - {name: b, run: x}\n"),
        ["c", "a", "b"]
    );
}

#[test]
fn dependencies_come_first() {
    let yaml = "\
jobs:
  - {name: link, needs: [compile-b, compile-a], run: x}
  - {name: compile-a, run: x}
  - {name: test, needs: [link], run: x}
  - {name: compile-b, run: x}
  - {name: docs, run: x}
";
    // compile-a and compile-b are ready first (file order), then link (the
    // earliest job ready once they are done), then test and docs in file order.
    assert_eq!(order(yaml), ["compile-a", "compile-b", "link", "test", "docs"]);
}

#[test]
fn diamond() {
    let yaml = "\
jobs:
  - {name: top, needs: [left, right], run: x}
  - {name: right, needs: [base], run: x}
  - {name: left, needs: [base], run: x}
  - {name: base, run: x}
";
    assert_eq!(order(yaml), ["base", "right", "left", "top"]);
}

#[test]
fn every_job_follows_all_its_needs() {
    let yaml = "\
jobs:
  - {name: e, needs: [d, a], run: x}
  - {name: d, needs: [c], run: x}
  - {name: c, needs: [b], run: x}
  - {name: b, needs: [a], run: x}
  - {name: a, run: x}
  - {name: f, needs: [e, b], run: x}
";
    let build = Dir::new().parse(yaml);
    let position = |name: &str| build.jobs.iter().position(|j| j.name == name).expect("job");
    for job in &build.jobs {
        for need in &job.needs {
            assert!(position(need) < position(&job.name), "{need} must come before {}", job.name);
        }
    }
    assert_eq!(build.jobs.len(), 6);
}
