//! The NVRTC compile path: every kernel source of `kernels/cuda/` compiled to
//! PTX for one GPU architecture, with an on-disk PTX cache.
//!
//! The daemon is meant to call [`compile_all`] at start-up for the device's
//! architecture ([`Arch::from_compute_capability`]); `scripts/check-kernels`
//! runs the same function (through the `check-kernels` binary) on machines
//! with no GPU, then assembles the PTX with `ptxas`.
//!
//! Invariants:
//! - NVRTC is loaded dynamically (cudarc `dynamic-loading`). Its absence is an
//!   error ([`CompileError::NvrtcMissing`]), never a panic: the library is
//!   looked for with `is_culib_present` before any NVRTC call, and every call
//!   into cudarc runs under `catch_unwind` so that a panic inside it (a
//!   missing symbol in an old library) also becomes an error.
//! - A module's translation unit is `common.cuh` followed by the module's
//!   `.cu` file (after a `#line 1` directive, so diagnostics name the real
//!   file and line). Sources are embedded with `include_str!`; the only
//!   headers read at run time are CUDA's own (`cuda_bf16.h`, `cuda_fp8.h`).
//! - The options are fixed here (IEEE division and square root, no
//!   flush-to-zero, FMA contraction on, C++17) and are part of the cache key
//!   together with the architecture, the include directories, the NVRTC
//!   version and the full source. A cached file is used only if it declares
//!   every kernel entry of its module; it is written atomically (temporary
//!   file, then rename).
//! - [`MODULES`] lists every `extern "C" __global__` function of every source
//!   (checked by a test), so a kernel cannot be added without being compiled,
//!   checked by ptxas and loadable by name.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// One `.cu` source and the kernels it defines.
#[derive(Debug)]
pub struct KernelModule {
    /// Short name (also the cache-file prefix).
    pub name: &'static str,
    /// File name under `kernels/cuda/`.
    pub file: &'static str,
    /// The source text.
    pub source: &'static str,
    /// Every `extern "C" __global__` function of the source.
    pub kernels: &'static [&'static str],
}

/// Prepended to every module (types, reductions, conversions).
pub const COMMON_HEADER: &str = include_str!("../cuda/common.cuh");

/// Every kernel source, in a fixed order.
pub const MODULES: &[KernelModule] = &[
    KernelModule {
        name: "norm",
        file: "norm.cu",
        source: include_str!("../cuda/norm.cu"),
        kernels: &[
            "rms_norm_bf16",
            "rms_norm_f32",
            "layer_norm_f32",
            "layer_norm_bf16",
        ],
    },
    KernelModule {
        name: "attention",
        file: "attention.cu",
        source: include_str!("../cuda/attention.cu"),
        kernels: &[
            "rope_kv_write_bf16",
            "rope_kv_write_fp8",
            "rope_kv_write_f32",
            "attn_decode_bf16",
            "attn_decode_fp8",
            "attn_decode_f32",
            "attn_decode_bf16_f32out",
            "rows_from_steps",
        ],
    },
    KernelModule {
        name: "elementwise",
        file: "elementwise.cu",
        source: include_str!("../cuda/elementwise.cu"),
        kernels: &[
            "silu_gate_bf16",
            "silu_gate_f32",
            "gelu_f32",
            "elu_f32",
            "add_scaled_f32",
            "add_f32",
            "f32_to_bf16",
            "fill_uniform_f32",
            "fill_uniform_bf16",
            "fill_f32",
        ],
    },
    KernelModule {
        name: "embed",
        file: "embed.cu",
        source: include_str!("../cuda/embed.cu"),
        kernels: &[
            "token_cache_in",
            "token_cache_out",
            "embed_sum",
            "embed_sum_f32",
            "embed_add_rows",
            "embed_add_rows_f32",
            "embed_gather_rows",
            "embed_gather_rows_f32",
            "fill_flagged_rows",
        ],
    },
    KernelModule {
        name: "sampling",
        file: "sampling.cu",
        source: include_str!("../cuda/sampling.cu"),
        kernels: &["sample_tokens"],
    },
    KernelModule {
        name: "conv",
        file: "conv.cu",
        source: include_str!("../cuda/conv.cu"),
        kernels: &[
            "conv1d_stream",
            "conv1d_replicate_pad",
            "conv1d_state_update",
            "convtr1d_stream",
            "convtr1d_dw_stream",
            "convtr1d_state_update",
        ],
    },
    KernelModule {
        name: "quantizer",
        file: "quantizer.cu",
        source: include_str!("../cuda/quantizer.cu"),
        kernels: &["rvq_encode", "rvq_decode"],
    },
];

/// Why kernels could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// libnvrtc could not be loaded under any name cudarc tries.
    #[error(
        "libnvrtc is not installed or not on the library path (tried {candidates:?}); install the CUDA \
         toolkit's NVRTC or the `nvidia-cuda-nvrtc-cu12` wheel and add its lib folder to LD_LIBRARY_PATH"
    )]
    NvrtcMissing {
        /// The file names looked for.
        candidates: Vec<String>,
    },
    /// No folder with `cuda_bf16.h` was given or found.
    #[error(
        "the CUDA headers (cuda_bf16.h) were not found; set MOSHID_CUDA_INCLUDE to the folder that holds \
         them (looked in {looked:?})"
    )]
    HeadersMissing {
        /// Folders looked in.
        looked: Vec<PathBuf>,
    },
    /// An architecture this code does not target.
    #[error("unsupported GPU architecture {0} (supported: sm_80 and later; known: {known})", known = known_archs())]
    UnsupportedArch(String),
    /// NVRTC rejected a source.
    #[error("NVRTC could not compile {file} for {arch}: {status}\n{log}")]
    Compile {
        /// The source file.
        file: &'static str,
        /// The architecture.
        arch: &'static str,
        /// NVRTC's status.
        status: String,
        /// NVRTC's log.
        log: String,
    },
    /// The PTX lacks a kernel the module should define.
    #[error("the PTX of {file} for {arch} has no entry `{kernel}`")]
    MissingEntry {
        /// The source file.
        file: &'static str,
        /// The architecture.
        arch: &'static str,
        /// The kernel.
        kernel: &'static str,
    },
    /// An NVRTC call failed outside compilation (version query, PTX retrieval).
    #[error("NVRTC failed: {0}")]
    Nvrtc(String),
    /// cudarc panicked (e.g. a symbol missing from an old libnvrtc).
    #[error("NVRTC call panicked: {0}")]
    Panicked(String),
    /// Reading or writing the PTX cache failed.
    #[error("PTX cache {path}: {source}")]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A GPU architecture the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    major: u32,
    minor: u32,
    name: &'static str,
}

/// The architectures this crate knows (bf16 arithmetic needs sm_80).
const ARCHS: &[Arch] = &[
    Arch {
        major: 8,
        minor: 0,
        name: "sm_80",
    },
    Arch {
        major: 8,
        minor: 6,
        name: "sm_86",
    },
    Arch {
        major: 8,
        minor: 7,
        name: "sm_87",
    },
    Arch {
        major: 8,
        minor: 9,
        name: "sm_89",
    },
    Arch {
        major: 9,
        minor: 0,
        name: "sm_90",
    },
    Arch {
        major: 10,
        minor: 0,
        name: "sm_100",
    },
    Arch {
        major: 12,
        minor: 0,
        name: "sm_120",
    },
];

fn known_archs() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

impl Arch {
    /// Parses `sm_90` (or `90`, `compute_90`).
    pub fn parse(s: &str) -> Result<Arch, CompileError> {
        let digits = s
            .trim()
            .trim_start_matches("sm_")
            .trim_start_matches("compute_");
        ARCHS
            .iter()
            .find(|a| &a.name[3..] == digits)
            .copied()
            .ok_or_else(|| CompileError::UnsupportedArch(s.to_string()))
    }

    /// The architecture to compile for on a device of compute capability
    /// `major.minor`: the exact one when known, otherwise the newest known
    /// one below it (PTX is JIT-compiled forward by the driver).
    pub fn from_compute_capability(major: u32, minor: u32) -> Result<Arch, CompileError> {
        ARCHS
            .iter()
            .rev()
            .find(|a| (a.major, a.minor) <= (major, minor))
            .copied()
            .ok_or_else(|| {
                CompileError::UnsupportedArch(format!("compute capability {major}.{minor}"))
            })
    }

    /// `sm_XY`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// What to compile for and where the PTX cache lives.
#[derive(Debug, Clone)]
pub struct CompileConfig {
    /// Target architecture.
    pub arch: Arch,
    /// Folders searched for `#include <…>` (must provide `cuda_bf16.h`).
    pub include_dirs: Vec<PathBuf>,
    /// PTX cache folder; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
}

/// One compiled module.
#[derive(Debug, Clone)]
pub struct CompiledModule {
    /// The source it came from.
    pub module: &'static KernelModule,
    /// The architecture.
    pub arch: Arch,
    /// PTX text.
    pub ptx: String,
    /// The cache key (hash of version, options and source).
    pub key: u64,
    /// Whether it was read from the cache.
    pub from_cache: bool,
}

/// The fixed NVRTC options besides the architecture and include paths.
pub const FIXED_OPTIONS: &[&str] = &[
    "--std=c++17",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--fmad=true",
];

/// Loads libnvrtc (erroring if absent) and returns its `(major, minor)` version.
pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    // SAFETY: `is_culib_present` only dlopens the candidate file names of
    // libnvrtc (running their initialisers, as any load does) and closes them.
    let present = guarded(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })?;
    if !present {
        return Err(CompileError::NvrtcMissing {
            candidates: cudarc::get_lib_name_candidates("nvrtc"),
        });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above), so cudarc's lazy loader
    // finds it; `nvrtcVersion` writes two ints through valid pointers.
    let status = guarded(|| unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) })?;
    status
        .result()
        .map_err(|e| CompileError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// Runs `f`, turning a panic into [`CompileError::Panicked`].
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, CompileError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        CompileError::Panicked(msg)
    })
}

/// The folder holding `cuda_bf16.h`: the first of `extra`, `$MOSHID_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`,
/// `/usr/include`, and this repository's `.cache/cuda-wheels` (where
/// `scripts/check-kernels` installs the headers) that has it.
pub fn find_cuda_include(extra: &[PathBuf]) -> Result<PathBuf, CompileError> {
    let mut looked: Vec<PathBuf> = extra.to_vec();
    if let Some(p) = std::env::var_os("MOSHID_CUDA_INCLUDE") {
        looked.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            looked.push(PathBuf::from(p).join("include"));
        }
    }
    looked.push(PathBuf::from("/usr/local/cuda/include"));
    looked.push(PathBuf::from("/usr/include"));
    looked.push(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../.cache/cuda-wheels/nvidia/cuda_runtime/include"),
    );
    looked
        .iter()
        .find(|d| d.join("cuda_bf16.h").is_file())
        .cloned()
        .ok_or(CompileError::HeadersMissing { looked })
}

/// The translation unit of a module: the common header, then the file.
pub fn module_source(m: &KernelModule) -> String {
    format!("{COMMON_HEADER}\n#line 1 \"{}\"\n{}", m.file, m.source)
}

/// FNV-1a, 64 bits: a stable hash (std's hashers may change between releases).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The cache key of a module for an architecture, include folders and NVRTC version.
pub fn cache_key(m: &KernelModule, arch: Arch, include_dirs: &[PathBuf], nvrtc: (i32, i32)) -> u64 {
    let version = format!("moshid-kernels-ptx-v1 nvrtc {}.{}", nvrtc.0, nvrtc.1);
    let includes = include_dirs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let options = FIXED_OPTIONS.join("\n");
    let source = module_source(m);
    fnv1a(&[
        version.as_bytes(),
        arch.name.as_bytes(),
        includes.as_bytes(),
        options.as_bytes(),
        source.as_bytes(),
    ])
}

/// Whether `ptx` declares every kernel of `m`.
fn missing_entry(m: &KernelModule, ptx: &str) -> Option<&'static str> {
    m.kernels
        .iter()
        .copied()
        .find(|k| !ptx.contains(&format!(".entry {k}(")))
}

fn cache_path(dir: &Path, m: &KernelModule, arch: Arch, key: u64) -> PathBuf {
    dir.join(format!("{}-{}-{key:016x}.ptx", m.name, arch.name))
}

/// Compiles one module with NVRTC (no cache). `nvrtc_version` must have
/// succeeded before (it is what makes the NVRTC calls safe from panics).
fn nvrtc_compile(
    m: &'static KernelModule,
    arch: Arch,
    include_dirs: &[PathBuf],
) -> Result<String, CompileError> {
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let opts = CompileOptions {
        include_paths: include_dirs
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        arch: Some(arch.name),
        name: Some(m.file.to_string()),
        options: FIXED_OPTIONS.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let src = module_source(m);
    let out = guarded(|| compile_ptx_with_opts(src, opts).map(|p| p.to_src()))?;
    out.map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => CompileError::Compile {
            file: m.file,
            arch: arch.name,
            status: format!("{nvrtc:?}"),
            log: log.to_string_lossy().into_owned(),
        },
        other => CompileError::Nvrtc(format!("{other:?}")),
    })
}

/// Compiles (or reads from the cache) one module.
pub fn compile_module(
    m: &'static KernelModule,
    cfg: &CompileConfig,
) -> Result<CompiledModule, CompileError> {
    let version = nvrtc_version()?;
    compile_module_with(m, cfg, version)
}

fn compile_module_with(
    m: &'static KernelModule,
    cfg: &CompileConfig,
    version: (i32, i32),
) -> Result<CompiledModule, CompileError> {
    let key = cache_key(m, cfg.arch, &cfg.include_dirs, version);
    let cached = cfg
        .cache_dir
        .as_ref()
        .map(|d| cache_path(d, m, cfg.arch, key));
    if let Some(path) = &cached {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            if missing_entry(m, &ptx).is_none() {
                return Ok(CompiledModule {
                    module: m,
                    arch: cfg.arch,
                    ptx,
                    key,
                    from_cache: true,
                });
            }
        }
    }
    let ptx = nvrtc_compile(m, cfg.arch, &cfg.include_dirs)?;
    if let Some(kernel) = missing_entry(m, &ptx) {
        return Err(CompileError::MissingEntry {
            file: m.file,
            arch: cfg.arch.name,
            kernel,
        });
    }
    if let (Some(dir), Some(path)) = (&cfg.cache_dir, &cached) {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CompileError::Cache { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = path.with_extension(format!("ptx.tmp{}", std::process::id()));
        std::fs::write(&tmp, &ptx).map_err(io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io(path))?;
    }
    Ok(CompiledModule {
        module: m,
        arch: cfg.arch,
        ptx,
        key,
        from_cache: false,
    })
}

/// Compiles (or reads from the cache) every module of [`MODULES`].
pub fn compile_all(cfg: &CompileConfig) -> Result<Vec<CompiledModule>, CompileError> {
    let version = nvrtc_version()?;
    MODULES
        .iter()
        .map(|m| compile_module_with(m, cfg, version))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names of the `extern "C" __global__` functions of a source.
    fn declared_kernels(src: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = src;
        while let Some(i) = rest.find("extern \"C\" __global__") {
            rest = &rest[i + 1..];
            let body = rest.find('{').expect("a kernel body");
            let mut sig = rest[..body].to_string();
            if let Some(lb) = sig.find("__launch_bounds__(") {
                let close = lb + sig[lb..].find(')').expect("closed launch bounds");
                sig.replace_range(lb..=close, " ");
            }
            let paren = sig.find('(').expect("a kernel signature");
            let head = &sig[..paren];
            let name = head.split_whitespace().last().expect("a kernel name");
            out.push(name.to_string());
        }
        out
    }

    #[test]
    fn module_table_lists_every_kernel_of_every_source() {
        let mut all = Vec::new();
        for m in MODULES {
            let mut declared = declared_kernels(m.source);
            declared.sort();
            let mut listed: Vec<String> = m.kernels.iter().map(|s| s.to_string()).collect();
            listed.sort();
            assert_eq!(declared, listed, "{}", m.file);
            all.extend(listed);
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "kernel names must be unique across modules");
        // Every .cu file in the folder is a module.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".cu"))
            .collect();
        files.sort();
        let mut listed: Vec<&str> = MODULES.iter().map(|m| m.file).collect();
        listed.sort();
        assert_eq!(files, listed);
    }

    #[test]
    fn sources_include_only_cuda_headers() {
        for m in MODULES.iter().map(|m| m.source).chain([COMMON_HEADER]) {
            for line in m.lines().filter(|l| l.trim_start().starts_with("#include")) {
                assert!(
                    line.contains('<'),
                    "local include `{line}`: NVRTC sees only CUDA's headers"
                );
            }
        }
    }

    #[test]
    fn arch_parsing_and_capabilities() {
        assert_eq!(Arch::parse("sm_90").unwrap().name(), "sm_90");
        assert_eq!(Arch::parse("80").unwrap().compute_capability(), (8, 0));
        assert!(Arch::parse("sm_75").is_err());
        assert_eq!(Arch::from_compute_capability(9, 0).unwrap().name(), "sm_90");
        assert_eq!(Arch::from_compute_capability(8, 9).unwrap().name(), "sm_89");
        // Unknown newer devices get the newest PTX below them.
        assert_eq!(Arch::from_compute_capability(9, 5).unwrap().name(), "sm_90");
        assert!(Arch::from_compute_capability(7, 5).is_err());
    }

    #[test]
    fn cache_key_depends_on_everything_that_matters() {
        let m = &MODULES[0];
        let a80 = Arch::parse("sm_80").unwrap();
        let a90 = Arch::parse("sm_90").unwrap();
        let inc = vec![PathBuf::from("/x")];
        let k = cache_key(m, a90, &inc, (12, 6));
        assert_eq!(k, cache_key(m, a90, &inc, (12, 6)));
        assert_ne!(k, cache_key(m, a80, &inc, (12, 6)));
        assert_ne!(k, cache_key(m, a90, &inc, (12, 8)));
        assert_ne!(k, cache_key(m, a90, &[PathBuf::from("/y")], (12, 6)));
        assert_ne!(k, cache_key(&MODULES[1], a90, &inc, (12, 6)));
    }

    /// The include folder, or why the NVRTC tests cannot run here.
    fn nvrtc_setup() -> Result<PathBuf, String> {
        nvrtc_version().map_err(|e| e.to_string())?;
        find_cuda_include(&[]).map_err(|e| e.to_string())
    }

    #[test]
    fn missing_nvrtc_is_an_error_not_a_panic() {
        match nvrtc_version() {
            Ok(v) => eprintln!(
                "skipped: libnvrtc {}.{} is present, so its absence cannot be tested here",
                v.0, v.1
            ),
            Err(e) => {
                assert!(matches!(e, CompileError::NvrtcMissing { .. }), "{e}");
                let cfg = CompileConfig {
                    arch: Arch::parse("sm_90").unwrap(),
                    include_dirs: vec![],
                    cache_dir: None,
                };
                assert!(matches!(
                    compile_all(&cfg),
                    Err(CompileError::NvrtcMissing { .. })
                ));
            }
        }
    }

    #[test]
    fn every_module_compiles_and_is_cached() {
        let include = match nvrtc_setup() {
            Ok(p) => p,
            Err(why) => {
                eprintln!(
                    "skipped: {why} (scripts/check-kernels installs NVRTC and runs this check)"
                );
                return;
            }
        };
        let dir = tempfile::tempdir().unwrap();
        for arch in ["sm_80", "sm_90"] {
            let cfg = CompileConfig {
                arch: Arch::parse(arch).unwrap(),
                include_dirs: vec![include.clone()],
                cache_dir: Some(dir.path().to_path_buf()),
            };
            let first = compile_all(&cfg).unwrap();
            assert!(first.iter().all(|c| !c.from_cache));
            let again = compile_all(&cfg).unwrap();
            for (a, b) in first.iter().zip(&again) {
                assert!(b.from_cache && a.ptx == b.ptx && a.key == b.key);
            }
        }
    }

    #[test]
    fn a_broken_source_is_a_compile_error_with_the_log() {
        let include = match nvrtc_setup() {
            Ok(p) => p,
            Err(why) => {
                eprintln!("skipped: {why}");
                return;
            }
        };
        static BROKEN: KernelModule = KernelModule {
            name: "broken",
            file: "broken.cu",
            source: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n",
            kernels: &["broken"],
        };
        let cfg = CompileConfig {
            arch: Arch::parse("sm_90").unwrap(),
            include_dirs: vec![include],
            cache_dir: None,
        };
        match compile_module(&BROKEN, &cfg) {
            Err(CompileError::Compile { log, .. }) => {
                assert!(
                    log.contains("broken.cu(1)") && log.contains("undefined_name"),
                    "{log}"
                )
            }
            other => panic!("expected a compile error, got {other:?}"),
        }
    }
}
