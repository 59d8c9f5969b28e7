//! moshid: the daemon's library (runtime, engine, transports, control API).
pub mod codec;
