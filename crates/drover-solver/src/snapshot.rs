//! Snapshots: a [`Solver`] serializes whole, so that the coordinator can
//! write its state down and drop the inputs behind it from its log (a
//! replay then starts from the snapshot instead of from an empty solver).
//! The encoding is the coordinator's choice (it uses CBOR: binary, and
//! exact for every value the state holds); this crate stays free of it.
//!
//! A snapshot holds the solver's fields, with two exceptions:
//! - the plans of builds are written apart, each once with the builds that
//!   share it, so that builds submitted with one spec still share one plan
//!   (and one copy of the spec) when read back;
//! - the core's index of jobs by ID is not written; reading the core back
//!   rebuilds it (see `drover_core::Scheduler`'s `Deserialize`).
//!
//! Read back, a snapshot gives a solver equal to the one written, which
//! takes the same decisions for the same inputs. The effects not taken yet
//! are not part of it. The format follows the code: [`SNAPSHOT_FORMAT`]
//! names it, and the coordinator reads no snapshot of another format.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Solver;
use crate::build::Plan;

/// The snapshot format this code writes and reads. Changed whenever the
/// solver's or the core's state changes shape, but for a field added with
/// a default (`#[serde(default)]`): CBOR writes structs as maps, so an older
/// snapshot reads with the default, and an older reader skips the field.
pub const SNAPSHOT_FORMAT: &str = "drover-solver-5";

/// The solver's own fields (through the code `#[serde(remote = "Self")]`
/// derives), without the builds' plans.
struct Fields<'a>(&'a Solver);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Solver::serialize(self.0, serializer)
    }
}

struct OwnedFields(Solver);

impl<'de> Deserialize<'de> for OwnedFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Solver::deserialize(deserializer).map(OwnedFields)
    }
}

#[derive(Serialize)]
struct Written<'a> {
    solver: Fields<'a>,
    /// Each plan once, with the builds that hold it.
    plans: Vec<(&'a Plan, Vec<u64>)>,
}

#[derive(Deserialize)]
struct Read {
    solver: OwnedFields,
    plans: Vec<(Plan, Vec<u64>)>,
}

impl Serialize for Solver {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Plans in the order of the first build holding each.
        let mut plans: Vec<(&Plan, Vec<u64>)> = Vec::new();
        let mut seen: BTreeMap<*const Plan, usize> = BTreeMap::new();
        for (&id, build) in &self.builds {
            let plan = build.plan();
            let at = *seen.entry(Arc::as_ptr(plan)).or_insert_with(|| {
                plans.push((plan, Vec::new()));
                plans.len() - 1
            });
            plans[at].1.push(id);
        }
        Written { solver: Fields(self), plans }.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Solver {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let Read { solver: OwnedFields(mut solver), plans } = Read::deserialize(deserializer)?;
        let mut given = 0;
        for (plan, builds) in plans {
            let plan = Arc::new(plan);
            for id in builds {
                let build = solver.builds.get_mut(&id).map(Arc::make_mut).ok_or_else(|| {
                    D::Error::custom(format!("a plan names build {id}, which the state does not hold"))
                })?;
                build.set_plan(plan.clone());
                given += 1;
            }
        }
        if given != solver.builds.len() {
            return Err(D::Error::custom("a build of the state has no plan"));
        }
        Ok(solver)
    }
}
