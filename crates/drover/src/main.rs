//! The `drover` command. For now it only reports what it is; the coordinator,
//! worker and client commands arrive with the service (see the README).

use clap::Parser;

/// drover: a distributed scheduler for build and CI work.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    let config = drover_core::Config::default();
    println!(
        "drover {}: scheduling core ready (CacheTimeout {}, DepsTimeout {}); \
         the coordinator and workers are not built yet",
        env!("CARGO_PKG_VERSION"),
        config.cache_timeout,
        config.deps_timeout
    );
    Ok(())
}
