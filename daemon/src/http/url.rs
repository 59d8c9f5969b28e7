//! A checked `http://` or `https://` URL: what a webhook may be sent to
//! (`session.webhook_url`, or a URL a session names at its creation).
//!
//! Invariants: a [`WebhookUrl`] has a scheme of `http` or `https`, a
//! non-empty host and no credentials, and is at most [`MAX_URL_BYTES`] long.

/// Longest URL accepted.
pub const MAX_URL_BYTES: usize = 2048;

/// A checked `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    /// As given.
    pub text: String,
    pub(crate) https: bool,
    /// Host as written in the URL (IPv6 in brackets): the `Host` header.
    pub(crate) host_header: String,
    /// Host to resolve or connect to (no brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Path and query (`/` when empty).
    pub(crate) target: String,
}

impl WebhookUrl {
    /// Parses and checks a webhook URL (the error says what is wrong).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_URL_BYTES {
            return Err(format!("a URL of at most {MAX_URL_BYTES} bytes"));
        }
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("`{text}` is not an http:// or https:// URL")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("`{text}` has no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "`{text}`: credentials in the URL are not supported"
            ));
        }
        let host_header = authority.host().to_string();
        let host = host_header
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if host.is_empty() {
            return Err(format!("`{text}` has no host"));
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host_header = match authority.port_u16() {
            Some(p) => format!("{host_header}:{p}"),
            None => host_header,
        };
        let target = uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string());
        let target = if target.is_empty() {
            "/".to_string()
        } else {
            target
        };
        Ok(WebhookUrl {
            text: text.to_string(),
            https,
            host_header,
            host,
            port,
            target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let u = WebhookUrl::parse("https://hooks.example.com/a/b?x=1").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.target.as_str()),
            (true, "hooks.example.com", 443, "/a/b?x=1")
        );
        let u = WebhookUrl::parse("http://[::1]:8080").unwrap();
        assert_eq!(
            (
                u.host.as_str(),
                u.host_header.as_str(),
                u.port,
                u.target.as_str()
            ),
            ("::1", "[::1]:8080", 8080, "/")
        );
        for bad in [
            "ftp://x/",
            "hooks.example.com/x",
            "http://user:pw@x/",
            "/relative",
            "",
        ] {
            assert!(WebhookUrl::parse(bad).is_err(), "{bad}");
        }
        assert!(WebhookUrl::parse(&format!("http://x/{}", "a".repeat(3000))).is_err());
    }
}
