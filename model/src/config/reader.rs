//! The strict JSON reader behind every config: an object read key by key,
//! whose `finish` refuses any key that was not read.
//!
//! Invariants: an explicit `null` reads as an absent key (and still counts as
//! read); every error names the key with its dotted path from the root.

use super::{bad, ConfigError};
use serde_json::{Map, Value};

pub(super) fn obj<'a>(v: &'a Value, key: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    v.as_object().ok_or_else(|| bad(key, "expected an object"))
}

/// A JSON object read key by key; `finish` refuses what was not read.
pub(super) struct Reader<'a> {
    prefix: String,
    map: &'a Map<String, Value>,
    seen: Vec<&'a str>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(prefix: &str, map: &'a Map<String, Value>) -> Self {
        Reader {
            prefix: prefix.to_string(),
            map,
            seen: Vec::new(),
        }
    }

    pub(super) fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    pub(super) fn get(&mut self, k: &str) -> Option<&'a Value> {
        let (name, v) = self.map.get_key_value(k)?;
        self.seen.push(name.as_str());
        if v.is_null() {
            None
        } else {
            Some(v)
        }
    }

    pub(super) fn req(&mut self, k: &str) -> Result<&'a Value, ConfigError> {
        self.get(k)
            .ok_or_else(|| ConfigError::MissingKey(self.key(k)))
    }

    pub(super) fn usize(&mut self, k: &str) -> Result<usize, ConfigError> {
        let key = self.key(k);
        self.req(k)?
            .as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| bad(&key, "expected a non-negative integer"))
    }

    pub(super) fn opt_usize(&mut self, k: &str) -> Result<Option<usize>, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| bad(&key, "expected a non-negative integer")),
        }
    }

    pub(super) fn f64(&mut self, k: &str) -> Result<f64, ConfigError> {
        let key = self.key(k);
        self.req(k)?
            .as_f64()
            .ok_or_else(|| bad(&key, "expected a number"))
    }

    pub(super) fn opt_f64(&mut self, k: &str) -> Result<Option<f64>, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(&key, "expected a number")),
        }
    }

    pub(super) fn bool_or(&mut self, k: &str, default: bool) -> Result<bool, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad(&key, "expected true or false")),
        }
    }

    pub(super) fn str_or(&mut self, k: &str, default: &str) -> Result<String, ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(default.to_string()),
            Some(v) => v
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(&key, "expected a string")),
        }
    }

    pub(super) fn usize_list(&mut self, k: &str) -> Result<Option<Vec<usize>>, ConfigError> {
        let key = self.key(k);
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| bad(&key, "expected a list of integers"))?;
        arr.iter()
            .map(|x| {
                x.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(&key, "expected a list of non-negative integers"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A key that must hold its default value (the computation depends on it).
    pub(super) fn expect(
        &mut self,
        k: &str,
        ok: impl Fn(&Value) -> bool,
        what: &str,
    ) -> Result<(), ConfigError> {
        let key = self.key(k);
        match self.get(k) {
            None => Ok(()),
            Some(v) if ok(v) => Ok(()),
            Some(v) => Err(bad(&key, format!("only {what} is supported, got {v}"))),
        }
    }

    pub(super) fn skip(&mut self, k: &str) {
        let _ = self.get(k);
    }

    pub(super) fn finish(self) -> Result<(), ConfigError> {
        for k in self.map.keys() {
            if !self.seen.contains(&k.as_str()) {
                return Err(ConfigError::UnknownKey(self.key(k)));
            }
        }
        Ok(())
    }
}

pub(super) fn is_false(v: &Value) -> bool {
    v.as_bool() == Some(false)
}

pub(super) fn is_zero(v: &Value) -> bool {
    v.as_u64() == Some(0)
}
