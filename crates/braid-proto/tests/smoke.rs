use braid_proto::harness::{payload, payload_id, Harness, Link};
use braid_proto::*;

fn ids(h: &Harness) -> Vec<u64> {
    h.delivered.iter().map(|(_, p)| payload_id(p)).collect()
}

fn links(n: usize) -> Vec<Link> {
    (0..n)
        .map(|i| Link {
            rate_bps: Some(10_000_000),
            delay: Duration::from_millis(1 + 7 * i as u64),
            jitter: Duration::from_micros(500),
            ..Link::default()
        })
        .collect()
}

#[test]
fn logical_no_loss_in_order() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let mut cfg = StripeConfig::srr(vec![1500, 3000, 1500], 1500);
        cfg.mode = mode;
        let mut h = Harness::new(cfg, links(3), 1).unwrap();
        for i in 0..2000u64 {
            h.send_at(
                Instant::from_micros(i * 100),
                payload(i, 100 + (i as usize * 37) % 1300),
            );
        }
        h.drive();
        let got = ids(&h);
        let bad = got.windows(2).position(|w| w[1] != w[0] + 1);
        assert!(
            bad.is_none() && got.len() == 2000,
            "mode {mode:?}: len {} first bad at {:?} {:?} stats {:?}",
            got.len(),
            bad,
            bad.map(|b| &got[b.saturating_sub(3)..(b + 5).min(got.len())]),
            h.reseq.stats()
        );
    }
}

#[test]
fn loss_then_resync() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
        cfg.mode = mode;
        let mut l = links(2);
        l[0].loss = 0.3;
        l[0].loss_window = Some((Instant::ZERO, Instant::from_micros(50_000)));
        let mut h = Harness::new(cfg, l, 7).unwrap();
        for i in 0..3000u64 {
            h.send_at(
                Instant::from_micros(i * 100),
                payload(i, 200 + (i as usize * 91) % 1200),
            );
        }
        h.drive();
        let got = ids(&h);
        let tail: Vec<u64> = got.iter().copied().filter(|&i| i >= 1500).collect();
        let bad = tail.windows(2).position(|w| w[1] != w[0] + 1);
        assert!(
            bad.is_none() && tail.len() == 1500,
            "mode {mode:?}: len {} first bad at {:?} {:?} stats {:?}",
            tail.len(),
            bad,
            bad.map(|b| &tail[b.saturating_sub(3)..(b + 5).min(tail.len())]),
            h.reseq.stats()
        );
        eprintln!(
            "{mode:?}: delivered {} stats {:?}",
            got.len(),
            h.reseq.stats()
        );
    }
}
