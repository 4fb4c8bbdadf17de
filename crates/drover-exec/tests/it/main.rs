//! Integration tests of drover-exec with real supervisor processes: running
//! jobs (`run`), commands started without a shell (`plain`), stopping them
//! and everything they started (`stop`), suspending and resuming them
//! (`suspend`), the worker dying under a job (`worker_death`), the zygote
//! that forks the supervisors (`zygote`), and the supervisors' reuse from
//! job to job (`reuse`).
//! One binary, so one link step.

mod plain;
mod reuse;
mod run;
mod stop;
mod support;
mod suspend;
mod worker_death;
mod zygote;
