//! `braid lab`: the namespace testbed with braid's own link emulator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_lab::emu::{Emulator, LossFilter};
use braid_lab::spec::LinkSpec;
use braid_lab::topo;
use braid_lab::tun::Tun;
use clap::Subcommand;

/// Arguments of `braid lab`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand, Debug)]
enum LabCommand {
    /// Build the testbed: namespaces brl-a (client), brl-r (router), brl-b (server), one
    /// path per link, rate from tbf, delay/jitter/loss from braid's link emulator.
    Up {
        /// Links, comma-separated, each RATE/DELAY[/LOSS][/jJITTER], e.g.
        /// `100mbit/5ms,50mbit/20ms,20mbit/60ms/1%`. LOSS is `1%` (random) or
        /// `ge:2%:5` (bursty: 2 % average, bursts of 5 packets on average). DELAY is
        /// one-way and applies in both directions; loss applies client to server.
        #[arg(long)]
        links: String,
        /// Seed of the emulator's loss process.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Remove everything the lab created (also after a crash).
    Down,
    /// Show the links, addresses and emulator counters of the running lab.
    Status,
    /// Run the link emulator (started by `lab up` inside the router namespace).
    #[command(hide = true)]
    Emulate {
        /// The links, as given to `lab up`.
        #[arg(long)]
        links: String,
        /// Loss seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write counters.
        #[arg(long)]
        state_dir: std::path::PathBuf,
    },
}

/// Run `braid lab`.
pub fn run(a: Args) -> Result<()> {
    match a.command {
        LabCommand::Up { links, seed } => {
            let links = LinkSpec::parse_list(&links).context("--links")?;
            let exe = std::env::current_exe().context("locating the braid binary")?;
            topo::up(&links, &exe, seed)?;
            print!("{}", topo::status().unwrap_or_default());
            println!("lab is up; `braid lab down` removes it");
            Ok(())
        }
        LabCommand::Down => {
            let removed = topo::down()?;
            if removed.is_empty() {
                println!("no lab was up");
            } else {
                println!("removed {}", removed.join(" "));
            }
            Ok(())
        }
        LabCommand::Status => {
            match topo::status() {
                Some(s) => print!("{s}"),
                None => println!("no lab is up"),
            }
            Ok(())
        }
        LabCommand::Emulate {
            links,
            seed,
            state_dir,
        } => emulate(&links, seed, &state_dir),
    }
}

fn emulate(links: &str, seed: u64, dir: &std::path::Path) -> Result<()> {
    let links = LinkSpec::parse_list(links).context("--links")?;
    let stop = Arc::new(AtomicBool::new(false));
    install_stop_handler(stop.clone());
    let mut threads = Vec::new();
    for (i, l) in links.into_iter().enumerate() {
        let tun = Tun::open(&format!("t{i}"))?;
        let filter = LossFilter {
            forward_src: ([10, 201, 0, 0], 16),
        };
        let mut emu = Emulator::new(tun, &l, Some(filter), seed.wrapping_add(i as u64));
        let stop = stop.clone();
        let path = dir.join(format!("emu-{i}.json"));
        threads.push(std::thread::spawn(move || {
            emu.run(&stop, |s| {
                let _ = std::fs::write(&path, s.to_json());
            })
        }));
    }
    let mut failed = None;
    for (i, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(format!("link {i}: {e}")),
            Err(_) => failed = Some(format!("link {i}: emulator thread panicked")),
        }
    }
    if let Some(f) = failed {
        bail!(f);
    }
    Ok(())
}

static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    if let Some(s) = STOP.get() {
        s.store(true, Ordering::Relaxed);
    }
}

fn install_stop_handler(stop: Arc<AtomicBool>) {
    let _ = STOP.set(stop);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}
