//! The paper's approximate analysis (§5.2) of average segment delay and throughput
//! efficiency with 100 % recovery, independent losses of probability p, and an
//! acknowledgement that returns `t_a = RTD + 3 t_p` after the last packet of a group.
//!
//! Windows are counted in segments; `w_a = t_a / t_s` is the bandwidth-delay product in
//! segments (a window of `1 + w_a` keeps an error-free sender busy).

/// The link and segment the analysis describes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Packet size on the wire, bytes (l).
    pub packet_bytes: f64,
    /// Packets per segment (s).
    pub segment_packets: f64,
    /// Data rate, bit/s (A).
    pub rate_bps: f64,
    /// Round-trip delay, seconds (RTD).
    pub rtd_s: f64,
}

impl Link {
    /// Packet transmitting time t_p = 8 l / A, seconds.
    pub fn t_p(&self) -> f64 {
        8.0 * self.packet_bytes / self.rate_bps
    }
    /// Segment transmitting time t_s = s t_p.
    pub fn t_s(&self) -> f64 {
        self.segment_packets * self.t_p()
    }
    /// Acknowledgement delay t_a = RTD + 3 t_p.
    pub fn t_a(&self) -> f64 {
        self.rtd_s + 3.0 * self.t_p()
    }
    /// Bandwidth-delay product in segments, w_a = t_a / t_s.
    pub fn w_a(&self) -> f64 {
        self.t_a() / self.t_s()
    }

    /// Average segment delay from the sender's view,
    /// `D_s = t_s / (1 - p) + t_a Σ_{i≥0} [1 - (1 - p^i)^s]` (the sum is cut where its
    /// terms fall below 1e-15).
    pub fn delay_sender(&self, p: f64) -> f64 {
        let s = self.segment_packets;
        let mut sum = 0.0;
        let mut pi: f64 = 1.0; // p^i
        for _ in 0..10_000 {
            let term = 1.0 - (1.0 - pi).powf(s);
            sum += term;
            if term < 1e-15 {
                break;
            }
            pi *= p;
        }
        self.t_s() / (1.0 - p) + self.t_a() * sum
    }

    /// Average end-to-end delay from the receiver's view, `D_r = D_s - RTD/2 - 3 t_p`.
    pub fn delay_receiver(&self, p: f64) -> f64 {
        self.delay_sender(p) - self.rtd_s / 2.0 - 3.0 * self.t_p()
    }

    /// Throughput efficiency for a window of `w` segments and loss probability `p`, the
    /// paper's four cases: `t_s / D_s` for W = 1; the window-limited and overlap
    /// expressions for 1 < W < 2 w_a + 1; `1 - p` beyond.
    pub fn efficiency(&self, w: f64, p: f64) -> f64 {
        let wa = self.w_a();
        if w <= 1.0 {
            return self.t_s() / self.delay_sender(p);
        }
        if w >= 2.0 * wa + 1.0 {
            return 1.0 - p;
        }
        let g = 1.0 - (1.0 - p).powf(self.segment_packets);
        let inv_g = if g > 0.0 { 1.0 / g } else { f64::INFINITY };
        if w <= wa + 1.0 {
            if inv_g.is_infinite() {
                return w / (wa + 1.0);
            }
            (inv_g + w) / (2.0 * wa + 1.0 + p + (wa + 1.0) / w * inv_g)
        } else {
            if inv_g.is_infinite() {
                return 1.0;
            }
            let m = (w - wa).min(wa * (1.0 - p));
            (wa + m + inv_g) / (2.0 * wa + 1.0 + p + m + inv_g)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's example: 100 Mbit/s, 60 ms, 1024-byte packets, 256-packet segments.
    fn paper() -> Link {
        Link {
            packet_bytes: 1024.0,
            segment_packets: 256.0,
            rate_bps: 100e6,
            rtd_s: 0.060,
        }
    }

    #[test]
    fn basic_quantities() {
        let l = paper();
        assert!((l.t_p() - 81.92e-6).abs() < 1e-12);
        assert!((l.t_s() - 0.02097152).abs() < 1e-9);
        // "one round trip delay is equivalent to the transmission time of about 732
        // packets" (§3.3).
        assert!((l.rtd_s / l.t_p() - 732.4).abs() < 0.1);
        assert!((l.w_a() - 2.8727).abs() < 1e-3);
    }

    #[test]
    fn delay_without_loss_is_one_round() {
        let l = paper();
        assert!((l.delay_sender(0.0) - (l.t_s() + l.t_a())).abs() < 1e-12);
        assert!((l.delay_receiver(0.0) - (l.t_s() + l.rtd_s / 2.0)).abs() < 1e-12);
        assert!(l.delay_sender(1e-2) > l.delay_sender(1e-3));
    }

    #[test]
    fn efficiency_shapes() {
        let l = paper();
        let wa = l.w_a();
        // No loss: window-limited below 1 + w_a.
        assert!((l.efficiency(2.0, 0.0) - 2.0 / (wa + 1.0)).abs() < 1e-12);
        assert!((l.efficiency(10.0, 1e-3) - (1.0 - 1e-3)).abs() < 1e-12);
        // More loss, less efficiency; larger window, more efficiency.
        for w in [2.0, 3.0, 4.0, 5.0, 6.0] {
            assert!(l.efficiency(w, 1e-2) < l.efficiency(w, 1e-4), "w {w}");
            assert!(l.efficiency(w + 1.0, 1e-2) >= l.efficiency(w, 1e-2) - 0.02);
        }
    }
}
