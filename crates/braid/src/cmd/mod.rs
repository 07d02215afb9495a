//! One module per subcommand.

pub mod bench;
pub mod docs;
pub mod keys;
pub mod lab;
pub mod node;
pub mod peer;
pub mod schedule;
pub mod sim;
pub mod status;
pub mod transfer;
pub mod tunnel;
