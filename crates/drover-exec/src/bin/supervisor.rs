//! `drover-exec-supervisor`: a zygote that keeps job supervisors, as a
//! binary of its own (the `drover` binary offers the same through a hidden
//! argument). It takes no argument; the worker starts it with its socket as
//! standard input (see `Supervisor::new`). The crate's integration tests
//! start their jobs with it.

fn main() {
    std::process::exit(drover_exec::zygote_main());
}
