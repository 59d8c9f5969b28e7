//! SIP messages (RFC 3261 §7): parsing one message from a datagram or
//! from a TCP stream (cut into messages by [`super::framing`]), and the
//! typed view of a request the endpoint works with.
//!
//! Hand-written (see the module docs of [`super`] for why): the grammar the
//! endpoint needs is small — start line, headers (folded lines, compact
//! forms, comma-separated Via, the body's `Content-Length`) — and bounded
//! here: a message over `sip.max_message_bytes` never reaches this code,
//! and at most [`MAX_HEADERS`] header fields, [`MAX_VIAS`] Via entries and
//! lines of [`MAX_LINE_BYTES`] are accepted.
//!
//! Invariants: parsing never panics on any input (fuzzed: `fuzz/fuzz_targets/
//! sip_message.rs`); a request whose Via, From, To, Call-ID and CSeq can be
//! read gets a [`Request`] even when something else is wrong, so that the
//! endpoint can answer it with a 4xx for that request alone.

use super::uri::SipUri;

/// Header fields accepted in one message.
pub const MAX_HEADERS: usize = 128;
/// Via entries accepted in one message (proxies each add one).
pub const MAX_VIAS: usize = 32;
/// Longest header line (after unfolding), in bytes.
pub const MAX_LINE_BYTES: usize = 4096;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not a SIP message at all (nothing can be answered).
    #[error("not a SIP message: {0}")]
    NotSip(&'static str),
    /// A SIP message with a fault (the request can be answered with 400).
    #[error("{0}")]
    Bad(String),
}

fn bad(why: impl Into<String>) -> ParseError {
    ParseError::Bad(why.into())
}

/// The first line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartLine {
    /// `METHOD URI SIP/2.0`.
    Request {
        /// The method, as sent (methods are case-sensitive).
        method: String,
        /// The Request-URI, as sent.
        uri: String,
    },
    /// `SIP/2.0 CODE REASON`.
    Response {
        /// The status code.
        code: u16,
        /// The reason phrase.
        reason: String,
    },
}

/// A parsed message: start line, headers in order (canonical names), body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The first line.
    pub start: StartLine,
    /// `(canonical name, value)` in order; a comma-separated Via is split.
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes).
    pub body: Vec<u8>,
}

/// The long name of a compact header form (RFC 3261 §7.3.3 and later RFCs),
/// and the canonical spelling of the common long names.
fn canonical(name: &str) -> String {
    let long = match name.to_ascii_lowercase().as_str() {
        "i" | "call-id" => "Call-ID",
        "m" | "contact" => "Contact",
        "f" | "from" => "From",
        "t" | "to" => "To",
        "v" | "via" => "Via",
        "l" | "content-length" => "Content-Length",
        "c" | "content-type" => "Content-Type",
        "k" | "supported" => "Supported",
        "s" | "subject" => "Subject",
        "e" | "content-encoding" => "Content-Encoding",
        "cseq" => "CSeq",
        "max-forwards" => "Max-Forwards",
        "record-route" => "Record-Route",
        "route" => "Route",
        "authorization" => "Authorization",
        "proxy-authorization" => "Proxy-Authorization",
        "www-authenticate" => "WWW-Authenticate",
        "require" => "Require",
        "allow" => "Allow",
        "accept" => "Accept",
        "user-agent" => "User-Agent",
        "retry-after" => "Retry-After",
        _ => return name.to_string(),
    };
    long.to_string()
}

/// Headers that may hold several comma-separated values (split on parse).
fn is_list(name: &str) -> bool {
    matches!(name, "Via" | "Record-Route" | "Route")
}

/// Splits at commas outside quotes and angle brackets.
fn split_list(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut angle, mut start) = (false, false, 0);
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'<' if !quoted => angle = true,
            b'>' if !quoted => angle = false,
            b',' if !quoted && !angle => {
                out.push(v[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(v[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// Where the head ends: `(head length, body start)`.
fn head_end(data: &[u8]) -> Option<(usize, usize)> {
    if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
        return Some((i, i + 4));
    }
    data.windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (i, i + 2))
}

/// Parses one message (a datagram, or a frame cut by
/// [`super::framing::Framer`]).
pub fn parse(data: &[u8]) -> Result<Message, ParseError> {
    let (head, body_start) = head_end(data).ok_or(ParseError::NotSip("no end of head"))?;
    let text = std::str::from_utf8(&data[..head]).map_err(|_| ParseError::NotSip("not UTF-8"))?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let first = lines.next().ok_or(ParseError::NotSip("empty"))?;
    let start = parse_start(first)?;
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut vias = 0;
    // Unfold (RFC 3261 §7.3.1): a line starting with white space continues
    // the previous one.
    let mut raw: Vec<String> = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            let last = raw.last_mut().ok_or_else(|| bad("folded first header"))?;
            last.push(' ');
            last.push_str(line.trim());
        } else {
            if raw.len() >= MAX_HEADERS {
                return Err(bad(format!("more than {MAX_HEADERS} header fields")));
            }
            raw.push(line.to_string());
        }
        if raw.last().is_some_and(|l| l.len() > MAX_LINE_BYTES) {
            return Err(bad(format!("a header line over {MAX_LINE_BYTES} bytes")));
        }
    }
    for line in &raw {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("header line without a colon: `{}`", clip(line))))?;
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(bad(format!("bad header name `{}`", clip(name))));
        }
        let name = canonical(name);
        let value = value.trim();
        if is_list(&name) {
            for v in split_list(value) {
                if name == "Via" {
                    vias += 1;
                    if vias > MAX_VIAS {
                        return Err(bad(format!("more than {MAX_VIAS} Via entries")));
                    }
                }
                headers.push((name.clone(), v.to_string()));
            }
        } else {
            headers.push((name, value.to_string()));
        }
    }
    let rest = &data[body_start..];
    let body = match headers.iter().find(|(n, _)| n == "Content-Length") {
        None => rest.to_vec(),
        Some((_, v)) => {
            let n: usize = v.parse().map_err(|_| bad("bad Content-Length"))?;
            if n > rest.len() {
                return Err(bad("Content-Length beyond the datagram"));
            }
            rest[..n].to_vec()
        }
    };
    Ok(Message {
        start,
        headers,
        body,
    })
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// RFC 3261 `token` characters.
pub fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b)
}

fn parse_start(line: &str) -> Result<StartLine, ParseError> {
    if let Some(rest) = line.strip_prefix("SIP/2.0 ") {
        let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
        let code: u16 = code
            .parse()
            .ok()
            .filter(|c| (100..700).contains(c))
            .ok_or(ParseError::NotSip("bad status code"))?;
        return Ok(StartLine::Response {
            code,
            reason: reason.to_string(),
        });
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::NotSip("bad request line"));
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) {
        return Err(ParseError::NotSip("bad method"));
    }
    if version != "SIP/2.0" {
        return Err(ParseError::NotSip("not SIP/2.0"));
    }
    Ok(StartLine::Request {
        method: method.to_string(),
        uri: uri.to_string(),
    })
}

impl Message {
    /// The first value of header `name` (canonical name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`, in order.
    pub fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The branch of the topmost Via (matches a response to the request
    /// moshid sent), if it reads.
    pub fn top_branch(&self) -> Option<String> {
        self.header("Via")
            .and_then(|v| parse_via(v).ok())
            .map(|v| v.branch)
    }

    /// `(number, method)` of the CSeq header, if it reads.
    pub fn cseq(&self) -> Option<(u32, &str)> {
        let (n, method) = self
            .header("CSeq")?
            .trim()
            .split_once(char::is_whitespace)?;
        Some((n.parse().ok()?, method.trim()))
    }

    /// A response's status as words (`486 Busy Here`); empty for a request.
    pub fn status_text(&self) -> String {
        match &self.start {
            StartLine::Response { code, reason } => format!("{code} {reason}"),
            StartLine::Request { .. } => String::new(),
        }
    }
}

/// The topmost Via: `SIP/2.0/UDP host:port;branch=…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    /// `UDP`, `TCP`, …
    pub transport: String,
    /// `host[:port]`, as sent.
    pub sent_by: String,
    /// The branch parameter (empty when absent: an RFC 2543 peer).
    pub branch: String,
}

/// Reads a Via value.
pub fn parse_via(v: &str) -> Result<Via, ParseError> {
    let (proto, rest) = v
        .split_once(char::is_whitespace)
        .ok_or_else(|| bad("bad Via"))?;
    let mut p = proto.split('/');
    let (Some(name), Some(version), Some(transport), None) =
        (p.next(), p.next(), p.next(), p.next())
    else {
        return Err(bad("bad Via protocol"));
    };
    if !name.trim().eq_ignore_ascii_case("SIP") || version.trim() != "2.0" {
        return Err(bad("Via is not SIP/2.0"));
    }
    let mut params = rest.trim().split(';');
    let sent_by = params.next().unwrap_or("").trim();
    if sent_by.is_empty() {
        return Err(bad("Via without sent-by"));
    }
    let mut branch = String::new();
    for p in params {
        let (k, val) = p.split_once('=').unwrap_or((p, ""));
        if k.trim().eq_ignore_ascii_case("branch") {
            branch = val.trim().to_string();
        }
    }
    Ok(Via {
        transport: transport.trim().to_ascii_uppercase(),
        sent_by: sent_by.to_string(),
        branch,
    })
}

/// A `name-addr` or `addr-spec` header (From, To, Contact): the URI and
/// the `tag` parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameAddr {
    /// The URI, as sent.
    pub uri: String,
    /// The `tag` parameter.
    pub tag: Option<String>,
}

/// Reads From/To/Contact.
pub fn parse_name_addr(v: &str) -> Result<NameAddr, ParseError> {
    let v = v.trim();
    let (uri, params) = if let Some(open) = v.find('<') {
        let close = v[open..]
            .find('>')
            .map(|c| open + c)
            .ok_or_else(|| bad("`<` without `>`"))?;
        (&v[open + 1..close], &v[close + 1..])
    } else {
        // addr-spec: parameters after the URI belong to the header.
        match v.find(';') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, ""),
        }
    };
    if uri.trim().is_empty() {
        return Err(bad("empty URI"));
    }
    let mut tag = None;
    for p in params.split(';') {
        let (k, val) = p.split_once('=').unwrap_or((p, ""));
        if k.trim().eq_ignore_ascii_case("tag") && !val.trim().is_empty() {
            tag = Some(val.trim().to_string());
        }
    }
    Ok(NameAddr {
        uri: uri.trim().to_string(),
        tag,
    })
}

/// A request with the fields every transaction and dialog needs.
#[derive(Debug, Clone)]
pub struct Request {
    /// The method.
    pub method: String,
    /// The Request-URI, as sent.
    pub uri: String,
    /// The whole message (headers for copying into responses).
    pub msg: Message,
    /// Every Via value, in order (copied into responses).
    pub vias: Vec<String>,
    /// The topmost Via.
    pub via: Via,
    /// From (URI and tag).
    pub from: NameAddr,
    /// To (URI and tag).
    pub to: NameAddr,
    /// Call-ID.
    pub call_id: String,
    /// CSeq number.
    pub cseq: u32,
    /// CSeq method.
    pub cseq_method: String,
}

/// A request that cannot be served, with what is needed to answer it.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The request, when its core headers could be read (answerable).
    pub request: Option<Box<Request>>,
    /// Why.
    pub why: String,
}

impl Request {
    /// The typed view of a parsed request; `Err` names the fault.
    pub fn from_message(msg: Message) -> Result<Request, String> {
        let StartLine::Request { method, uri } = msg.start.clone() else {
            return Err("not a request".into());
        };
        let vias: Vec<String> = msg.headers_named("Via").map(str::to_string).collect();
        let via = parse_via(vias.first().ok_or("no Via")?).map_err(|e| e.to_string())?;
        let from = parse_name_addr(msg.header("From").ok_or("no From")?)
            .map_err(|e| format!("From: {e}"))?;
        let to =
            parse_name_addr(msg.header("To").ok_or("no To")?).map_err(|e| format!("To: {e}"))?;
        let call_id = msg.header("Call-ID").ok_or("no Call-ID")?.to_string();
        if call_id.is_empty() || call_id.len() > 256 {
            return Err("bad Call-ID".into());
        }
        let cseq = msg.header("CSeq").ok_or("no CSeq")?;
        let (n, m) = cseq.split_once(char::is_whitespace).ok_or("bad CSeq")?;
        let cseq: u32 = n.trim().parse().map_err(|_| "bad CSeq number")?;
        let cseq_method = m.trim().to_string();
        Ok(Request {
            method,
            uri,
            msg,
            vias,
            via,
            from,
            to,
            call_id,
            cseq,
            cseq_method,
        })
    }

    /// Checks what the core headers do not: the CSeq method, Max-Forwards,
    /// the Request-URI (run after [`Request::from_message`], whose result
    /// is answerable).
    pub fn check(&self) -> Result<SipUri, (u16, String)> {
        if self.cseq_method != self.method {
            return Err((400, "CSeq method differs from the request's".into()));
        }
        if let Some(mf) = self.msg.header("Max-Forwards") {
            match mf.trim().parse::<u32>() {
                Ok(0) if self.method != "ACK" && self.method != "OPTIONS" => {
                    return Err((483, "Too Many Hops".into()))
                }
                Ok(_) => {}
                Err(_) => return Err((400, "bad Max-Forwards".into())),
            }
        }
        SipUri::parse(&self.uri).map_err(|e| (416, format!("Request-URI: {e}")))
    }
}

/// Parses a datagram into a request: `Ok(None)` for a response or a
/// keep-alive (handled elsewhere or ignored).
pub fn parse_request(data: &[u8]) -> Result<Option<Request>, Refused> {
    if data.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(None);
    }
    let msg = match parse(data) {
        Ok(m) => m,
        Err(e) => {
            return Err(Refused {
                request: None,
                why: e.to_string(),
            })
        }
    };
    if matches!(msg.start, StartLine::Response { .. }) {
        return Ok(None);
    }
    Request::from_message(msg)
        .map(Some)
        .map_err(|why| Refused { request: None, why })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INVITE: &str = "INVITE sip:moshi@127.0.0.1:5060;seed=7 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1;rport\r\n\
        v: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK-0, SIP/2.0/TCP 10.0.0.2\r\n\
        Max-Forwards: 70\r\n\
        From: \"A, B\" <sip:a@127.0.0.1>;tag=abc\r\n\
        t: <sip:moshi@127.0.0.1>\r\n\
        i: call-1@127.0.0.1\r\n\
        CSeq: 1 INVITE\r\n\
        Subject: folded\r\n  over two lines\r\n\
        Content-Type: application/sdp\r\n\
        l: 4\r\n\r\nv=0\r\nEXTRA";

    #[test]
    fn reads_a_request() {
        let r = parse_request(INVITE.as_bytes()).unwrap().unwrap();
        assert_eq!(r.method, "INVITE");
        assert_eq!(r.vias.len(), 3);
        assert_eq!(r.via.branch, "z9hG4bK-1");
        assert_eq!(r.via.sent_by, "127.0.0.1:5061");
        assert_eq!(r.from.tag.as_deref(), Some("abc"));
        assert_eq!(r.from.uri, "sip:a@127.0.0.1");
        assert_eq!(r.to.tag, None);
        assert_eq!(r.call_id, "call-1@127.0.0.1");
        assert_eq!((r.cseq, r.cseq_method.as_str()), (1, "INVITE"));
        assert_eq!(r.msg.body, b"v=0\r");
        assert_eq!(r.msg.header("Subject"), Some("folded over two lines"));
        assert!(r.check().is_ok());
    }

    /// Hand-made malformed messages: each refused with a reason, none panics.
    #[test]
    fn malformed_table() {
        let cases: &[(&str, &str)] = &[
            ("INVITE sip:a SIP/2.0\r\n", "no end of head"),
            ("INVITE sip:a SIP/3.0\r\n\r\n", "version"),
            ("INVITE  sip:a SIP/2.0\r\n\r\n", "double space"),
            ("IN(VITE sip:a SIP/2.0\r\n\r\n", "bad method"),
            ("INVITE sip:a SIP/2.0\r\n folded-first: x\r\n\r\n", "folded first"),
            ("INVITE sip:a SIP/2.0\r\nNoColon\r\n\r\n", "no colon"),
            ("INVITE sip:a SIP/2.0\r\nBad Name: x\r\n\r\n", "bad name"),
            ("INVITE sip:a SIP/2.0\r\nContent-Length: 9\r\n\r\nabc", "short body"),
            ("INVITE sip:a SIP/2.0\r\nContent-Length: -1\r\n\r\n", "negative length"),
            ("INVITE sip:a SIP/2.0\r\nFrom: <sip:a>\r\n\r\n", "no Via"),
            ("INVITE sip:a SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z\r\n\r\n", "no From"),
            (
                "INVITE sip:a SIP/2.0\r\nVia: SIP/2.0/UDP h\r\nFrom: <sip:a\r\nTo: <sip:b>\r\nCall-ID: x\r\nCSeq: 1 INVITE\r\n\r\n",
                "unclosed <",
            ),
            (
                "INVITE sip:a SIP/2.0\r\nVia: SIP/2.0/UDP h\r\nFrom: <sip:a>\r\nTo: <sip:b>\r\nCall-ID: x\r\nCSeq: one INVITE\r\n\r\n",
                "bad CSeq",
            ),
            (
                "INVITE sip:a SIP/2.0\r\nVia: HTTP/1.1/UDP h\r\nFrom: <sip:a>\r\nTo: <sip:b>\r\nCall-ID: x\r\nCSeq: 1 INVITE\r\n\r\n",
                "bad Via",
            ),
            ("SIP/2.0 99 Odd\r\n\r\n", "bad status"),
            ("\u{0}\u{1}\u{2}\r\n\r\n", "binary"),
        ];
        for (text, what) in cases {
            match parse_request(text.as_bytes()) {
                Err(r) => assert!(!r.why.is_empty(), "{what}"),
                Ok(v) => panic!("{what}: accepted {v:?}"),
            }
        }
        // An empty datagram or CRLFs are keep-alives: nothing to answer.
        assert!(matches!(parse_request(b""), Ok(None)));
        assert!(matches!(parse_request(b"\r\n\r\n"), Ok(None)));
        let many_headers = format!(
            "OPTIONS sip:a SIP/2.0\r\n{}\r\n",
            "X-A: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(parse_request(many_headers.as_bytes()).is_err());
        let many_vias = format!(
            "OPTIONS sip:a SIP/2.0\r\nVia: {}\r\n\r\n",
            vec!["SIP/2.0/UDP h"; MAX_VIAS + 1].join(",")
        );
        assert!(parse_request(many_vias.as_bytes()).is_err());
    }

    /// Requests whose core headers are fine but something else is not:
    /// answerable, with the status the check gives.
    #[test]
    fn checks_give_statuses() {
        let base = |first: &str, cseq: &str, extra: &str| {
            format!("{first}\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKx\r\nFrom: <sip:a@h>;tag=1\r\nTo: <sip:b@h>\r\nCall-ID: c\r\nCSeq: {cseq}\r\n{extra}\r\n")
        };
        let check = |text: String| {
            parse_request(text.as_bytes())
                .unwrap()
                .unwrap()
                .check()
                .map(|_| ())
                .map_err(|e| e.0)
        };
        assert_eq!(check(base("INVITE sip:b@h SIP/2.0", "1 BYE", "")), Err(400));
        assert_eq!(
            check(base(
                "INVITE sip:b@h SIP/2.0",
                "1 INVITE",
                "Max-Forwards: 0\r\n"
            )),
            Err(483)
        );
        assert_eq!(
            check(base(
                "INVITE sip:b@h SIP/2.0",
                "1 INVITE",
                "Max-Forwards: x\r\n"
            )),
            Err(400)
        );
        assert_eq!(
            check(base("INVITE http://b SIP/2.0", "1 INVITE", "")),
            Err(416)
        );
        assert_eq!(
            check(base("INVITE sip:b@h SIP/2.0", "1 INVITE", "")),
            Ok(())
        );
    }
}
