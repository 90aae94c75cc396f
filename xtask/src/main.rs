//! cargo xtask: STUB.
fn main() {}
