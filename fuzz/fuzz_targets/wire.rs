//! Every wire parser (including error control, credits, the overlay's ALCP and its HELLO and trailer checks) on arbitrary bytes: no panic, and where a format has a `Repr`,
//! parse → emit → parse gives the same value.
#![no_main]

use braid_proto::wire::{self, credit, errctl, marker, nak, overlay, secure, seq, session, trigger};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = wire::classify(data);
    if let Ok(p) = marker::Packet::new_checked(data) {
        if let Ok(r) = marker::Repr::parse(&p) {
            let v = r.to_vec();
            let again = marker::Repr::parse(&marker::Packet::new_checked(&v[..]).unwrap());
            assert_eq!(again, Ok(r));
        }
    }
    if let Ok(p) = trigger::Packet::new_checked(data) {
        if let Ok(r) = trigger::Repr::parse(&p) {
            let v = r.to_vec();
            let again = trigger::Repr::parse(&trigger::Packet::new_checked(&v[..]).unwrap());
            assert_eq!(again, Ok(r));
        }
    }
    if let Ok(p) = seq::Packet::new_checked(data) {
        if let Ok(r) = seq::Repr::parse(&p) {
            let mut h = [0u8; seq::HEADER_LEN];
            r.emit(&mut h);
            assert_eq!(seq::Repr::parse(&seq::Packet::new_checked(&h[..]).unwrap()), Ok(r));
        }
    }
    if let Ok(r) = nak::Repr::parse(data) {
        assert_eq!(nak::Repr::parse(&r.to_vec()), Ok(r));
    }
    if let Ok(m) = session::Msg::parse(data) {
        assert_eq!(session::Msg::parse(&m.to_vec()), Ok(m));
    }
    if let Ok(h) = secure::Header::parse(data) {
        let mut v = h.to_bytes().to_vec();
        v.extend_from_slice(&[0; secure::TAG_LEN]);
        assert_eq!(secure::Header::parse(&v), Ok(h));
    }
    if let Ok(p) = errctl::DataPacket::new_checked(data) {
        if let Ok(r) = errctl::DataRepr::parse(&p) {
            let v = r.to_vec(&[]);
            let again = errctl::DataRepr::parse(&errctl::DataPacket::new_checked(&v[..]).unwrap());
            assert_eq!(again, Ok(r));
        }
    }
    if let Ok(r) = errctl::SnakRepr::parse(data) {
        assert_eq!(errctl::SnakRepr::parse(&r.to_vec()), Ok(r));
    }
    if let Ok(r) = errctl::PackRepr::parse(data) {
        assert_eq!(errctl::PackRepr::parse(&r.to_vec()), Ok(r));
    }
    if let Ok(r) = overlay::Repr::parse(data) {
        if let Ok(v) = r.to_vec() {
            assert_eq!(overlay::Repr::parse(&v), Ok(r));
        }
    }
    if let Ok((h, payload)) = overlay::DataHeader::parse(data) {
        let mut v = h.bytes().to_vec();
        v.extend_from_slice(payload);
        assert_eq!(v, data);
    }
    if let Ok(r) = credit::Repr::parse_bytes(data) {
        assert_eq!(credit::Repr::parse_bytes(&r.to_vec()), Ok(r));
    }
    if let Ok(h) = secure::Handshake::parse(data) {
        // Initiations, responses, rejections and cookie replies: the same bytes back.
        let v = h.to_vec();
        assert_eq!(v, data);
        assert_eq!(secure::Handshake::parse(&v), Ok(h));
        if let secure::Handshake::Cookie { .. } = h {
            assert_eq!(v.len(), secure::COOKIE_REPLY_LEN);
        }
        let (mac1, mac2) = secure::mac_offsets(data[0], data.len()).expect("parsed");
        assert!(mac1 <= data.len() && mac2.is_none_or(|m| m <= data.len()));
    }
    // The initiation's timestamp (TAI64N): parse, emit, parse.
    if let Ok(t) = secure::Timestamp::parse(data) {
        assert_eq!(t.to_bytes()[..], data[..secure::TIMESTAMP_LEN]);
        assert_eq!(secure::Timestamp::parse(&t.to_bytes()), Ok(t));
        assert!(t.nanos < 1_000_000_000);
    }
    // The overlay's HELLO and trailer checks: node 1 with members 0 and 2, no keys yet,
    // so nothing may pass (and nothing may panic).
    {
        use braid_proto::overlay::auth::NodeAuth;
        use std::sync::{Mutex, OnceLock};
        static NODE: OnceLock<Mutex<NodeAuth>> = OnceLock::new();
        let node = NODE.get_or_init(|| {
            let key = |s: u8| -> [u8; 32] {
                core::array::from_fn(|i| s.wrapping_mul(37) ^ (i as u8).wrapping_mul(11).wrapping_add(1))
            };
            let pk = |s: u8| NodeAuth::new(9, &key(s), &[], [7; 32]).unwrap().public_key();
            Mutex::new(NodeAuth::new(1, &key(1), &[(0, pk(0)), (2, pk(2))], [5; 32]).unwrap())
        });
        let mut n = node.lock().unwrap();
        if NodeAuth::is_hello(data) {
            assert!(n.on_hello(braid_proto::Instant::ZERO, data).is_err());
        }
        assert!(n.open(data).is_err());
    }
});
