//! SIP URIs (RFC 3261 §19.1): `sip:user;uparams@host:port;params?headers`,
//! read far enough to pick a call's session parameters — the user, and the
//! parameters of the user part and of the URI — with percent-escapes
//! decoded.
//!
//! Invariants: bounded by the message (no allocation beyond its size);
//! never panics (fuzzed through `fuzz/fuzz_targets/sip_message.rs`).

/// A parsed SIP or SIPS URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SipUri {
    /// `sip` or `sips`.
    pub scheme: String,
    /// The user (decoded), if any.
    pub user: Option<String>,
    /// `host[:port]`.
    pub host: String,
    /// Parameters of the user part and of the URI, in order (decoded;
    /// a parameter without `=` has an empty value).
    pub params: Vec<(String, String)>,
}

/// Why a URI was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// Not `sip:` or `sips:`.
    #[error("unsupported URI scheme (sip: or sips:)")]
    Scheme,
    /// No host.
    #[error("no host")]
    NoHost,
    /// A bad `%XX` escape.
    #[error("bad percent-escape")]
    Escape,
}

fn decode(s: &str) -> Result<String, UriError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or(UriError::Escape)?;
            let hex = std::str::from_utf8(hex).map_err(|_| UriError::Escape)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UriError::Escape)?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UriError::Escape)
}

fn push_params(out: &mut Vec<(String, String)>, s: &str) -> Result<(), UriError> {
    for p in s.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        out.push((decode(k)?, decode(v)?));
    }
    Ok(())
}

impl SipUri {
    /// Parses `uri`.
    pub fn parse(uri: &str) -> Result<SipUri, UriError> {
        let (scheme, rest) = uri.split_once(':').ok_or(UriError::Scheme)?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "sip" && scheme != "sips" {
            return Err(UriError::Scheme);
        }
        // Headers (`?…`) are not used.
        let rest = rest.split('?').next().unwrap_or("");
        let mut params = Vec::new();
        let (user, hostpart) = match rest.rfind('@') {
            Some(at) => {
                let userinfo = &rest[..at];
                // A password (`user:pw`) is ignored.
                let userinfo = userinfo.split(':').next().unwrap_or("");
                let (user, uparams) = userinfo.split_once(';').unwrap_or((userinfo, ""));
                push_params(&mut params, uparams)?;
                (Some(decode(user)?), &rest[at + 1..])
            }
            None => (None, rest),
        };
        let (host, uriparams) = hostpart.split_once(';').unwrap_or((hostpart, ""));
        if host.is_empty() {
            return Err(UriError::NoHost);
        }
        push_params(&mut params, uriparams)?;
        Ok(SipUri {
            scheme,
            user: user.filter(|u| !u.is_empty()),
            host: host.to_string(),
            params,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_users_and_params() {
        let u =
            SipUri::parse("sip:agent;seed=3@10.0.0.5:5060;text_temperature=0.5;transport=udp?x=y")
                .unwrap();
        assert_eq!(u.user.as_deref(), Some("agent"));
        assert_eq!(u.host, "10.0.0.5:5060");
        assert_eq!(
            u.params,
            vec![
                ("seed".into(), "3".into()),
                ("text_temperature".into(), "0.5".into()),
                ("transport".into(), "udp".into())
            ]
        );
        let u = SipUri::parse("SIPS:h;lr").unwrap();
        assert_eq!((u.user, u.params.len()), (None, 1));
        let u = SipUri::parse("sip:a%20b@h;condition.description=very%5Fgood").unwrap();
        assert_eq!(u.user.as_deref(), Some("a b"));
        assert_eq!(u.params[0].1, "very_good");
    }

    #[test]
    fn malformed_table() {
        for (uri, e) in [
            ("tel:+123", UriError::Scheme),
            ("nocolon", UriError::Scheme),
            ("sip:", UriError::NoHost),
            ("sip:a@", UriError::NoHost),
            ("sip:a@h;p=%zz", UriError::Escape),
            ("sip:a%2@h", UriError::Escape),
            ("sip:%ff%fe@h", UriError::Escape),
        ] {
            assert_eq!(SipUri::parse(uri), Err(e), "{uri}");
        }
    }
}
