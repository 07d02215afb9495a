//! Helpers the simulator's test files share: parse a scenario (or its error) and run it.

#![allow(dead_code)] // each test file uses what it needs

use std::path::Path;

use braid_sim::report::{run_scenario, Report};
use braid_sim::scenario::{self, Scenario};

/// A scenario that must parse.
pub fn parse(text: &str) -> Scenario {
    scenario::parse(text, "test.toml", Path::new("."), "test")
        .unwrap_or_else(|e| panic!("scenario should parse: {e}"))
}

/// The error of a scenario that must be rejected.
pub fn parse_err(text: &str) -> String {
    match scenario::parse(text, "bad.toml", Path::new("."), "bad") {
        Ok(_) => panic!("scenario should be rejected:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Run every run of `sc` with `seed`, one thread.
pub fn run(sc: &Scenario, seed: u64) -> Report {
    run_scenario(sc, seed, 1, &|_, _| {}).unwrap_or_else(|e| panic!("run failed: {e}"))
}
