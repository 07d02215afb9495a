//! The seed 004 scenarios reproduce the paper's example and keep their guarantees.

use std::path::Path;

use braid_sim::credit;

fn run(name: &str) -> credit::Report {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/credit")
        .join(name);
    assert!(credit::is_credit_file(&path));
    let sc = credit::load(&path).unwrap();
    credit::run_scenario(&sc, sc.seed)
}

#[test]
fn figure_6_doubles_each_round() {
    let rep = run("fig6.toml");
    let r = &rep.runs[0];
    let a0: Vec<u32> = r.units[0].allocation[19..26]
        .iter()
        .map(|a| a.unwrap())
        .collect();
    // Before the ramp 20 (10 % at alpha = 2); then doubling to the fair share, 90 = 45 %.
    assert_eq!(a0[0], 20);
    let mut distinct: Vec<u32> = a0.clone();
    distinct.dedup();
    assert_eq!(distinct, vec![20, 40, 80, 90], "{a0:?}");
    // Unit 1 keeps what it uses.
    assert!(r.units[1].allocation[19..30].iter().all(|a| *a == Some(20)));
    assert_eq!(r.receiver_overflow, 0);
}

#[test]
fn overload_loses_nothing_with_credits_only() {
    let rep = run("overload.toml");
    assert_eq!(rep.runs[0].receiver_overflow, 0);
    assert_eq!(rep.runs[0].refused, 0);
    assert!(rep.runs[1].receiver_overflow > 0);
}
