//! Bytes of the inner TCP's payload one datagram carries, for braid and for MPTCP,
//! computed from what the bench's configuration does (not measured): for braid, the
//! tunnel configuration the bench writes, read by braid-io's own parser, gives the TUN
//! device's MTU exactly as `braid tunnel` sets it (the channel's MTU less IP and UDP,
//! the security envelope of its `security` mode and the mode's header); less the inner
//! IPv4 and TCP headers with the options Linux puts on every data segment, or, where
//! the tunnel carries TCP as streams (its default with paced channels), less the
//! stream's short DATA frame header instead.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{tunnel_config, BenchOptions};
use crate::topo::LabError;

/// The MTU of every link in the lab (veth pairs and the emulator's TUN devices keep
/// Linux's default), and of every channel of the bench's tunnel.
pub const LINK_MTU: u32 = 1500;

/// The inner TCP's headers on a data segment: IPv4 (20), TCP (20) and the timestamps
/// option (10, padded to 12), which Linux sends on every segment
/// (`net.ipv4.tcp_timestamps = 1`, the default the lab keeps). SACK blocks ride on
/// acknowledgements only.
pub const INNER_TCP_HEADERS: u32 = 52;

/// The MPTCP option on each data segment of Linux's MPTCP, one flow one way: DSS with
/// its 4-byte head, a 32-bit data ACK (the sender receives no data, so no 64-bit data
/// sequence number that would make Linux send 64-bit ACKs), a mapping with a 64-bit
/// data sequence number, the subflow sequence number and the length (14), no checksum
/// (`net.mptcp.checksum_enabled = 0`, the default): 22 bytes, padded to 24.
pub const MPTCP_DSS: u32 = 24;

/// Inner TCP payload bytes per full datagram.
#[derive(Clone, Debug, PartialEq)]
pub struct Payload {
    /// Plain TCP over one link (the single links and the ceiling).
    pub tcp: u32,
    /// MPTCP: plain TCP less the DSS option.
    pub mptcp: u32,
    /// braid, per mode: the tunnel's MTU less the inner headers.
    pub braid: BTreeMap<String, u32>,
}

impl Payload {
    /// Computed from the bench's options: the tunnel configuration of each mode, as
    /// written for the run.
    pub fn of(opt: &BenchOptions) -> Result<Payload, LabError> {
        let braid = opt
            .modes
            .iter()
            .map(|m| Ok((m.clone(), braid_payload(&tunnel_config(opt, m, true))?)))
            .collect::<Result<_, LabError>>()?;
        let tcp = LINK_MTU - INNER_TCP_HEADERS;
        Ok(Payload {
            tcp,
            mptcp: tcp - MPTCP_DSS,
            braid,
        })
    }

    /// The JSON object `tcp_payload_per_datagram`.
    pub fn to_json(&self) -> Value {
        json!({
            "how": "computed from the configuration",
            "tcp": self.tcp,
            "mptcp": self.mptcp,
            "braid": self.braid,
        })
    }

    /// Read back what [`Payload::to_json`] wrote.
    pub fn from_json(v: &Value) -> Option<Payload> {
        let n = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        Some(Payload {
            tcp: n(&v["tcp"])?,
            mptcp: n(&v["mptcp"])?,
            braid: v["braid"]
                .as_object()?
                .iter()
                .map(|(m, b)| Some((m.clone(), n(b)?)))
                .collect::<Option<_>>()?,
        })
    }
}

/// Inner TCP payload per datagram of the tunnel that `config` (a `braid tunnel`
/// configuration) sets up: its TUN device's MTU (the bond's largest packet) less the
/// inner headers, or, with TCP carried as streams, less a short DATA frame's header (a
/// stream numbered below 2^24, as the bench's are, sends short DATA).
pub fn braid_payload(config: &str) -> Result<u32, LabError> {
    let bad = |reason: String| LabError::Command {
        cmd: "the bench's tunnel configuration".into(),
        reason,
    };
    let fc = braid_io::FileConfig::parse("bench tunnel", config, None)
        .map_err(|e| bad(e.to_string()))?;
    let t = fc.tunnel.ok_or_else(|| bad("no [tunnel] section".into()))?;
    let mtu = braid_io::tunnel::tun_mtu(&t, &fc.session);
    let streams = fc.session.core.streams.is_some() || fc.session.tcp_streams_auto.is_some();
    Ok(match streams {
        true => mtu.saturating_sub(braid_proto::wire::stream::SHORT_DATA_HEADER_LEN as u32),
        false => mtu.saturating_sub(INNER_TCP_HEADERS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Pace;
    use crate::spec::LinkSpec;

    fn options(modes: &[&str], security: Option<&str>) -> BenchOptions {
        BenchOptions {
            links: LinkSpec::parse_list("100mbit/0ms,50mbit/0ms").unwrap(),
            duration: std::time::Duration::from_secs(1),
            modes: modes.iter().map(|m| m.to_string()).collect(),
            mptcp: true,
            weights: None,
            adaptive: None,
            aqm: None,
            aqm_loss_signal: None,
            pace: Pace::Default,
            security: security.map(String::from),
            arq: None,
            credits: false,
            tcp_streams: None,
            tcp_streams_fast: None,
            flow_order: None,
            flows: 1,
            download: None,
            idle: 0,
            call: false,
            call_transport: Default::default(),
            return_path: true,
            buffer_packets: None,
            set: Vec::new(),
            changes: Vec::new(),
            runs: 1,
            exe: "braid".into(),
            seed: 1,
        }
    }

    /// A 1500-byte datagram: 28 bytes of outer IPv4 and UDP, the sealed envelope (26
    /// with encrypt or auth since envelope version 2, 32 before; encrypt is the
    /// default), seq mode's 5-byte header, and 52 bytes of inner IPv4, TCP and
    /// timestamps: 1394 for braid (1388 with version 1's envelope) against 1448 for
    /// plain TCP.
    #[test]
    fn payload_follows_the_mode_and_the_security_envelope() {
        let mut packets = options(&["logical", "seq", "trr"], None);
        packets.tcp_streams = Some(false);
        let p = Payload::of(&packets).unwrap();
        assert_eq!(p.tcp, 1448);
        assert_eq!(p.mptcp, 1424);
        assert_eq!(p.braid["logical"], 1500 - 28 - 26 - 52);
        assert_eq!(p.braid["logical"], 1394);
        assert_eq!(p.braid["seq"], 1394 - 5);
        assert_eq!(p.braid["trr"], 1394);
        let mut auth = options(&["logical"], Some("auth"));
        auth.tcp_streams = Some(false);
        assert_eq!(Payload::of(&auth).unwrap().braid["logical"], 1394);
        assert_eq!(Payload::from_json(&p.to_json()), Some(p));
    }

    /// With the defaults (channels paced) TCP crosses as streams: a short DATA frame's
    /// 8 bytes of header in place of the inner 52, so 1438 bytes of the connection's
    /// payload per datagram, against 1424 for MPTCP and 1448 for plain TCP.
    #[test]
    fn payload_with_tcp_as_streams_is_the_bond_packet_less_the_data_header() {
        let p = Payload::of(&options(&["logical", "seq"], None)).unwrap();
        assert_eq!(p.braid["logical"], 1500 - 28 - 26 - 8);
        assert_eq!(p.braid["logical"], 1438);
        assert_eq!(p.braid["seq"], 1438 - 5);
        let mut off = options(&["logical"], None);
        off.pace = Pace::Off;
        assert_eq!(Payload::of(&off).unwrap().braid["logical"], 1394);
    }
}
