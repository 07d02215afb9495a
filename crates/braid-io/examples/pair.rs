//! Two braid sessions in one process, striping messages over three loopback channels.
//!
//! ```text
//! cargo run --release -p braid-io --example pair
//! ```
//!
//! End A binds 127.0.0.1:17001..17003 and aims at B's 127.0.0.1:17101..17103, and the
//! other way round. A sends 100 000 numbered messages; B checks they arrive in order and
//! prints both ends' channel tables.

use std::time::Duration;

use braid_io::{ChannelConfig, Session, SessionConfig};
use bytes::Bytes;

fn channels(local_base: u16, remote_base: u16) -> Vec<ChannelConfig> {
    (1..=3)
        .map(|i| {
            let mut c = ChannelConfig::new(
                format!("lo{i}"),
                format!("127.0.0.1:{}", local_base + i).parse().unwrap(),
                format!("127.0.0.1:{}", remote_base + i).parse().unwrap(),
            );
            c.weight = i as u32; // capacities 1:2:3 -> SRR quanta 1:2:3
            c
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let key = "example pre-shared key: use braid genkey for real ones";
    let mut a = Session::start(SessionConfig::new(channels(17000, 17100), key)).await?;
    let mut b = Session::start(SessionConfig::new(channels(17100, 17000), key)).await?;
    a.wait_for_peer(Duration::from_secs(5)).await?;
    b.wait_for_peer(Duration::from_secs(5)).await?;

    const N: u64 = 100_000;
    let tx = a.sender();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            let mut m = vec![0x42u8; 200 + (i % 7) as usize * 150];
            m[1..9].copy_from_slice(&i.to_be_bytes());
            tx.send(Bytes::from(m)).await?;
            if i % 256 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok::<(), braid_io::SessionError>(())
    });

    let (mut next, mut in_order) = (0u64, 0u64);
    while next < N {
        match tokio::time::timeout(Duration::from_secs(2), b.recv()).await {
            Ok(Some(m)) => {
                let i = u64::from_be_bytes(m[1..9].try_into()?);
                if i == next {
                    in_order += 1;
                }
                next = i + 1;
            }
            _ => break,
        }
    }
    sender.await??;
    println!("B received up to #{next} of {N}; {in_order} arrived exactly in sequence\n");
    println!("A (sender):\n{}", a.stats().await?.table());
    println!("B (receiver):\n{}", b.stats().await?.table());
    a.close().await;
    b.close().await;
    Ok(())
}
