//! The softnic command.
fn main() {}
