//! One module per subcommand.

pub mod schedule;
pub mod sim;
pub mod bench;
pub mod lab;
pub mod status;
pub mod tunnel;
