//! SIP without I/O (RFC 3261): messages ([`message`]) and URIs ([`uri`]),
//! messages cut out of a TCP stream ([`framing`]), a message's source
//! ([`peer`]), responses and in-dialog requests built ([`build`]), server
//! transactions and their timers ([`transaction`]), SDP offer/answer over
//! the `sdp-types` parser ([`sdp`]), and digest authentication's pieces:
//! the `Authorization` header ([`auth_header`]), MD5 and SHA-256 responses
//! ([`digest`]), signed nonces and the replay table ([`nonce`]), and the one quoted-string
//! grammar both sides read and write ([`quoted_string`]). The
//! endpoint that runs them is the daemon's (`moshid::transport::sip`).
//!
//! SIP itself is parsed here: the crates looked at were either unmaintained
//! (`rsip` 0.4, last released 2022, no licence in its metadata) or a whole
//! stack with its own string types and transaction layer (`ezk-sip-types`),
//! while the endpoint needs the message grammar only, bounded by its own
//! limits. The parsers are fuzzed (`fuzz/fuzz_targets/sip_message.rs`,
//! `sdp_offer.rs`, `sip_auth_header.rs`, `sip_tcp_framing.rs`) and have
//! tables of malformed cases in their tests.

pub mod auth_header;
pub mod build;
pub mod digest;
pub mod framing;
pub mod message;
pub mod nonce;
pub mod peer;
pub mod quoted_string;
pub mod sdp;
pub mod transaction;
pub mod uri;
