//! Every key the configuration accepts, enumerated from the configuration's
//! own definitions: [`Config`]'s derived `Deserialize` is driven by a probe
//! deserializer that records, at each level, the field names serde declares
//! for the struct there (the very list `deny_unknown_fields` checks
//! against), and what each field takes — a value, one of a set of words, a
//! free map, or a section with keys of its own — and whether it may be
//! `null` or is a list. Nothing here is a hand-kept list: a field added to
//! any section is a key here at once (the documentation test then asks for
//! its row in `docs/configuration.md`).
//!
//! How the probe walks: one deserialization of `Config` per key path. Along
//! the path, each struct is given only the next key of the path, so the
//! derived code asks for that field's value; at the end of the path the
//! probe records what the derived code asks for (`deserialize_struct` with
//! its field names, `deserialize_enum` with its variants, a map, or a plain
//! value) and stops the deserialization with an error. `Option` is looked
//! through (nullable), a list's element is probed as the list (so the keys
//! of `sip.registrations` entries are `sip.registrations.registrar`, … as
//! the configuration's errors name them). A `#[serde(flatten)]` field would
//! show as a free map, its keys unlisted.
//!
//! Invariants: no value is ever produced, so no default, validation or
//! side effect of the configuration runs; the walk ends (a key path only
//! grows through struct fields, which are finite and non-recursive here).

use super::Config;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde::Deserializer;
use std::cell::RefCell;
use std::collections::VecDeque;

/// What a key takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// A number, string, boolean, address or path.
    Value,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// An object whose names are free (`{"name": "value"}`).
    Map,
    /// An object with keys of its own, listed as keys of their own.
    Section(&'static [&'static str]),
}

/// One key of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigKey {
    /// Dotted from the top (`listen.address`; the keys of a list's entries
    /// as `sip.registrations.registrar`).
    pub name: String,
    /// What it takes.
    pub kind: KeyKind,
    /// Whether `null` is accepted.
    pub nullable: bool,
    /// Whether it is a list of what `kind` says.
    pub list: bool,
}

/// Every key of [`Config`], sections included, parents before children.
pub fn config_keys() -> Vec<ConfigKey> {
    keys_of::<Config>()
}

/// Every key of `T`'s configuration (a `Deserialize` struct), sections
/// included, parents before children.
pub fn keys_of<T: DeserializeOwned>() -> Vec<ConfigKey> {
    let mut keys = Vec::new();
    let mut paths: VecDeque<Vec<&'static str>> = VecDeque::from([Vec::new()]);
    while let Some(path) = paths.pop_front() {
        let found = probe::<T>(&path);
        let Some(kind) = found.kind else {
            // The derived code asked for nothing at this path (a custom
            // `Deserialize` that failed before): say so in the listing.
            keys.push(ConfigKey {
                name: path.join("."),
                kind: KeyKind::Value,
                nullable: found.nullable,
                list: found.list,
            });
            continue;
        };
        if let KeyKind::Section(fields) = kind {
            paths.extend(fields.iter().map(|f| {
                let mut p = path.clone();
                p.push(f);
                p
            }));
        }
        if !path.is_empty() {
            keys.push(ConfigKey {
                name: path.join("."),
                kind,
                nullable: found.nullable,
                list: found.list,
            });
        }
    }
    keys
}

/// What the probe saw at the end of a path.
#[derive(Debug, Default)]
struct Found {
    kind: Option<KeyKind>,
    nullable: bool,
    list: bool,
}

/// Deserializes `T` along `path` and returns what was asked for at its end.
fn probe<T: DeserializeOwned>(path: &[&'static str]) -> Found {
    let found = RefCell::new(Found::default());
    // The probe always ends the deserialization with an error: the result
    // is what it recorded, not what `T` became.
    let _ = T::deserialize(Probe {
        path,
        depth: 0,
        found: &found,
    });
    found.into_inner()
}

/// The error that ends every probe.
fn stop() -> de::value::Error {
    de::Error::custom("probe: end of the key path")
}

/// The deserializer that walks one key path.
#[derive(Clone, Copy)]
struct Probe<'a> {
    path: &'a [&'static str],
    depth: usize,
    found: &'a RefCell<Found>,
}

impl Probe<'_> {
    fn at_end(&self) -> bool {
        self.depth == self.path.len()
    }

    /// Records `kind` when the path ends here, and stops.
    fn record<V>(self, kind: KeyKind) -> Result<V, de::value::Error> {
        if self.at_end() {
            self.found.borrow_mut().kind = Some(kind);
        }
        Err(stop())
    }
}

macro_rules! values {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            self.record(KeyKind::Value)
        }
    )*};
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    values!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if self.at_end() {
            self.found.borrow_mut().nullable = true;
        }
        visitor.visit_some(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if self.at_end() {
            self.found.borrow_mut().list = true;
        }
        visitor.visit_seq(OneElement(Some(self)))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _n: usize, _v: V) -> Result<V::Value, Self::Error> {
        self.record(KeyKind::Value)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _n: usize,
        _v: V,
    ) -> Result<V::Value, Self::Error> {
        self.record(KeyKind::Value)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _v: V,
    ) -> Result<V::Value, Self::Error> {
        self.record(KeyKind::Value)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_map<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        self.record(KeyKind::Map)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.record(KeyKind::Choice(variants))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        if self.at_end() {
            return self.record(KeyKind::Section(fields));
        }
        visitor.visit_map(OneKey {
            key: Some(self.path[self.depth]),
            value: Probe {
                depth: self.depth + 1,
                ..self
            },
        })
    }
}

/// A struct's content as the probe gives it: the one key the path goes on
/// with, then its value.
struct OneKey<'a> {
    key: Option<&'static str>,
    value: Probe<'a>,
}

impl<'de> MapAccess<'de> for OneKey<'_> {
    type Error = de::value::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        match self.key.take() {
            Some(key) => seed.deserialize(key.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        seed.deserialize(self.value)
    }
}

/// A list's content as the probe gives it: one element, probed as the list.
struct OneElement<'a>(Option<Probe<'a>>);

impl<'de> SeqAccess<'de> for OneElement<'_> {
    type Error = de::value::Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Self::Error> {
        match self.0.take() {
            Some(probe) => seed.deserialize(probe).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code)]
    enum Mode {
        Fast,
        Exact,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Entry {
        host: String,
        #[serde(default)]
        secret: Option<Inner>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        user: String,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    #[allow(dead_code)]
    struct Section {
        timeout_ms: u64,
        address: Option<std::net::SocketAddr>,
        mode: Option<Mode>,
        params: BTreeMap<String, String>,
        peers: Vec<std::net::IpAddr>,
        entries: Vec<Entry>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Top {
        #[serde(default)]
        section: Section,
        #[serde(rename = "renamed_key")]
        field: bool,
    }

    fn key(name: &str, kind: KeyKind, nullable: bool, list: bool) -> ConfigKey {
        ConfigKey {
            name: name.into(),
            kind,
            nullable,
            list,
        }
    }

    #[test]
    fn every_shape_of_key_is_found() {
        let keys = keys_of::<Top>();
        let s = &[
            "timeout_ms",
            "address",
            "mode",
            "params",
            "peers",
            "entries",
        ];
        let want = vec![
            key("section", KeyKind::Section(s), false, false),
            key("renamed_key", KeyKind::Value, false, false),
            key("section.timeout_ms", KeyKind::Value, false, false),
            key("section.address", KeyKind::Value, true, false),
            key(
                "section.mode",
                KeyKind::Choice(&["fast", "exact"]),
                true,
                false,
            ),
            key("section.params", KeyKind::Map, false, false),
            key("section.peers", KeyKind::Value, false, true),
            key(
                "section.entries",
                KeyKind::Section(&["host", "secret"]),
                false,
                true,
            ),
            key("section.entries.host", KeyKind::Value, false, false),
            key(
                "section.entries.secret",
                KeyKind::Section(&["user"]),
                true,
                false,
            ),
            key("section.entries.secret.user", KeyKind::Value, false, false),
        ];
        assert_eq!(keys, want);
    }

    #[test]
    fn the_daemon_configuration_is_enumerated() {
        let keys = config_keys();
        let named = |n: &str| keys.iter().find(|k| k.name == n).cloned();
        assert_eq!(
            named("model.backend").map(|k| k.kind),
            Some(KeyKind::Choice(&["auto", "cpu", "cuda", "emu"]))
        );
        assert!(named("listen.token").is_some_and(|k| k.nullable));
        assert!(named("sip.registrations.expires_s").is_some());
        assert!(named("sip.auth.credentials").is_some_and(|k| k.kind == KeyKind::Map));
        assert!(named("engine.phase_groups").is_some_and(|k| k.kind == KeyKind::Value));
        assert!(named("model.cuda").is_some_and(|k| matches!(k.kind, KeyKind::Section(_))));
        assert!(keys.len() > 100, "{} keys", keys.len());
    }
}
