//! SDP offer/answer for SIP calls (RFC 3264, RFC 4566/8866): read the
//! offer (parsed by the `sdp-types` crate), pick the codec by the
//! configured preference, and write the answer; for the calls moshid
//! places, write the offer ([`write_offer`]) and read the answer
//! ([`accept_answer`]).
//!
//! What an offer must have: one `m=audio` line with a non-zero port over
//! `RTP/AVP` (or `RTP/AVPF`; `RTP/SAVP` is refused: no SRTP here), a
//! connection address (media or session level), and a format moshid
//! speaks — PCMU (0), PCMA (8), L16 at a rate of [`L16_RATES_HZ`], mono,
//! or Opus (`opus/48000/2`, RFC 7587). `telephone-event` at the codec's
//! clock rate is accepted when `sip.dtmf` is on. `a=ptime` is honoured
//! when the codec can send it. Direction: `sendonly`/`inactive` (or the
//! old `c=0.0.0.0`) put the call on hold: moshid answers `recvonly`/
//! `inactive` and stops sending.
//!
//! Invariants: never panics on any input (fuzzed: `fuzz/fuzz_targets/
//! sdp_offer.rs`); an offer with nothing in common is [`Negotiation::NoCodec`]
//! (488), a broken one [`OfferError`] (400 or 488).

use crate::codec::L16_RATES_HZ;
use crate::rtp::SessionSpec;
use crate::{CodecKind, CodecSpec};
use std::net::{IpAddr, SocketAddr};

/// Media lines accepted in one offer.
pub const MAX_MEDIA: usize = 8;
/// Formats accepted on one media line.
pub const MAX_FORMATS: usize = 32;

/// Which way media flows, from the offerer's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Both ways.
    SendRecv,
    /// The offerer only sends (it holds us): we answer `recvonly`.
    SendOnly,
    /// The offerer only receives: we answer `sendonly`.
    RecvOnly,
    /// Neither.
    Inactive,
}

impl Direction {
    /// The answer's direction (RFC 3264 §6.1).
    pub fn answer(self) -> &'static str {
        match self {
            Direction::SendRecv => "sendrecv",
            Direction::SendOnly => "recvonly",
            Direction::RecvOnly => "sendonly",
            Direction::Inactive => "inactive",
        }
    }

    /// Whether moshid should send media.
    pub fn we_send(self) -> bool {
        matches!(self, Direction::SendRecv | Direction::RecvOnly)
    }
}

/// A format of the offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    /// Payload type.
    pub pt: u8,
    /// Encoding name (from `rtpmap`, or the static table).
    pub name: String,
    /// Clock rate.
    pub rate: u32,
    /// Channels (1 when not given).
    pub channels: u32,
}

/// What the endpoint reads from an offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// Where the offerer receives RTP (`None` for `c=0.0.0.0`: hold).
    pub remote: Option<SocketAddr>,
    /// The audio formats, in the offer's order.
    pub formats: Vec<Format>,
    /// `a=ptime`, if any.
    pub ptime_ms: Option<u32>,
    /// The offered direction.
    pub direction: Direction,
    /// The index of the audio line among the offer's m-lines.
    pub audio_index: usize,
    /// The number of m-lines (the answer must have as many).
    pub media_count: usize,
    /// Each m-line's media type and proto (to reject the others in the answer).
    pub other_media: Vec<(String, String, String)>,
}

/// An offer that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The SDP does not parse (400).
    #[error("malformed SDP: {0}")]
    Malformed(String),
    /// Valid SDP, but nothing moshid can take (488).
    #[error("{0}")]
    NotAcceptable(String),
}

impl OfferError {
    /// The SIP status code that refuses the offer: 400 when it does not
    /// parse, 488 when nothing in it can be taken.
    pub fn status_code(&self) -> u16 {
        match self {
            OfferError::Malformed(_) => 400,
            OfferError::NotAcceptable(_) => 488,
        }
    }
}

fn static_format(pt: u8) -> Option<(&'static str, u32, u32)> {
    match pt {
        0 => Some(("PCMU", 8000, 1)),
        8 => Some(("PCMA", 8000, 1)),
        10 => Some(("L16", 44100, 2)),
        11 => Some(("L16", 44100, 1)),
        _ => None,
    }
}

/// Reads an offer.
pub fn parse_offer(body: &[u8]) -> Result<Offer, OfferError> {
    let sdp = sdp_types::Session::parse(body).map_err(|e| OfferError::Malformed(e.to_string()))?;
    if sdp.medias.len() > MAX_MEDIA {
        return Err(OfferError::NotAcceptable(format!(
            "more than {MAX_MEDIA} media lines"
        )));
    }
    let other_media = sdp
        .medias
        .iter()
        .map(|m| (m.media.clone(), m.proto.clone(), m.fmt.clone()))
        .collect();
    let audio_index = audio_line(&sdp)?;
    let m = &sdp.medias[audio_index];
    let ip = connection_ip(&sdp, m)?;
    let formats = formats_of(m)?;
    let ptime_ms = m
        .get_first_attribute_value("ptime")
        .flatten()
        .and_then(|v| v.trim().parse::<u32>().ok());
    let mut direction = direction_of(&sdp, m);
    let remote = if ip.is_unspecified() {
        // RFC 2543 hold.
        if direction == Direction::SendRecv {
            direction = Direction::SendOnly;
        }
        None
    } else {
        Some(SocketAddr::new(ip, m.port))
    };
    Ok(Offer {
        remote,
        formats,
        ptime_ms,
        direction,
        audio_index,
        media_count: sdp.medias.len(),
        other_media,
    })
}

/// The index of the first audio line moshid can take: a non-zero port
/// over `RTP/AVP` or `RTP/AVPF`. The error says whether there was an audio
/// line at all (an SRTP one is refused, not ignored).
fn audio_line(sdp: &sdp_types::Session) -> Result<usize, OfferError> {
    let proto_ok =
        |p: &str| p.eq_ignore_ascii_case("RTP/AVP") || p.eq_ignore_ascii_case("RTP/AVPF");
    if let Some(i) = sdp
        .medias
        .iter()
        .position(|m| m.media.eq_ignore_ascii_case("audio") && m.port != 0 && proto_ok(&m.proto))
    {
        return Ok(i);
    }
    let why = if sdp
        .medias
        .iter()
        .any(|m| m.media.eq_ignore_ascii_case("audio") && m.port != 0)
    {
        "the audio line is not RTP/AVP (no SRTP here)"
    } else {
        "no audio line with a port"
    };
    Err(OfferError::NotAcceptable(why.into()))
}

/// The audio line's connection address (its own `c=`, else the
/// session's): a unicast IP address, `0.0.0.0` included (hold).
fn connection_ip(sdp: &sdp_types::Session, m: &sdp_types::Media) -> Result<IpAddr, OfferError> {
    let conn = m
        .connections
        .first()
        .or(sdp.connection.as_ref())
        .ok_or_else(|| OfferError::Malformed("no connection address (c=)".into()))?;
    // `IN IP4 addr[/ttl]`: the address alone.
    let addr_text = conn.connection_address.split('/').next().unwrap_or("");
    let ip: IpAddr = addr_text.parse().map_err(|_| {
        OfferError::NotAcceptable(format!(
            "connection address `{}` is not an IP address",
            conn.connection_address.chars().take(64).collect::<String>()
        ))
    })?;
    if ip.is_multicast() {
        return Err(OfferError::NotAcceptable(
            "multicast media is not supported".into(),
        ));
    }
    Ok(ip)
}

/// The audio line's formats in the offer's order (at most
/// [`MAX_FORMATS`]), named by `a=rtpmap` or the static table; a dynamic
/// type without `rtpmap` is skipped, a malformed one refuses the offer.
fn formats_of(m: &sdp_types::Media) -> Result<Vec<Format>, OfferError> {
    let mut formats = Vec::new();
    for f in m.fmt.split_whitespace() {
        if formats.len() >= MAX_FORMATS {
            break;
        }
        let pt: u8 = f
            .parse()
            .ok()
            .filter(|p| *p < 128)
            .ok_or_else(|| OfferError::Malformed(format!("bad payload type `{f}`")))?;
        let mapped = m
            .attributes_typed::<sdp_types::RtpMap>()
            .filter_map(Result::ok)
            .find(|r| r.payload_type == pt);
        let (name, rate, channels) = match (mapped, static_format(pt)) {
            (Some(r), _) => {
                let ch = match r.encoding_params.as_deref() {
                    None => 1,
                    Some(c) => c
                        .trim()
                        .parse()
                        .map_err(|_| OfferError::Malformed(format!("bad channel count `{c}`")))?,
                };
                (r.encoding_name, r.clock_rate, ch)
            }
            (None, Some((n, r, c))) => (n.to_string(), r, c),
            (None, None) => continue, // an unknown dynamic type without rtpmap
        };
        formats.push(Format {
            pt,
            name,
            rate,
            channels,
        });
    }
    Ok(formats)
}

/// The offered direction: the media line's attribute, else the
/// session's, else `sendrecv` (the default). `c=0.0.0.0` is the
/// caller's to apply.
fn direction_of(sdp: &sdp_types::Session, m: &sdp_types::Media) -> Direction {
    let dir_of = |has: &dyn Fn(&str) -> bool| {
        if has("inactive") {
            Some(Direction::Inactive)
        } else if has("sendonly") {
            Some(Direction::SendOnly)
        } else if has("recvonly") {
            Some(Direction::RecvOnly)
        } else if has("sendrecv") {
            Some(Direction::SendRecv)
        } else {
            None
        }
    };
    dir_of(&|a| m.has_attribute(a))
        .or_else(|| dir_of(&|a| sdp.has_attribute(a)))
        .unwrap_or(Direction::SendRecv)
}

/// What the answer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The codec.
    pub codec: CodecSpec,
    /// Its payload type (the offer's).
    pub pt: u8,
    /// Opus: the offer's channel count (always 2 by RFC 7587).
    pub channels: u32,
    /// `telephone-event` payload type, when offered at the codec's clock.
    pub dtmf_pt: Option<u8>,
    /// Packet time moshid sends.
    pub ptime_ms: u32,
}

impl Choice {
    /// The RTP session that carries this choice to `remote`.
    pub fn spec(&self, remote: Option<SocketAddr>) -> SessionSpec {
        SessionSpec {
            codec: self.codec,
            payload_type: self.pt,
            ptime_ms: self.ptime_ms,
            dtmf_payload_type: self.dtmf_pt,
            remote,
        }
    }
}

/// Why an offer with nothing in common is refused (its 488's `Warning`):
/// what it `offered` ([`Negotiation::NoCodec`]) and what moshid takes.
pub fn no_codec_why(offered: &str, preference: &[String]) -> String {
    format!(
        "no codec in common: offered {offered}; moshid takes {}",
        preference.join(" ")
    )
}

/// The outcome of negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiation {
    /// A codec in common.
    Agreed(Choice),
    /// Nothing in common (488), with the offered names.
    NoCodec(String),
}

fn codec_of(f: &Format) -> Option<CodecSpec> {
    let name = f.name.to_ascii_uppercase();
    match name.as_str() {
        "PCMU" if f.rate == 8000 && f.channels == 1 => Some(CodecSpec::PCMU),
        "PCMA" if f.rate == 8000 && f.channels == 1 => Some(CodecSpec::PCMA),
        "OPUS" if f.rate == 48000 && f.pt >= 96 => Some(CodecSpec::OPUS),
        "L16" if f.channels == 1 && L16_RATES_HZ.contains(&f.rate) => {
            CodecSpec::parse("L16", Some(f.rate)).ok()
        }
        _ => None,
    }
}

/// Picks the first codec of `preference` the offer has.
pub fn negotiate(
    offer: &Offer,
    preference: &[String],
    dtmf: bool,
    default_ptime_ms: u32,
) -> Negotiation {
    for want in preference {
        for f in &offer.formats {
            let Some(codec) = codec_of(f) else { continue };
            if !codec.name().eq_ignore_ascii_case(want) {
                continue;
            }
            // 72-95 collide with RTCP on a muxed port (RFC 5761).
            if (72..=95).contains(&f.pt) {
                continue;
            }
            let dtmf_pt = offer
                .formats
                .iter()
                .find(|d| {
                    dtmf && d.name.eq_ignore_ascii_case("telephone-event")
                        && d.rate == codec.rtp_clock_hz()
                        && d.pt != f.pt
                        && !(72..=95).contains(&d.pt)
                })
                .map(|d| d.pt);
            let ptime_ms = offer
                .ptime_ms
                .filter(|p| codec.check_ptime(*p).is_ok())
                .or_else(|| Some(default_ptime_ms).filter(|p| codec.check_ptime(*p).is_ok()))
                .unwrap_or(20);
            return Negotiation::Agreed(Choice {
                codec,
                pt: f.pt,
                channels: f.channels,
                dtmf_pt,
                ptime_ms,
            });
        }
    }
    let offered: Vec<String> = offer
        .formats
        .iter()
        .map(|f| format!("{}/{}", f.name, f.rate))
        .collect();
    Negotiation::NoCodec(offered.join(" "))
}

fn ip_kind(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IP4"
    } else {
        "IP6"
    }
}

/// Writes the answer: moshid's address and port, the chosen codec (and
/// telephone-event), ptime, direction; every other m-line of the offer is
/// rejected with port 0 (RFC 3264 §6).
pub fn write_answer(
    offer: &Offer,
    choice: &Choice,
    local: SocketAddr,
    session_id: u64,
    version: u64,
) -> String {
    let ip = local.ip();
    let mut s = format!(
        "v=0\r\no=moshid {session_id} {version} IN {k} {ip}\r\ns=moshid\r\nc=IN {k} {ip}\r\nt=0 0\r\n",
        k = ip_kind(ip)
    );
    for (i, (media, proto, fmt)) in offer.other_media.iter().enumerate() {
        if i != offer.audio_index {
            let first = fmt.split_whitespace().next().unwrap_or("0");
            s.push_str(&format!("m={media} 0 {proto} {first}\r\n"));
            continue;
        }
        let c = &choice.codec;
        let mut fmts = choice.pt.to_string();
        if let Some(d) = choice.dtmf_pt {
            fmts.push_str(&format!(" {d}"));
        }
        s.push_str(&format!("m=audio {} RTP/AVP {fmts}\r\n", local.port()));
        let rtpmap = match c.kind {
            CodecKind::Opus => format!("opus/48000/{}", choice.channels.max(1)),
            _ => format!("{}/{}", c.name(), c.rtp_clock_hz()),
        };
        s.push_str(&format!("a=rtpmap:{} {rtpmap}\r\n", choice.pt));
        if c.kind == CodecKind::Opus {
            s.push_str(&format!("a=fmtp:{} useinbandfec=1\r\n", choice.pt));
        }
        if let Some(d) = choice.dtmf_pt {
            s.push_str(&format!(
                "a=rtpmap:{d} telephone-event/{}\r\na=fmtp:{d} 0-16\r\n",
                c.rtp_clock_hz()
            ));
        }
        s.push_str(&format!("a=ptime:{}\r\n", choice.ptime_ms));
        s.push_str(&format!("a={}\r\n", offer.direction.answer()));
    }
    s
}

/// The payload types of moshid's offers: the static ones, and dynamic
/// ones that stay clear of RTCP's 72–95 (RFC 5761).
const OFFER_OPUS_PT: u8 = 111;
const OFFER_L16_PT: u8 = 98;
/// L16's rate in an offer (wideband: what a PBX that takes L16 takes).
const OFFER_L16_RATE_HZ: u32 = 16_000;

/// Writes moshid's offer for a call it places (RFC 3264 §5): every codec
/// of `preference` in that order on one audio line, `telephone-event` at
/// each codec clock when `dtmf`, `ptime_ms`, `sendrecv`.
pub fn write_offer(
    preference: &[String],
    dtmf: bool,
    ptime_ms: u32,
    local: SocketAddr,
    session_id: u64,
) -> String {
    let ip = local.ip();
    let mut formats: Vec<(u8, String)> = Vec::new();
    for name in preference {
        let f = match name.to_ascii_uppercase().as_str() {
            "OPUS" => (OFFER_OPUS_PT, "opus/48000/2".to_string()),
            "PCMU" => (0, "PCMU/8000".into()),
            "PCMA" => (8, "PCMA/8000".into()),
            "L16" => (OFFER_L16_PT, format!("L16/{OFFER_L16_RATE_HZ}")),
            _ => continue,
        };
        formats.push(f);
    }
    if dtmf {
        // One telephone-event per clock rate in use (RFC 4733 §2.5.1.1).
        let mut clocks: Vec<u32> = Vec::new();
        for (_, map) in &formats {
            let clock: u32 = map
                .split('/')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(8000);
            if !clocks.contains(&clock) {
                clocks.push(clock);
            }
        }
        for (i, clock) in clocks.into_iter().enumerate() {
            formats.push((101 + i as u8, format!("telephone-event/{clock}")));
        }
    }
    let pts: Vec<String> = formats.iter().map(|(pt, _)| pt.to_string()).collect();
    let mut s = format!(
        "v=0\r\no=moshid {session_id} 1 IN {k} {ip}\r\ns=moshid\r\nc=IN {k} {ip}\r\nt=0 0\r\n\
         m=audio {} RTP/AVP {}\r\n",
        local.port(),
        pts.join(" "),
        k = ip_kind(ip)
    );
    for (pt, map) in &formats {
        s.push_str(&format!("a=rtpmap:{pt} {map}\r\n"));
        if *pt == OFFER_OPUS_PT {
            s.push_str(&format!("a=fmtp:{pt} useinbandfec=1\r\n"));
        }
        if map.starts_with("telephone-event") {
            s.push_str(&format!("a=fmtp:{pt} 0-16\r\n"));
        }
    }
    s.push_str(&format!("a=ptime:{ptime_ms}\r\na=sendrecv\r\n"));
    s
}

/// Reads the answer to moshid's `offer` and picks the codec to use: the
/// first of `preference` that the answer has on a payload type moshid
/// offered for it (an answer may only narrow the offer, RFC 3264 §6.1).
pub fn accept_answer(
    offer: &str,
    answer: &[u8],
    preference: &[String],
    dtmf: bool,
    default_ptime_ms: u32,
) -> Result<(Offer, Choice), OfferError> {
    let ours = parse_offer(offer.as_bytes())?;
    let mut theirs = parse_offer(answer)?;
    if theirs.remote.is_none() && theirs.direction == Direction::SendOnly {
        return Err(OfferError::NotAcceptable(
            "the answer puts the call on hold (c=0.0.0.0)".into(),
        ));
    }
    // Only formats moshid offered, on the payload types it gave them.
    theirs.formats.retain(|f| {
        ours.formats
            .iter()
            .any(|o| o.pt == f.pt && o.name.eq_ignore_ascii_case(&f.name) && o.rate == f.rate)
    });
    match negotiate(&theirs, preference, dtmf, default_ptime_ms) {
        Negotiation::Agreed(choice) => Ok((theirs, choice)),
        Negotiation::NoCodec(_) => Err(OfferError::NotAcceptable(
            "the answer names no codec of moshid's offer".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefs(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    const OFFER: &str = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n\
        m=audio 40000 RTP/AVP 96 0 8 101\r\na=rtpmap:96 opus/48000/2\r\na=rtpmap:101 telephone-event/8000\r\n\
        a=rtpmap:102 telephone-event/48000\r\na=ptime:40\r\na=sendrecv\r\n\
        m=video 40002 RTP/AVP 97\r\na=rtpmap:97 H264/90000\r\n";

    #[test]
    fn picks_by_preference_and_answers() {
        let o = parse_offer(OFFER.as_bytes()).unwrap();
        assert_eq!(o.remote, Some("127.0.0.1:40000".parse().unwrap()));
        assert_eq!(o.formats.len(), 4);
        assert_eq!(o.ptime_ms, Some(40));
        let Negotiation::Agreed(c) = negotiate(&o, &prefs(&["PCMU", "opus"]), true, 20) else {
            panic!()
        };
        assert_eq!(
            (c.codec, c.pt, c.dtmf_pt, c.ptime_ms),
            (CodecSpec::PCMU, 0, Some(101), 40)
        );
        let Negotiation::Agreed(c) = negotiate(&o, &prefs(&["opus"]), true, 20) else {
            panic!()
        };
        // telephone-event/48000 is not in the m-line's formats: no DTMF for Opus.
        assert_eq!((c.codec, c.pt, c.dtmf_pt), (CodecSpec::OPUS, 96, None));
        let a = write_answer(&o, &c, "127.0.0.1:50000".parse().unwrap(), 7, 1);
        assert!(a.contains("m=audio 50000 RTP/AVP 96\r\n"), "{a}");
        assert!(a.contains("a=rtpmap:96 opus/48000/2\r\n"), "{a}");
        assert!(a.contains("m=video 0 RTP/AVP 97\r\n"), "{a}");
        // The answer is valid SDP by the same parser.
        let back = parse_offer(a.as_bytes()).unwrap();
        assert_eq!(back.formats[0].pt, 96);
        assert_eq!(
            negotiate(&o, &prefs(&["L16"]), true, 20),
            Negotiation::NoCodec("opus/48000 PCMU/8000 PCMA/8000 telephone-event/8000".into())
        );
    }

    #[test]
    fn offers_and_reads_answers() {
        let all = prefs(&["opus", "PCMU", "PCMA", "L16"]);
        let offer = write_offer(&all, true, 20, "127.0.0.1:40000".parse().unwrap(), 9);
        // moshid's own parser reads its offer, and negotiates it.
        let o = parse_offer(offer.as_bytes()).unwrap();
        assert_eq!(o.remote, Some("127.0.0.1:40000".parse().unwrap()));
        let names: Vec<String> = o
            .formats
            .iter()
            .map(|f| format!("{}/{}", f.name, f.rate))
            .collect();
        assert_eq!(
            names,
            [
                "opus/48000",
                "PCMU/8000",
                "PCMA/8000",
                "L16/16000",
                "telephone-event/48000",
                "telephone-event/8000",
                "telephone-event/16000"
            ]
        );
        let Negotiation::Agreed(c) = negotiate(&o, &prefs(&["L16"]), true, 20) else {
            panic!()
        };
        assert_eq!((c.pt, c.dtmf_pt), (98, Some(103)));
        // A PBX's answer: PCMU and its DTMF, at 30 ms.
        let answer = "v=0\r\no=pbx 1 1 IN IP4 127.0.0.2\r\ns=-\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n\
            m=audio 30000 RTP/AVP 0 102\r\na=rtpmap:102 telephone-event/8000\r\na=ptime:30\r\na=sendrecv\r\n";
        let (theirs, c) = accept_answer(&offer, answer.as_bytes(), &all, true, 20).unwrap();
        assert_eq!(theirs.remote, Some("127.0.0.2:30000".parse().unwrap()));
        assert_eq!(
            (c.codec, c.pt, c.dtmf_pt, c.ptime_ms),
            (CodecSpec::PCMU, 0, Some(102), 30)
        );
        // 101 is telephone-event/48000 in moshid's offer: not taken for PCMU's clock.
        let other = answer.replace(" 0 102", " 0 101").replace(
            "a=rtpmap:102 telephone-event/8000",
            "a=rtpmap:101 telephone-event/8000",
        );
        let r = accept_answer(&offer, other.as_bytes(), &all, true, 20).unwrap();
        assert_eq!(r.1.dtmf_pt, None);
        // Formats moshid did not offer, or on other payload types, are not taken.
        for bad in [
            "m=audio 30000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n",
            "m=audio 30000 RTP/AVP 96\r\na=rtpmap:96 opus/48000/2\r\n",
            "m=audio 30000 RTP/AVP 0\r\n",
        ] {
            let a = format!(
                "v=0\r\no=- 1 1 IN IP4 127.0.0.2\r\ns=-\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n{bad}"
            );
            let r = accept_answer(&offer, a.as_bytes(), &prefs(&["opus", "PCMA"]), true, 20);
            assert!(
                matches!(r, Err(OfferError::NotAcceptable(_))),
                "{bad}: {r:?}"
            );
        }
        assert!(matches!(
            accept_answer(&offer, b"garbage", &all, true, 20),
            Err(OfferError::Malformed(_))
        ));
    }

    #[test]
    fn hold_and_directions() {
        let hold = OFFER.replace("a=sendrecv", "a=sendonly");
        let o = parse_offer(hold.as_bytes()).unwrap();
        assert_eq!(o.direction, Direction::SendOnly);
        assert_eq!(o.direction.answer(), "recvonly");
        assert!(!o.direction.we_send());
        let old = OFFER.replace("c=IN IP4 127.0.0.1", "c=IN IP4 0.0.0.0");
        let o = parse_offer(old.as_bytes()).unwrap();
        assert_eq!((o.remote, o.direction), (None, Direction::SendOnly));
        let inactive = OFFER.replace("a=sendrecv", "a=inactive");
        assert_eq!(
            parse_offer(inactive.as_bytes()).unwrap().direction,
            Direction::Inactive
        );
    }

    /// Hand-made broken offers: each refused as malformed (400) or not
    /// acceptable (488), none panics.
    #[test]
    fn malformed_table() {
        let base = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n";
        let cases: &[(String, bool)] = &[
            ("".into(), true),
            ("hello".into(), true),
            (format!("{base}m=audio 4000 RTP/AVP 0\r\n"), true), // no c=
            (format!("{base}c=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP x\r\n"), true),
            (format!("{base}c=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 300\r\n"), true),
            (format!("{base}c=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/SAVP 0\r\n"), false),
            (format!("{base}c=IN IP4 127.0.0.1\r\nm=audio 0 RTP/AVP 0\r\n"), false),
            (format!("{base}c=IN IP4 127.0.0.1\r\nm=video 4000 RTP/AVP 96\r\n"), false),
            (format!("{base}c=IN IP4 example.com\r\nm=audio 4000 RTP/AVP 0\r\n"), false),
            (format!("{base}c=IN IP4 224.0.0.1/1\r\nm=audio 4000 RTP/AVP 0\r\n"), false),
            (
                format!("{base}c=IN IP4 127.0.0.1\r\nm=audio 4000 RTP/AVP 96\r\na=rtpmap:96 L16/8000/x\r\n"),
                true,
            ),
        ];
        for (sdp, malformed) in cases {
            match parse_offer(sdp.as_bytes()) {
                Err(OfferError::Malformed(_)) => assert!(*malformed, "{sdp:?} should be 488"),
                Err(OfferError::NotAcceptable(_)) => assert!(!*malformed, "{sdp:?} should be 400"),
                Ok(o) => panic!("{sdp:?} accepted: {o:?}"),
            }
        }
        // Parses, but nothing in common: G.729 only, stereo L16, Opus on a static type.
        for fmt in [
            "m=audio 4000 RTP/AVP 18\r\na=rtpmap:18 G729/8000\r\n",
            "m=audio 4000 RTP/AVP 10\r\n",
            "m=audio 4000 RTP/AVP 3\r\na=rtpmap:3 opus/48000/2\r\n",
        ] {
            let sdp = format!("{base}c=IN IP4 127.0.0.1\r\n{fmt}");
            let o = parse_offer(sdp.as_bytes()).unwrap();
            assert!(
                matches!(
                    negotiate(&o, &prefs(&["opus", "PCMU", "PCMA", "L16"]), true, 20),
                    Negotiation::NoCodec(_)
                ),
                "{fmt}"
            );
        }
    }
}
