//! One module per subcommand.

pub mod schedule;
pub mod sim;
