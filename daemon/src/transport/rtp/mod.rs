//! The RTP telephony transport: Asterisk ARI externalMedia, FreeSWITCH,
//! CPaaS media bridges — anything that sends and receives plain RTP.
//!
//! A control call (`POST /v1/rtp/sessions`, [`crate::api::rtp`]) allocates a
//! session: a model slot, a UDP port on the I/O core that took the call,
//! and the session's task there ([`session`]). The session latches onto
//! the first source of valid RTP (symmetric RTP; a third party cannot take
//! over), buffers and orders what arrives ([`jitter`]), conceals loss,
//! resamples to 24 kHz and releases exactly one 80 ms frame per engine tick
//! of its phase group ([`clock`]); the model's audio goes back resampled,
//! encoded and paced at `ptime` ([`sender`]), with comfort silence until
//! the model speaks. RFC 4733 digits are reported on the session's event
//! stream ([`dtmf`], [`state`]).
//!
//! RTCP: recognised (RFC 5761 demultiplexing, [`packet::is_rtcp`]) and
//! ignored — the daemon sends none. Loss and jitter are visible on the
//! session's counters instead.
//!
//! The protocol without I/O is `moshid_telephony::rtp`: packets (RFC 3550
//! parse/write), extended sequence numbers and timestamps, the jitter
//! buffer and concealment (playout), DTMF, the sender's packets and the
//! release clock. Files here: [`state`] (what the control API sees, the
//! registry), [`media`] (a session's audio path), [`session`] (the tasks), [`start`] (making a session: shared
//! by the control API and the SIP endpoint).

pub mod media;
pub mod session;
pub mod start;
pub mod state;

pub use state::Registry;
