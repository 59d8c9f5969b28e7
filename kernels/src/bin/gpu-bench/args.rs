//! gpu-bench's command line: what to time, on which device, where to write.

use moshid_kernels::plan::KvDtype;
use moshid_kernels::shapes;
use std::path::{Path, PathBuf};

const USAGE: &str =
    "usage: gpu-bench [--model moshi7b|hibiki2b|hibiki1b|hibiki-zero-3b|DIR] [--batch 1,8,32,64,128] [--steps 200] \
[--warmup 10] [--graphs on|off|both] [--out DIR] [--kv bf16|fp8] [--context N[,N...]] \
[--precision bf16|f32] [--cfg COEF] [--device N|emu] [--reserve-gib G] [--ptx-cache DIR] \
[--full-context on|off] [--profile] [--profile-steps 20] [--json FILE]";

/// Where the steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceChoice {
    /// CUDA device N.
    Cuda(usize),
    /// The host emulator of the kernels: checks the bench itself (its
    /// timings say nothing of a GPU).
    Emulator,
}

/// What to time and how.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    /// A built-in shape (`shapes::MODELS`) or a checkpoint folder whose
    /// configurations give the shape (its weights are not read).
    pub(crate) model: String,
    pub(crate) batches: Vec<usize>,
    pub(crate) steps: usize,
    pub(crate) warmup: usize,
    pub(crate) graphs: Vec<bool>,
    pub(crate) out: PathBuf,
    pub(crate) kv: KvDtype,
    /// Contexts to time in turn (a sweep); empty: the model's own.
    pub(crate) contexts: Vec<usize>,
    /// f32 weights (`--precision f32`) instead of bf16.
    pub(crate) f32_weights: bool,
    pub(crate) cfg: Option<f32>,
    pub(crate) device: DeviceChoice,
    pub(crate) reserve: u64,
    pub(crate) ptx_cache: PathBuf,
    /// Attention over the whole context in every timed step.
    pub(crate) full_context: bool,
    /// Profile every measured batch (`profile.rs`).
    pub(crate) profile: bool,
    /// Steps gathered per profile mode.
    pub(crate) profile_steps: usize,
    /// Where the profile's JSON goes (its markdown beside it, `.md`);
    /// default: `--out`/gpu-profile-MODEL-kvKV.json.
    pub(crate) json: Option<PathBuf>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            model: "moshi7b".into(),
            batches: vec![1, 8, 32, 64, 128],
            steps: 200,
            warmup: 10,
            graphs: vec![true],
            out: PathBuf::from("bench/results"),
            kv: KvDtype::Bf16,
            contexts: Vec::new(),
            f32_weights: false,
            cfg: None,
            device: DeviceChoice::Cuda(0),
            reserve: 2 << 30,
            ptx_cache: PathBuf::from("target/ptx-cache"),
            full_context: true,
            profile: false,
            profile_steps: 20,
            json: None,
        }
    }
}

/// Parses the arguments (without the program name).
pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args::default();
    let num = |flag: &str, v: &str| -> Result<usize, String> {
        v.parse::<usize>()
            .map_err(|_| format!("{flag}: `{v}` is not a number"))
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        if flag == "--profile" {
            a.profile = true;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--model" => {
                if !shapes::MODELS.contains(&v.as_str()) && !Path::new(&v).is_dir() {
                    return Err(format!(
                        "--model: `{v}` is neither one of {:?} nor a folder",
                        shapes::MODELS
                    ));
                }
                a.model = v;
            }
            "--batch" => {
                let mut b = v
                    .split(',')
                    .map(|s| num("--batch", s.trim()))
                    .collect::<Result<Vec<_>, _>>()?;
                b.sort_unstable();
                b.dedup();
                if b.is_empty() || b[0] == 0 {
                    return Err("--batch: give positive sizes, e.g. 1,8,32".into());
                }
                a.batches = b;
            }
            "--steps" => a.steps = num("--steps", &v)?.max(1),
            "--warmup" => a.warmup = num("--warmup", &v)?,
            "--graphs" => {
                a.graphs = match v.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![true, false],
                    _ => return Err("--graphs: on, off or both".into()),
                }
            }
            "--out" => a.out = PathBuf::from(v),
            "--kv" => {
                a.kv = match v.as_str() {
                    "bf16" => KvDtype::Bf16,
                    "fp8" => KvDtype::Fp8E4m3,
                    _ => return Err("--kv: bf16 or fp8".into()),
                }
            }
            "--context" => {
                let c = v
                    .split(',')
                    .map(|s| num("--context", s.trim()))
                    .collect::<Result<Vec<_>, _>>()?;
                if c.is_empty() || c.contains(&0) {
                    return Err("--context: give positive sizes, e.g. 750,1500,3000".into());
                }
                a.contexts = c;
            }
            "--profile-steps" => a.profile_steps = num("--profile-steps", &v)?.max(1),
            "--json" => a.json = Some(PathBuf::from(v)),
            "--precision" => {
                a.f32_weights = match v.as_str() {
                    "bf16" => false,
                    "f32" => true,
                    _ => return Err("--precision: bf16 or f32".into()),
                }
            }
            "--cfg" => {
                a.cfg = Some(
                    v.parse()
                        .map_err(|_| format!("--cfg: `{v}` is not a number"))?,
                )
            }
            "--device" => {
                a.device = match v.as_str() {
                    "emu" => DeviceChoice::Emulator,
                    n => DeviceChoice::Cuda(num("--device", n)?),
                }
            }
            "--reserve-gib" => {
                let g: f64 = v
                    .parse()
                    .map_err(|_| format!("--reserve-gib: `{v}` is not a number"))?;
                a.reserve = (g.max(0.0) * (1u64 << 30) as f64) as u64;
            }
            "--ptx-cache" => a.ptx_cache = PathBuf::from(v),
            "--full-context" => {
                a.full_context = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err("--full-context: on or off".into()),
                }
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(a)
}
