//! Integration tests of drover-exec with real supervisor processes: running
//! jobs (`run`), stopping them and everything they started (`stop`),
//! suspending and resuming them (`suspend`), the worker dying under a job
//! (`worker_death`), and the zygote that forks every supervisor (`zygote`).
//! One binary, so one link step.

mod run;
mod stop;
mod support;
mod suspend;
mod worker_death;
mod zygote;
