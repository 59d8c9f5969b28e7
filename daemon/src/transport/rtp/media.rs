//! An RTP session's audio path, made before its slot is taken: the jitter
//! buffer of the incoming audio, the resamplers between the codec's rate
//! and the model's 24 kHz, and the outgoing packets. Made again, whole,
//! when a SIP re-INVITE changes the codec or the far end's address.
//!
//! Invariant: every buffer of the path is made here, once; nothing in it
//! allocates per packet or per frame.

use crate::{FRAME_MS, SAMPLE_RATE_HZ};
use moshid_telephony::rtp::jitter::{JitterBuffer, JitterConfig};
use moshid_telephony::rtp::sender::{Outbound, StreamStart};
use moshid_telephony::rtp::SessionSpec;
use moshid_telephony::FrameResampler;

/// The session's audio path, made before admission.
pub struct MediaPath {
    /// Incoming audio.
    pub jitter: JitterBuffer,
    /// Codec rate → 24 kHz.
    pub res_in: FrameResampler,
    /// 24 kHz → codec rate.
    pub res_out: FrameResampler,
    /// Outgoing packets.
    pub outbound: Outbound,
}

impl MediaPath {
    /// [`MediaPath::new`] with the jitter buffer's bounds from `rtp.*`.
    pub fn configured(spec: &SessionSpec, rtp: &crate::config::RtpConfig) -> Result<Self, String> {
        Self::new(spec, rtp.jitter_min_ms, rtp.jitter_max_ms)
    }

    /// Codecs, resamplers and buffers for `spec`.
    pub fn new(spec: &SessionSpec, jitter_min_ms: u32, jitter_max_ms: u32) -> Result<Self, String> {
        let frame_ms = FRAME_MS as u32;
        let media_hz = spec.codec.media_rate_hz();
        let jitter = JitterBuffer::new(JitterConfig {
            spec: spec.codec,
            min_ms: jitter_min_ms,
            max_ms: jitter_max_ms,
            frame_ms,
        })
        .map_err(|e| e.to_string())?;
        let res_in =
            FrameResampler::new(media_hz, SAMPLE_RATE_HZ, frame_ms).map_err(|e| e.to_string())?;
        let res_out =
            FrameResampler::new(SAMPLE_RATE_HZ, media_hz, frame_ms).map_err(|e| e.to_string())?;
        let outbound = Outbound::new(
            spec.codec,
            spec.payload_type,
            spec.ptime_ms,
            res_out.out_frame(),
            StreamStart::random(),
        )
        .map_err(|e| e.to_string())?;
        Ok(MediaPath {
            jitter,
            res_in,
            res_out,
            outbound,
        })
    }
}
