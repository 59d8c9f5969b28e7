//! What a SIP call gets: its session parameters, from `sip.params`, then
//! the `sip.users` entry of the Request-URI's user, then the Request-URI's
//! own parameters (user part and URI: `sip:agent;seed=7@host` or
//! `sip:agent@host;text_temperature=0.5`) — later ones win. Names the
//! model does not know are ignored, as in a chat query (`transport`, `lr`,
//! `user` and the like are URI parameters, not session ones).

use crate::config::sip::SipConfig;
use moshid_telephony::sip::uri::SipUri;

/// Why a call's parameters were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamsError {
    /// `sip.users` is set and has no entry for this user (404).
    UnknownUser(String),
}

/// The `(name, value)` pairs for `uri` (checked by the session's parser).
pub fn pairs_for(cfg: &SipConfig, uri: &SipUri) -> Result<Vec<(String, String)>, ParamsError> {
    let mut pairs: Vec<(String, String)> = cfg
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !cfg.users.is_empty() {
        let user = uri.user.clone().unwrap_or_default();
        let entry = cfg.users.get(&user).ok_or(ParamsError::UnknownUser(user))?;
        pairs.extend(entry.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    pairs.extend(uri.params.iter().cloned());
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_sources_win_and_users_gate() {
        let mut cfg = SipConfig::default();
        cfg.params.insert("seed".into(), "1".into());
        let uri = SipUri::parse("sip:agent;seed=3@h;text_temperature=0.5").unwrap();
        let p = pairs_for(&cfg, &uri).unwrap();
        assert_eq!(
            p.last().unwrap(),
            &("text_temperature".into(), "0.5".into())
        );
        assert_eq!(p.iter().rev().find(|(k, _)| k == "seed").unwrap().1, "3");
        cfg.users.insert(
            "agent".into(),
            [("seed".to_string(), "9".to_string())].into(),
        );
        let p = pairs_for(&cfg, &SipUri::parse("sip:agent@h").unwrap()).unwrap();
        assert_eq!(p.last().unwrap().1, "9");
        assert_eq!(
            pairs_for(&cfg, &SipUri::parse("sip:other@h").unwrap()),
            Err(ParamsError::UnknownUser("other".into()))
        );
    }
}
