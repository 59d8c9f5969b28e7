//! Looking up a SIP host name (a registrar's, a called URI's) without
//! blocking the I/O core: the system resolver runs on the core's blocking
//! thread (glommio's `spawn_blocking`), and an IP literal needs no lookup.
//!
//! Plain A/AAAA records (IPv4 first, as the SIP addresses here are); SIP's
//! own DNS procedures (RFC 3263: NAPTR, SRV) are not followed — see
//! docs/sip.md, "Not done".

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// `host:port` as a socket address.
pub async fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if host.is_empty() || host.len() > 253 {
        return Err(format!("`{host}` is not a host name"));
    }
    let name = host.to_string();
    let found = glommio::executor()
        .spawn_blocking(move || {
            (name.as_str(), port)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>())
        })
        .await;
    let addrs = found.map_err(|e| format!("cannot resolve `{host}`: {e}"))?;
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("`{host}` has no address"))
}
