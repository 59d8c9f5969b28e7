//! The telephony codecs behind one interface: what a payload type carries,
//! its RTP clock, the rate audio is decoded and encoded at, and stateful
//! decoders/encoders made once per session.
//!
//! Rates: G.711 is 8 kHz; L16 runs at its negotiated rate; Opus always has
//! a 48 kHz RTP clock (RFC 7587) but libopus decodes and encodes at 24 kHz
//! directly, the model's own rate, so an Opus session needs no resampler
//! (the "media rate" below is the rate PCM is exchanged at).
//!
//! Invariants: `decode`/`encode`/`conceal` never allocate; every buffer a
//! caller passes is sized from [`CodecSpec::max_packet_media_samples`].

use super::g711::Law;
use super::l16;

/// A codec this daemon speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecKind {
    /// G.711 μ-law.
    Pcmu,
    /// G.711 A-law.
    Pcma,
    /// 16-bit linear, big-endian.
    L16,
    /// Opus (RFC 7587).
    Opus,
}

/// A codec and its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecSpec {
    /// Which codec.
    pub kind: CodecKind,
    /// The audio sample rate (L16: as negotiated; G.711: 8000; Opus: 48000).
    pub sample_rate_hz: u32,
}

/// L16 rates accepted (each resamples to 24 kHz in whole 20 ms chunks).
pub const L16_RATES_HZ: [u32; 6] = [8_000, 16_000, 24_000, 32_000, 44_100, 48_000];

/// Longest packet accepted, in milliseconds of audio (Opus' maximum).
pub const MAX_PACKET_MS: u32 = 120;

/// A codec failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// libopus refused something.
    #[error("opus: {0}")]
    Opus(String),
    /// A payload that cannot be this codec's.
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
    /// A setting the codec does not support.
    #[error("{0}")]
    Unsupported(String),
}

fn opus_err(e: opus::Error) -> CodecError {
    CodecError::Opus(e.to_string())
}

impl CodecSpec {
    /// G.711 μ-law at 8 kHz.
    pub const PCMU: CodecSpec = CodecSpec {
        kind: CodecKind::Pcmu,
        sample_rate_hz: 8_000,
    };
    /// G.711 A-law at 8 kHz.
    pub const PCMA: CodecSpec = CodecSpec {
        kind: CodecKind::Pcma,
        sample_rate_hz: 8_000,
    };
    /// Opus (48 kHz RTP clock).
    pub const OPUS: CodecSpec = CodecSpec {
        kind: CodecKind::Opus,
        sample_rate_hz: 48_000,
    };

    /// Parses an RTP encoding name (`PCMU`, `PCMA`, `L16`, `opus`; case
    /// insensitive) with an optional rate (required to be 8000 for G.711 and
    /// 48000 for Opus when given; L16 defaults to 8000).
    pub fn parse(name: &str, sample_rate_hz: Option<u32>) -> Result<CodecSpec, CodecError> {
        let spec = match name.to_ascii_uppercase().as_str() {
            "PCMU" | "ULAW" => CodecSpec::PCMU,
            "PCMA" | "ALAW" => CodecSpec::PCMA,
            "OPUS" => CodecSpec::OPUS,
            "L16" | "SLIN" => {
                let rate = sample_rate_hz.unwrap_or(8_000);
                if !L16_RATES_HZ.contains(&rate) {
                    return Err(CodecError::Unsupported(format!(
                        "L16 at {rate} Hz is not supported (one of {L16_RATES_HZ:?})"
                    )));
                }
                return Ok(CodecSpec {
                    kind: CodecKind::L16,
                    sample_rate_hz: rate,
                });
            }
            _ => {
                return Err(CodecError::Unsupported(format!(
                    "unknown codec `{name}` (PCMU, PCMA, L16, opus)"
                )))
            }
        };
        if let Some(r) = sample_rate_hz {
            if r != spec.sample_rate_hz {
                return Err(CodecError::Unsupported(format!(
                    "{} runs at {} Hz, not {r}",
                    spec.name(),
                    spec.sample_rate_hz
                )));
            }
        }
        Ok(spec)
    }

    /// The RTP encoding name.
    pub fn name(&self) -> &'static str {
        match self.kind {
            CodecKind::Pcmu => "PCMU",
            CodecKind::Pcma => "PCMA",
            CodecKind::L16 => "L16",
            CodecKind::Opus => "opus",
        }
    }

    /// The RTP timestamp clock.
    pub fn rtp_clock_hz(&self) -> u32 {
        self.sample_rate_hz
    }

    /// The rate PCM is decoded to and encoded from.
    pub fn media_rate_hz(&self) -> u32 {
        match self.kind {
            CodecKind::Opus => crate::MODEL_RATE_HZ,
            _ => self.sample_rate_hz,
        }
    }

    /// RTP clock ticks per media sample (2 for Opus, else 1).
    pub fn rtp_per_media(&self) -> u32 {
        self.rtp_clock_hz() / self.media_rate_hz()
    }

    /// Media samples in `ms` milliseconds.
    pub fn media_samples(&self, ms: u32) -> usize {
        (self.media_rate_hz() as u64 * ms as u64 / 1000) as usize
    }

    /// The most media samples one packet may decode to.
    pub fn max_packet_media_samples(&self) -> usize {
        self.media_samples(MAX_PACKET_MS)
    }

    /// Whether `ptime_ms` is a packet duration this codec can send.
    pub fn check_ptime(&self, ptime_ms: u32) -> Result<(), CodecError> {
        let ok = match self.kind {
            CodecKind::Opus => matches!(ptime_ms, 10 | 20 | 40 | 60),
            _ => (10..=60).contains(&ptime_ms) && ptime_ms.is_multiple_of(10),
        };
        if ok {
            Ok(())
        } else {
            Err(CodecError::Unsupported(format!(
                "ptime {ptime_ms} ms is not supported for {} (Opus: 10, 20, 40 or 60; others: 10 to 60 in steps of 10)",
                self.name()
            )))
        }
    }

    /// The largest payload this daemon sends for `ptime_ms`, in bytes.
    pub fn max_payload_bytes(&self, ptime_ms: u32) -> usize {
        let samples = self.media_samples(ptime_ms);
        match self.kind {
            CodecKind::Pcmu | CodecKind::Pcma => samples,
            CodecKind::L16 => 2 * samples,
            // RFC 6716: at most 1275 bytes per frame; the encoder is asked for
            // one frame of `ptime`.
            CodecKind::Opus => 1275,
        }
    }

    /// Duration of a payload in RTP clock ticks; `None` when it cannot be
    /// one of this codec's.
    pub fn payload_duration_rtp(&self, payload: &[u8]) -> Option<u32> {
        match self.kind {
            CodecKind::Pcmu | CodecKind::Pcma => Some(payload.len() as u32),
            CodecKind::L16 => payload
                .len()
                .is_multiple_of(2)
                .then_some(payload.len() as u32 / 2),
            CodecKind::Opus => {
                if payload.is_empty() {
                    return None;
                }
                opus::packet::get_nb_samples(payload, 48_000)
                    .ok()
                    .map(|n| n as u32)
            }
        }
    }
}

/// A session's decoder.
pub struct MediaDecoder {
    spec: CodecSpec,
    opus: Option<opus::Decoder>,
}

impl MediaDecoder {
    /// A decoder for `spec`.
    pub fn new(spec: CodecSpec) -> Result<Self, CodecError> {
        let opus = match spec.kind {
            CodecKind::Opus => Some(
                opus::Decoder::new(spec.media_rate_hz(), opus::Channels::Mono).map_err(opus_err)?,
            ),
            _ => None,
        };
        Ok(MediaDecoder { spec, opus })
    }

    /// The codec.
    pub fn spec(&self) -> CodecSpec {
        self.spec
    }

    /// Whether the codec conceals loss itself ([`MediaDecoder::conceal`]).
    pub fn has_native_plc(&self) -> bool {
        self.opus.is_some()
    }

    /// Decodes one payload into `out` (sized for the longest packet);
    /// returns the media samples written.
    pub fn decode(&mut self, payload: &[u8], out: &mut [f32]) -> Result<usize, CodecError> {
        match self.spec.kind {
            CodecKind::Pcmu | CodecKind::Pcma => {
                let n = payload.len().min(out.len());
                let law = if self.spec.kind == CodecKind::Pcmu {
                    Law::Mu
                } else {
                    Law::A
                };
                law.decode(&payload[..n], &mut out[..n]);
                Ok(n)
            }
            CodecKind::L16 => {
                if !payload.len().is_multiple_of(2) {
                    return Err(CodecError::Malformed("L16 payload of an odd length"));
                }
                Ok(l16::decode(payload, out))
            }
            CodecKind::Opus => {
                let dec = self.opus.as_mut().expect("made for Opus");
                if payload.is_empty() {
                    return Err(CodecError::Malformed("empty Opus payload"));
                }
                dec.decode_float(payload, out, false).map_err(opus_err)
            }
        }
    }

    /// Opus only: synthesises `out.len()` samples (a multiple of 2.5 ms) for
    /// a lost packet, from the forward error correction data of the packet
    /// that followed it when `next` is given, else by packet loss
    /// concealment. Returns the samples written.
    pub fn conceal(&mut self, out: &mut [f32], next: Option<&[u8]>) -> Result<usize, CodecError> {
        let dec = self.opus.as_mut().ok_or_else(|| {
            CodecError::Unsupported("no native concealment for this codec".into())
        })?;
        match next {
            Some(p) if !p.is_empty() => dec.decode_float(p, out, true).map_err(opus_err),
            _ => dec.decode_float(&[], out, false).map_err(opus_err),
        }
    }

    /// Forgets the stream (a new SSRC).
    pub fn reset(&mut self) {
        if let Some(d) = self.opus.as_mut() {
            let _ = d.reset_state();
        }
    }
}

/// A session's encoder.
pub struct MediaEncoder {
    spec: CodecSpec,
    opus: Option<opus::Encoder>,
}

impl MediaEncoder {
    /// An encoder for `spec` (Opus: VoIP mode, in-band FEC on).
    pub fn new(spec: CodecSpec) -> Result<Self, CodecError> {
        let opus = match spec.kind {
            CodecKind::Opus => {
                let mut e = opus::Encoder::new(
                    spec.media_rate_hz(),
                    opus::Channels::Mono,
                    opus::Application::Voip,
                )
                .map_err(opus_err)?;
                e.set_inband_fec(true).map_err(opus_err)?;
                e.set_packet_loss_perc(5).map_err(opus_err)?;
                Some(e)
            }
            _ => None,
        };
        Ok(MediaEncoder { spec, opus })
    }

    /// Encodes one packet of `pcm` (media rate) into `out`; returns the
    /// payload bytes.
    pub fn encode(&mut self, pcm: &[f32], out: &mut [u8]) -> Result<usize, CodecError> {
        match self.spec.kind {
            CodecKind::Pcmu | CodecKind::Pcma => {
                let n = pcm.len().min(out.len());
                let law = if self.spec.kind == CodecKind::Pcmu {
                    Law::Mu
                } else {
                    Law::A
                };
                law.encode(&pcm[..n], &mut out[..n]);
                Ok(n)
            }
            CodecKind::L16 => Ok(l16::encode(pcm, out)),
            CodecKind::Opus => self
                .opus
                .as_mut()
                .expect("made for Opus")
                .encode_float(pcm, out)
                .map_err(opus_err),
        }
    }

    /// Writes the codec's silence for `samples` media samples into `out`
    /// where it is stateless (G.711, L16) and returns the bytes; `None` for
    /// Opus, whose silence goes through [`MediaEncoder::encode`] so that the
    /// encoder's state stays continuous.
    pub fn stateless_silence(&self, samples: usize, out: &mut [u8]) -> Option<usize> {
        match self.spec.kind {
            CodecKind::Pcmu | CodecKind::Pcma => {
                let law = if self.spec.kind == CodecKind::Pcmu {
                    Law::Mu
                } else {
                    Law::A
                };
                let n = samples.min(out.len());
                out[..n].fill(law.silence());
                Some(n)
            }
            CodecKind::L16 => {
                let n = (2 * samples).min(out.len());
                out[..n].fill(0);
                Some(n)
            }
            CodecKind::Opus => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_rates() {
        let s = CodecSpec::parse("pcmu", None).unwrap();
        assert_eq!(
            (s.rtp_clock_hz(), s.media_rate_hz(), s.rtp_per_media()),
            (8000, 8000, 1)
        );
        let s = CodecSpec::parse("opus", Some(48_000)).unwrap();
        assert_eq!(
            (s.rtp_clock_hz(), s.media_rate_hz(), s.rtp_per_media()),
            (48_000, 24_000, 2)
        );
        let s = CodecSpec::parse("L16", Some(16_000)).unwrap();
        assert_eq!(s.media_samples(20), 320);
        assert!(CodecSpec::parse("L16", Some(11_025)).is_err());
        assert!(CodecSpec::parse("PCMA", Some(16_000)).is_err());
        assert!(CodecSpec::parse("G729", None).is_err());
        assert!(CodecSpec::OPUS.check_ptime(30).is_err());
        assert!(CodecSpec::PCMU.check_ptime(30).is_ok());
    }

    #[test]
    fn opus_round_trip_and_concealment() {
        let spec = CodecSpec::OPUS;
        let mut enc = MediaEncoder::new(spec).unwrap();
        let mut dec = MediaDecoder::new(spec).unwrap();
        let pcm: Vec<f32> = (0..480).map(|i| (i as f32 * 0.05).sin() * 0.3).collect();
        let mut payload = [0u8; 1275];
        let n = enc.encode(&pcm, &mut payload).unwrap();
        assert_eq!(spec.payload_duration_rtp(&payload[..n]), Some(960));
        let mut out = vec![0f32; spec.max_packet_media_samples()];
        assert_eq!(dec.decode(&payload[..n], &mut out).unwrap(), 480);
        assert_eq!(dec.conceal(&mut out[..480], None).unwrap(), 480);
        assert_eq!(
            dec.conceal(&mut out[..480], Some(&payload[..n])).unwrap(),
            480
        );
    }
}
