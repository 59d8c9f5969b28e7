//! Writing SIP messages: responses to a request (RFC 3261 §8.2.6: Via,
//! From, To, Call-ID and CSeq copied, the To tag added) and the requests
//! moshid sends (BYE within a dialog; the INVITE, ACK and CANCEL of the
//! calls it places; REGISTER). Tags and branches come from
//! [`Ids`]: random per core, unique per message.

use super::message::Request;
use std::fmt::Write;

/// The methods moshid serves (the `Allow` header).
pub const ALLOW: &str = "INVITE, ACK, BYE, CANCEL, OPTIONS";
/// What moshid says it is.
pub const SERVER: &str = concat!("moshid/", env!("CARGO_PKG_VERSION"));

/// Fresh tags and branches: a random per-core key mixed with a counter.
pub struct Ids {
    key: u64,
    counter: u64,
}

impl Ids {
    /// Seeded from the system's random source.
    pub fn new() -> Ids {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 8];
        let key = match ring::rand::SystemRandom::new().fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x9e37_79b9, |d| d.as_nanos() as u64),
        };
        Ids { key, counter: 0 }
    }

    /// A new 64-bit value (splitmix64 of key + counter).
    pub fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        let mut z = self
            .key
            .wrapping_add(self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A To/From tag.
    pub fn tag(&mut self) -> String {
        format!("{:016x}", self.next_u64())
    }

    /// An RFC 3261 branch (magic cookie first).
    pub fn branch(&mut self) -> String {
        format!("z9hG4bK{:016x}", self.next_u64())
    }
}

impl Default for Ids {
    fn default() -> Self {
        Ids::new()
    }
}

/// The standard reason phrase of `code`.
pub fn reason(code: u16) -> &'static str {
    match code {
        100 => "Trying",
        180 => "Ringing",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        415 => "Unsupported Media Type",
        416 => "Unsupported URI Scheme",
        420 => "Bad Extension",
        480 => "Temporarily Unavailable",
        481 => "Call/Transaction Does Not Exist",
        483 => "Too Many Hops",
        486 => "Busy Here",
        487 => "Request Terminated",
        488 => "Not Acceptable Here",
        491 => "Request Pending",
        500 => "Server Internal Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        513 => "Message Too Large",
        _ => "Unknown",
    }
}

/// A response to `req`. `to_tag` is added to To when the request's has
/// none; `extra` are further header lines (`Name: value`, no CRLF);
/// `sdp` the body (`application/sdp`).
pub fn response(
    req: &Request,
    code: u16,
    to_tag: Option<&str>,
    extra: &[String],
    sdp: Option<&str>,
) -> Vec<u8> {
    let mut s = String::with_capacity(512);
    let _ = write!(s, "SIP/2.0 {code} {}\r\n", reason(code));
    for v in &req.vias {
        let _ = write!(s, "Via: {v}\r\n");
    }
    if let Some(from) = req.msg.header("From") {
        let _ = write!(s, "From: {from}\r\n");
    }
    let to = req.msg.header("To").unwrap_or("");
    match (req.to.tag.is_some(), to_tag) {
        (false, Some(tag)) if code != 100 => {
            let _ = write!(s, "To: {to};tag={tag}\r\n");
        }
        _ => {
            let _ = write!(s, "To: {to}\r\n");
        }
    }
    let _ = write!(s, "Call-ID: {}\r\n", req.call_id);
    let _ = write!(s, "CSeq: {} {}\r\n", req.cseq, req.cseq_method);
    if req.method == "INVITE" && (101..300).contains(&code) {
        // A dialog-forming response keeps the route set (§12.1.1).
        for rr in req.msg.headers_named("Record-Route") {
            let _ = write!(s, "Record-Route: {rr}\r\n");
        }
    }
    let _ = write!(s, "Server: {SERVER}\r\n");
    finish(s, extra, sdp)
}

/// Ends a message whose first header lines are in `s`: the `extra` lines,
/// then its SDP body with its type and length, or `Content-Length: 0`.
fn finish(mut s: String, extra: &[String], sdp: Option<&str>) -> Vec<u8> {
    for h in extra {
        let _ = write!(s, "{h}\r\n");
    }
    match sdp {
        Some(body) => {
            let _ = write!(
                s,
                "Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        None => s.push_str("Content-Length: 0\r\n\r\n"),
    }
    s.into_bytes()
}

/// What a request within a dialog needs (RFC 3261 §12.2.1.1).
pub struct InDialog<'a> {
    /// The remote target (the peer's Contact).
    pub target: &'a str,
    /// The route set (Record-Route of the INVITE, in order).
    pub route: &'a [String],
    /// Our From (the INVITE's To with our tag).
    pub local_party: &'a str,
    /// Their To (the INVITE's From).
    pub remote_party: &'a str,
    /// Call-ID.
    pub call_id: &'a str,
    /// Our CSeq.
    pub cseq: u32,
    /// `transport host:port` of our Via.
    pub via: &'a str,
}

/// A request of `method` within a dialog, with a fresh `branch`.
pub fn request(method: &str, d: &InDialog<'_>, branch: &str) -> Vec<u8> {
    request_with(method, d, branch, &[], None)
}

/// A request of `method` with `branch`, further header lines `extra`
/// (`Name: value`, no CRLF) and an SDP body: within a dialog, or, with no
/// tag on `remote_party`, one that starts one (moshid's INVITE, REGISTER).
pub fn request_with(
    method: &str,
    d: &InDialog<'_>,
    branch: &str,
    extra: &[String],
    sdp: Option<&str>,
) -> Vec<u8> {
    let mut s = String::with_capacity(512);
    let _ = write!(s, "{method} {} SIP/2.0\r\n", d.target);
    let _ = write!(s, "Via: SIP/2.0/{};branch={branch};rport\r\n", d.via);
    let _ = write!(s, "Max-Forwards: 70\r\n");
    for r in d.route {
        let _ = write!(s, "Route: {r}\r\n");
    }
    let _ = write!(s, "From: {}\r\n", d.local_party);
    let _ = write!(s, "To: {}\r\n", d.remote_party);
    let _ = write!(s, "Call-ID: {}\r\n", d.call_id);
    let _ = write!(s, "CSeq: {} {method}\r\n", d.cseq);
    let _ = write!(s, "User-Agent: {SERVER}\r\n");
    finish(s, extra, sdp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sip::message::{parse, parse_request, StartLine};

    #[test]
    fn responses_copy_what_they_must() {
        let r = parse_request(
            b"OPTIONS sip:m@h SIP/2.0\r\nVia: SIP/2.0/UDP a;branch=z9hG4bK1\r\nVia: SIP/2.0/UDP b;branch=z9hG4bK0\r\n\
              From: <sip:a@h>;tag=x\r\nTo: <sip:m@h>\r\nCall-ID: c1\r\nCSeq: 4 OPTIONS\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        let out = response(
            &r,
            200,
            Some("t1"),
            &[format!("Allow: {ALLOW}")],
            Some("v=0\r\n"),
        );
        let m = parse(&out).unwrap();
        assert_eq!(
            m.start,
            StartLine::Response {
                code: 200,
                reason: "OK".into()
            }
        );
        assert_eq!(m.headers_named("Via").count(), 2);
        assert_eq!(m.header("To"), Some("<sip:m@h>;tag=t1"));
        assert_eq!(m.header("CSeq"), Some("4 OPTIONS"));
        assert_eq!(m.body, b"v=0\r\n");
        let mut ids = Ids::new();
        assert_ne!(ids.tag(), ids.tag());
        assert!(ids.branch().starts_with("z9hG4bK"));
    }
}
