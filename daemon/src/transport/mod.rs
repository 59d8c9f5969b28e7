//! Transports: how clients reach a session.

pub mod ws_chat;
