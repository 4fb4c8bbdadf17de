//! `drover-exec-supervisor SPEC.json`: a job supervisor as a binary of its
//! own (the `drover` binary offers the same through a hidden argument).
//! The crate's integration tests start their jobs with it.

fn main() {
    std::process::exit(drover_exec::supervisor_main());
}
