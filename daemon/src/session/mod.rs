//! What a session is, whatever its transport: its parameters and its own
//! accounting.

pub mod params;
pub mod prompt;
pub mod record;
