//! Transports: how clients reach a session.

pub mod audiosocket;
pub mod line;
pub mod link;
pub mod media_streams;
pub mod realtime;
pub mod rtp;
pub mod session;
pub mod sip;
pub mod ws_chat;
pub mod ws_out;
