//! Session parameters from a query string or a JSON body: temperatures,
//! top-k, seed, guidance and conditions, validated against the model before
//! a slot is taken.
//!
//! Unknown query keys are ignored (Kyutai's clients send keys of their own,
//! such as `worker_auth_id` or `email`), but a known key with a bad value,
//! or one the model cannot honour, is refused with a message naming it.
//! Kyutai's text keys (`pad_mult`, `repetition_penalty`,
//! `repetition_penalty_context`) follow their Rust server (see
//! `moshid_model::lm::text_rules`); a penalty given without a context uses
//! the configured context (32, the one Kyutai's server reports), where
//! Kyutai's server would drop it. They are refused with guidance on.

use crate::config::GenDefaults;
use moshid_model::lm::GenParams;
use moshid_model::streaming::SessionParams;

/// What the daemon knows of the model's conditioning.
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    /// `(conditioner, possible values)`.
    pub conditioners: Vec<(String, Vec<String>)>,
    /// Whether the model is Hibiki-shaped (translation).
    pub is_hibiki: bool,
    /// For models that must be drained at the end of input (Hibiki): the
    /// text token that ends the stream.
    pub drain_text_eos: Option<u32>,
    /// For models that take prompts (PersonaPlex): how to resolve them.
    pub prompts: Option<std::sync::Arc<super::prompt::PromptSetup>>,
}

/// A parameter the session cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parameter `{key}`: {why}")]
pub struct ParamError {
    /// The key.
    pub key: String,
    /// What is wrong.
    pub why: String,
}

fn err(key: &str, why: impl Into<String>) -> ParamError {
    ParamError {
        key: key.to_string(),
        why: why.into(),
    }
}

fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, ParamError> {
    v.trim()
        .parse()
        .map_err(|_| err(key, format!("`{v}` is not a valid number")))
}

fn temperature(key: &str, v: &str) -> Result<f32, ParamError> {
    let t: f32 = num(key, v)?;
    if !(0.0..=10.0).contains(&t) {
        return Err(err(key, "must be between 0 and 10"));
    }
    Ok(t)
}

fn topk(key: &str, v: &str) -> Result<usize, ParamError> {
    let k: usize = num(key, v)?;
    if k == 0 || k > 1_000_000 {
        return Err(err(key, "must be between 1 and 1000000"));
    }
    Ok(k)
}

/// Builds session parameters from `(key, value)` pairs over the defaults.
///
/// Keys: `text_temperature`, `text_topk`, `audio_temperature`, `audio_topk`,
/// `seed` (aliases `text_seed`, `audio_seed`), `greedy` (`true`/`false`),
/// `cfg_coef`, `condition.NAME=VALUE` and `null_condition.NAME=VALUE`.
pub fn session_params(
    pairs: &[(String, String)],
    defaults: &GenDefaults,
    model: &ModelInfo,
) -> Result<SessionParams, ParamError> {
    let mut read = ParamsBuilder::new(defaults);
    for (k, v) in pairs {
        read.apply(k, v, model)?;
    }
    read.finish(model)
}

/// What `session_params` has read so far: the generation parameters, and
/// what the checks after the last pair need (they depend on several keys,
/// whatever their order).
struct ParamsBuilder {
    g: GenParams,
    /// Whether a seed was given (else a fresh one is drawn).
    seeded: bool,
    penalty: f32,
    context: usize,
    /// The first text-rule key given, named when the rules conflict with
    /// classifier-free guidance.
    rule_key: Option<&'static str>,
}

impl ParamsBuilder {
    /// The defaults, before any pair.
    fn new(defaults: &GenDefaults) -> Self {
        ParamsBuilder {
            g: GenParams {
                use_sampling: true,
                temp: defaults.audio_temperature,
                temp_text: defaults.text_temperature,
                top_k: defaults.audio_topk,
                top_k_text: defaults.text_topk,
                seed: 0,
                cfg_coef: defaults.cfg_coef,
                conditions: Vec::new(),
                null_conditions: Vec::new(),
                pad_mult: defaults.pad_mult,
                repetition_penalty: None,
            },
            seeded: false,
            penalty: defaults.repetition_penalty,
            context: defaults.repetition_penalty_context,
            rule_key: None,
        }
    }

    /// Reads one pair; an unknown key is ignored.
    fn apply(&mut self, k: &str, v: &str, model: &ModelInfo) -> Result<(), ParamError> {
        match k {
            "text_temperature" => self.g.temp_text = temperature(k, v)?,
            "audio_temperature" => self.g.temp = temperature(k, v)?,
            "text_topk" => self.g.top_k_text = topk(k, v)?,
            "audio_topk" => self.g.top_k = topk(k, v)?,
            "seed" | "text_seed" | "audio_seed" => {
                // Kyutai's web client sends seeds as (possibly negative) integers.
                let s: i64 = num(k, v)?;
                self.g.seed = s as u64;
                self.seeded = true;
            }
            "greedy" => {
                self.g.use_sampling = match v {
                    "true" | "1" => false,
                    "false" | "0" => true,
                    _ => return Err(err(k, "must be true or false")),
                }
            }
            "pad_mult" => {
                let m: f32 = num(k, v)?;
                if !(-10.0..=10.0).contains(&m) {
                    return Err(err(k, "must be between -10 and 10"));
                }
                self.g.pad_mult = m;
                self.rule_key = self.rule_key.or(Some("pad_mult"));
            }
            "repetition_penalty" => {
                let p: f32 = num(k, v)?;
                if !(0.1..=10.0).contains(&p) {
                    return Err(err(k, "must be between 0.1 and 10"));
                }
                self.penalty = p;
                self.rule_key = self.rule_key.or(Some("repetition_penalty"));
            }
            "repetition_penalty_context" => {
                let c: usize = num(k, v)?;
                let max = moshid_model::lm::text_rules::MAX_REPETITION_CONTEXT;
                if c == 0 || c > max {
                    return Err(err(k, format!("must be between 1 and {max}")));
                }
                self.context = c;
            }
            "cfg_coef" => {
                let c: f32 = num(k, v)?;
                if !(0.0..=100.0).contains(&c) {
                    return Err(err(k, "must be between 0 and 100"));
                }
                self.g.cfg_coef = c;
            }
            _ => {
                if let Some(name) = k.strip_prefix("condition.") {
                    check_condition(k, name, v, model)?;
                    self.g.conditions.push((name.to_string(), v.to_string()));
                } else if let Some(name) = k.strip_prefix("null_condition.") {
                    check_condition(k, name, v, model)?;
                    self.g
                        .null_conditions
                        .push((name.to_string(), v.to_string()));
                }
                // Anything else belongs to some client's own protocol: ignored.
            }
        }
        Ok(())
    }

    /// The checks that span keys, then the parameters.
    fn finish(mut self, model: &ModelInfo) -> Result<SessionParams, ParamError> {
        if self.g.cfg_coef != 1.0 && model.conditioners.is_empty() {
            return Err(err(
                "cfg_coef",
                "this model has no conditioners to guide with",
            ));
        }
        if self.penalty != 1.0 {
            self.g.repetition_penalty = Some((self.context, self.penalty));
        }
        let rules_on = self.g.pad_mult != 0.0 || self.g.repetition_penalty.is_some();
        if rules_on && self.g.cfg_coef != 1.0 {
            return Err(err(
                self.rule_key.unwrap_or("pad_mult"),
                "cannot be honoured with classifier-free guidance (cfg_coef)",
            ));
        }
        if !self.seeded {
            // An unseeded session still gets its own stream of random numbers.
            self.g.seed = fresh_seed();
        }
        Ok(SessionParams {
            gen: self.g,
            ..SessionParams::default()
        })
    }
}

fn check_condition(
    key: &str,
    name: &str,
    value: &str,
    model: &ModelInfo,
) -> Result<(), ParamError> {
    let Some((_, values)) = model.conditioners.iter().find(|(n, _)| n == name) else {
        return Err(err(key, format!("the model has no conditioner `{name}`")));
    };
    if !values.iter().any(|v| v == value) {
        return Err(err(key, format!("`{value}` is not one of {values:?}")));
    }
    Ok(())
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kyutai_text_keys() {
        let d = GenDefaults::default();
        let p = session_params(
            &pairs(&[
                ("pad_mult", "1.5"),
                ("repetition_penalty", "1.3"),
                ("repetition_penalty_context", "64"),
            ]),
            &d,
            &ModelInfo::default(),
        )
        .unwrap();
        assert_eq!(p.gen.pad_mult, 1.5);
        assert_eq!(p.gen.repetition_penalty, Some((64, 1.3)));
        let p = session_params(
            &pairs(&[("repetition_penalty", "2")]),
            &d,
            &ModelInfo::default(),
        )
        .unwrap();
        assert_eq!(p.gen.repetition_penalty, Some((32, 2.0)));
        let p = session_params(
            &pairs(&[("repetition_penalty", "1")]),
            &d,
            &ModelInfo::default(),
        )
        .unwrap();
        assert_eq!(p.gen.repetition_penalty, None);
        for (k, v) in [
            ("pad_mult", "nan"),
            ("pad_mult", "11"),
            ("repetition_penalty", "0"),
            ("repetition_penalty_context", "0"),
            ("repetition_penalty_context", "100000"),
        ] {
            let e = session_params(&pairs(&[(k, v)]), &d, &ModelInfo::default()).unwrap_err();
            assert_eq!(e.key, k, "{k}={v}");
        }
        // Known keys the model cannot honour: refused, naming the key.
        let e = session_params(
            &pairs(&[("cfg_coef", "3"), ("repetition_penalty", "1.2")]),
            &d,
            &hibiki(),
        )
        .unwrap_err();
        assert_eq!(e.key, "repetition_penalty");
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn hibiki() -> ModelInfo {
        ModelInfo {
            conditioners: vec![(
                "description".into(),
                vec!["very_good".into(), "very_bad".into()],
            )],
            is_hibiki: true,
            drain_text_eos: Some(2),
            prompts: None,
        }
    }

    #[test]
    fn defaults_then_overrides() {
        let d = GenDefaults::default();
        let p = session_params(
            &pairs(&[
                ("text_temperature", "0.5"),
                ("audio_topk", "100"),
                ("seed", "-3"),
                ("worker_auth_id", "1"),
            ]),
            &d,
            &ModelInfo::default(),
        )
        .unwrap();
        assert_eq!(p.gen.temp_text, 0.5);
        assert_eq!(p.gen.top_k, 100);
        assert_eq!(p.gen.top_k_text, 25);
        assert_eq!(p.gen.seed, (-3i64) as u64);
    }

    #[test]
    fn bad_values_name_the_key() {
        let d = GenDefaults::default();
        let e = session_params(&pairs(&[("text_topk", "many")]), &d, &ModelInfo::default())
            .unwrap_err();
        assert_eq!(e.key, "text_topk");
        let e = session_params(
            &pairs(&[("audio_temperature", "-1")]),
            &d,
            &ModelInfo::default(),
        )
        .unwrap_err();
        assert_eq!(e.key, "audio_temperature");
        let e =
            session_params(&pairs(&[("cfg_coef", "3")]), &d, &ModelInfo::default()).unwrap_err();
        assert_eq!(e.key, "cfg_coef");
    }

    #[test]
    fn conditions_are_checked_against_the_model() {
        let d = GenDefaults::default();
        let p = session_params(
            &pairs(&[
                ("condition.description", "very_good"),
                ("null_condition.description", "very_bad"),
                ("cfg_coef", "3"),
            ]),
            &d,
            &hibiki(),
        )
        .unwrap();
        assert_eq!(
            p.gen.conditions,
            vec![("description".to_string(), "very_good".to_string())]
        );
        let e =
            session_params(&pairs(&[("condition.description", "meh")]), &d, &hibiki()).unwrap_err();
        assert!(e.to_string().contains("meh"));
        let e = session_params(&pairs(&[("condition.mood", "x")]), &d, &hibiki()).unwrap_err();
        assert!(e.to_string().contains("mood"));
    }
}
