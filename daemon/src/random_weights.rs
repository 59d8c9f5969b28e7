//! `--random-weights SHAPE` (`model.random_weights`): serving a published
//! model's shape with random weights made at load, to measure the daemon at
//! full size without a 15 GB download.
//!
//! The shapes ([`SHAPES`]): the published Moshi 7B, Hibiki 2B, Hibiki 1B and
//! Hibiki-Zero 3B ([`moshid_kernels::shapes`], the ones gpu-bench times),
//! and `moshi-tiny`, the demo checkpoint's shape, which serves anywhere (for
//! tests).
//!
//! How it loads: the shape is written as a checkpoint folder under the
//! cache folder — header-only for the full-size shapes
//! ([`moshid_model::header_only`]: every tensor's name and shape, no data,
//! a few kilobytes of disk), the demo checkpoint for `moshi-tiny` — so that
//! from there the start-up is a real checkpoint's: header validation, the
//! preflight (memory plan, slots, speed), the description. Only the weights
//! differ: on a GPU (and the emulated one) they are generated on the device
//! by the fill kernel from a seeded generator ([`GpuModel::random`], the
//! model gpu-bench times, with its seed), after which the device path is a
//! checkpoint's (KV allocation, buckets, graphs); the CPU backend reads the
//! tiny shape's written weights, and refuses a full-size shape in words
//! after the preflight's own verdict (its folder has no weights to read).
//!
//! Invariant: a daemon serving random weights says so wherever a user
//! looks: the log, the `ready` line, `GET /v1/model` (`random_weights`)
//! and the page.
//!
//! [`GpuModel::random`]: moshid_kernels::model::GpuModel::random

use anyhow::{bail, Context, Result};
use moshid_model::checkpoint::CheckpointDir;
use moshid_model::config::MimiConfig;
use std::path::{Path, PathBuf};

/// The seed of the weights (gpu-bench's, so that its step times are this
/// model's).
pub const SEED: u64 = moshid_kernels::shapes::RANDOM_SEED;

/// Version of the written folders; bump when their layout changes.
const FOLDER_VERSION: u32 = 1;

/// A shape that can be served with random weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomShape {
    /// Its name on the command line and in `model.random_weights`.
    pub name: &'static str,
    /// Other spellings accepted (gpu-bench's names).
    pub aliases: &'static [&'static str],
    /// Its name in [`moshid_kernels::shapes`]; `None` for the tiny shape.
    kernels_name: Option<&'static str>,
}

impl RandomShape {
    /// A published model's size (the CPU backend does not make these).
    pub fn full_size(&self) -> bool {
        self.kernels_name.is_some()
    }

    /// What the log, the `ready` line and the page say of it.
    pub fn marker(&self) -> String {
        format!(
            "RANDOM WEIGHTS ({}): no speech, no meaning; for measuring",
            self.name
        )
    }
}

/// Every shape, full-size ones first.
pub const SHAPES: &[RandomShape] = &[
    RandomShape {
        name: "moshi-7b",
        aliases: &["moshi7b"],
        kernels_name: Some("moshi7b"),
    },
    RandomShape {
        name: "hibiki-2b",
        aliases: &["hibiki2b"],
        kernels_name: Some("hibiki2b"),
    },
    RandomShape {
        name: "hibiki-1b",
        aliases: &["hibiki1b"],
        kernels_name: Some("hibiki1b"),
    },
    RandomShape {
        name: "hibiki-zero-3b",
        aliases: &["hibikizero3b"],
        kernels_name: Some("hibiki-zero-3b"),
    },
    RandomShape {
        name: "moshi-tiny",
        aliases: &["demo"],
        kernels_name: None,
    },
];

/// The shape called `name` (or an alias), or why there is none.
pub fn resolve(name: &str) -> Result<&'static RandomShape, String> {
    SHAPES
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name))
        .ok_or_else(|| {
            format!(
                "unknown shape `{name}`; the shapes are {}",
                SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            )
        })
}

/// The checkpoint folder of `shape` under `cache` (written on first use).
pub fn prepare(shape: &RandomShape, cache: &Path) -> Result<CheckpointDir> {
    let Some(kname) = shape.kernels_name else {
        return moshid_model::demo::ensure_demo(cache)
            .with_context(|| format!("writing the demo checkpoint under {}", cache.display()));
    };
    let dir = cache
        .join("random-weights")
        .join(format!("{}-v{FOLDER_VERSION}", shape.name));
    if let Ok(d) = CheckpointDir::open(&dir) {
        if d.check().is_ok() {
            return Ok(d);
        }
    }
    write_header_only(kname, &dir)
        .with_context(|| format!("writing the {} shape under {}", shape.name, dir.display()))?;
    let d = CheckpointDir::open(&dir)?;
    d.check()?;
    Ok(d)
}

/// Writes the header-only folder beside `dir` and renames it into place,
/// so a reader never sees half of one (another process that placed it
/// first wins: one shape always writes the same bytes).
fn write_header_only(kname: &str, dir: &Path) -> Result<()> {
    let lm = moshid_kernels::shapes::lm_config(kname).context("a built-in shape")?;
    let config = moshid_kernels::shapes::config_json(kname);
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let sibling = |what: &str| -> PathBuf {
        let name = dir
            .file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy());
        parent.join(format!(".{name}.{what}-{}", std::process::id()))
    };
    let tmp = sibling("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    moshid_model::header_only::write_published_dir(
        &tmp,
        &lm,
        &MimiConfig::mimi_default(),
        config.as_ref(),
        None,
    )?;
    let aside = sibling("old");
    if dir.exists() {
        let _ = std::fs::rename(dir, &aside);
    }
    let placed = std::fs::rename(&tmp, dir);
    let _ = std::fs::remove_dir_all(&aside);
    if placed.is_err() && CheckpointDir::open(dir).is_ok() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    placed?;
    Ok(())
}

/// The CPU backend's refusal of a full-size shape (after its preflight
/// found room and speed, which on most machines it does not).
pub fn cpu_refusal(shape: &RandomShape) -> anyhow::Error {
    anyhow::anyhow!(
        "random weights at the full size of {} are generated on a GPU only: use \
         `--backend cuda` on a machine with an NVIDIA GPU (the CPU backend serves the tiny \
         random shape, `--random-weights moshi-tiny`)",
        shape.name
    )
}

/// Checks `model.random_weights` (for the config's validation).
pub fn check_name(name: &str) -> Result<()> {
    match resolve(name) {
        Ok(_) => Ok(()),
        Err(e) => bail!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_resolve_and_unknown_ones_are_listed() {
        assert_eq!(resolve("moshi-7b").unwrap().name, "moshi-7b");
        assert_eq!(resolve("hibiki2b").unwrap().name, "hibiki-2b");
        assert_eq!(resolve("demo").unwrap().name, "moshi-tiny");
        assert!(!resolve("moshi-tiny").unwrap().full_size());
        let e = resolve("gpt-4").unwrap_err();
        assert!(
            e.contains("gpt-4") && e.contains("moshi-7b, hibiki-2b"),
            "{e}"
        );
        for s in SHAPES.iter().filter(|s| s.full_size()) {
            let k = s.kernels_name.unwrap();
            assert!(moshid_kernels::shapes::lm_config(k).is_some(), "{k}");
        }
    }

    #[test]
    fn a_full_size_shape_is_a_header_only_checkpoint_written_once() {
        let t = tempfile::tempdir().unwrap();
        let d = prepare(resolve("hibiki-zero-3b").unwrap(), t.path()).unwrap();
        assert_eq!((d.lm.dim, d.lm.num_layers, d.lm.kv_repeat), (2048, 28, 2));
        // Holes, not data: the 6 GB of weights cost no disk.
        let len = std::fs::metadata(&d.lm_weights).unwrap().len();
        assert!(len > 5_000_000_000, "{len}");
        use std::os::unix::fs::MetadataExt;
        let blocks = std::fs::metadata(&d.lm_weights).unwrap().blocks();
        assert!(blocks * 512 < 50_000_000, "{blocks} blocks");
        let again = prepare(resolve("hibiki-zero-3b").unwrap(), t.path()).unwrap();
        assert_eq!(again.dir, d.dir);
        // Moshi 7B ships no config.json: the built-in one is read back.
        let m = prepare(resolve("moshi-7b").unwrap(), t.path()).unwrap();
        assert_eq!((m.lm.dim, m.lm.context), (4096, 3000));
    }

    #[test]
    fn the_tiny_shape_is_the_demo_checkpoint() {
        let t = tempfile::tempdir().unwrap();
        let d = prepare(resolve("moshi-tiny").unwrap(), t.path()).unwrap();
        assert!(d
            .dir
            .ends_with(format!("demo-v{}", moshid_model::demo::DEMO_VERSION)));
    }
}
