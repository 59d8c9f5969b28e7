//! The NVRTC compile path: every kernel source of `kernels/cuda/` compiled
//! for one GPU architecture to PTX and, for a device, to its SASS (a cubin),
//! with an on-disk cache.
//!
//! The CUDA device calls [`compile_all`] when it opens, for its architecture
//! ([`Arch::from_compute_capability`]), asking for cubins and keying the
//! cache by its driver's version; `scripts/check-kernels` runs the same
//! function (through the `check-kernels` binary) on machines with no GPU,
//! then assembles the PTX with `ptxas`.
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
//!   headers read at run time are CUDA's own (`cuda_bf16.h`, `cuda_fp8.h`,
//!   and with CUDA 13 what they include from `include/cccl`, which
//!   [`cuda_include_dirs`] adds to the include path).
//! - The options are fixed here (IEEE division and square root, no
//!   flush-to-zero, C++17, a real `sm_XY` architecture) but for FMA
//!   contraction ([`CompileConfig::fmad`]: on when serving). The cache key
//!   holds everything that changes the output: NVRTC's and the driver's
//!   versions, the architecture, the include folders, every option, whether a
//!   cubin is kept, and the full source.
//! - The cache is an optimisation, never a cause of failure: a cached module
//!   is used only if its PTX declares every kernel entry of the module (and
//!   its cubin is there when one is asked for); each file is written under a
//!   temporary name of its own (process id and a counter shared by the
//!   process's threads), then renamed over the final name, so concurrent
//!   writers (devices opened from parallel threads into one empty folder)
//!   never see a partial file or fail; a cache that cannot be written is a
//!   warning ([`CompiledModule::cache_warning`], and one line on stderr).
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
            "attn_split_bf16",
            "attn_split_fp8",
            "attn_split_f32",
            "attn_split_bf16_f32out",
            "attn_combine_bf16",
            "attn_combine_f32",
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
            "force_tokens",
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
        name: "text_rules",
        file: "text_rules.cu",
        source: include_str!("../cuda/text_rules.cu"),
        kernels: &["text_rules_apply", "text_history_push"],
    },
    KernelModule {
        name: "conv",
        file: "conv.cu",
        source: include_str!("../cuda/conv.cu"),
        kernels: &[
            "conv1d_stream",
            "conv1d_replicate_pad",
            "conv1d_state_update",
            "convtr1d_dw_stream",
            "convtr1d_state_update",
            "conv_gemm",
            "conv_gemm_tall",
            "conv_gemm_reduce",
        ],
    },
    KernelModule {
        name: "gemv",
        file: "gemv.cu",
        source: include_str!("../cuda/gemv.cu"),
        kernels: &[
            "gemv_bf16_x2",
            "gemv_bf16_x8",
            "gemv_bf16_cast_x2",
            "gemv_bf16_cast_x8",
            "gemv_bf16_rms_x2",
            "gemv_bf16_rms_x8",
            "gemv_bf16_silu_x2",
            "gemv_bf16_silu_x8",
            "gemv_f32_x2",
            "gemv_f32_x8",
            "gemv_f32_rms_x2",
            "gemv_f32_rms_x8",
            "gemv_f32_silu_x2",
            "gemv_f32_silu_x8",
        ],
    },
    KernelModule {
        name: "short_attn",
        file: "short_attn.cu",
        source: include_str!("../cuda/short_attn.cu"),
        kernels: &["short_attn_f32", "short_attn_bf16"],
    },
    KernelModule {
        name: "quantizer",
        file: "quantizer.cu",
        source: include_str!("../cuda/quantizer.cu"),
        kernels: &["rvq_stage", "rvq_decode"],
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

/// What to compile for and where the cache lives.
#[derive(Debug, Clone)]
pub struct CompileConfig {
    /// Target architecture.
    pub arch: Arch,
    /// Folders searched for `#include <…>` (must provide `cuda_bf16.h`; see
    /// [`with_cccl`] for CUDA 13's `include/cccl`).
    pub include_dirs: Vec<PathBuf>,
    /// Cache folder; `None` compiles every time.
    pub cache_dir: Option<PathBuf>,
    /// FMA contraction (`--fmad`): on for serving (what the GPU is fast at);
    /// off for the exactness tests, so that a multiply-add rounds twice, as
    /// on the CPU reference.
    pub fmad: bool,
    /// Also ask NVRTC for the architecture's SASS (a cubin), which the driver
    /// loads without JIT-compiling PTX (and so without needing to be as new
    /// as NVRTC's PTX ISA).
    pub cubin: bool,
    /// The driver's CUDA version (`cuDriverGetVersion`) when compiling for a
    /// device: part of the cache key, so a driver update never reuses a file
    /// made for the old one. `None` off a GPU (`check-kernels`).
    pub driver_version: Option<i32>,
}

impl CompileConfig {
    /// PTX only, FMA on, no cache, no driver: what `check-kernels` and the
    /// tests start from.
    pub fn new(arch: Arch, include_dirs: Vec<PathBuf>) -> CompileConfig {
        CompileConfig {
            arch,
            include_dirs,
            cache_dir: None,
            fmad: true,
            cubin: false,
            driver_version: None,
        }
    }
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
    /// The architecture's SASS, when [`CompileConfig::cubin`] asked for it.
    pub cubin: Option<Vec<u8>>,
    /// The cache key (hash of versions, options and source).
    pub key: u64,
    /// Whether it was read from the cache.
    pub from_cache: bool,
    /// Why the cache could not be written, if it could not (the module was
    /// compiled and is used from memory all the same).
    pub cache_warning: Option<String>,
}

/// The fixed NVRTC options besides the architecture, the include paths and
/// `--fmad` ([`CompileConfig::fmad`]).
pub const FIXED_OPTIONS: &[&str] = &[
    "--std=c++17",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
];

/// Every NVRTC option for `cfg` besides the include paths.
fn options(cfg: &CompileConfig) -> Vec<String> {
    let mut o: Vec<String> = FIXED_OPTIONS.iter().map(|s| s.to_string()).collect();
    o.push(format!("--fmad={}", cfg.fmad));
    // A real architecture (`sm_XY`): NVRTC then gives both the PTX and the
    // SASS for it.
    o.push(format!("--gpu-architecture={}", cfg.arch.name));
    o
}

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

/// The folders searched for `cuda_bf16.h`, in order: `extra`,
/// `$MOSHID_CUDA_INCLUDE`, `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`, `/usr/include`, and this repository's
/// `.cache/cuda-wheels*` (where `scripts/check-kernels` installs CUDA 12's
/// and 13's wheels).
fn include_candidates(extra: &[PathBuf]) -> Vec<PathBuf> {
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
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    looked.push(repo.join(".cache/cuda-wheels/nvidia/cuda_runtime/include"));
    looked.push(repo.join(".cache/cuda-wheels-13/nvidia/cu13/include"));
    looked
}

/// The first folder of [`include_candidates`] holding `cuda_bf16.h`.
pub fn find_cuda_include(extra: &[PathBuf]) -> Result<PathBuf, CompileError> {
    let looked = include_candidates(extra);
    looked
        .iter()
        .find(|d| d.join("cuda_bf16.h").is_file())
        .cloned()
        .ok_or(CompileError::HeadersMissing { looked })
}

/// `dirs` with CUDA 13's `include/cccl` added after every folder that holds
/// `cuda_bf16.h` and has one (CUDA 13 moved `nv/target`, `cuda/std` and the
/// rest of CCCL there; nvcc adds it by itself, NVRTC does not), each once.
pub fn with_cccl(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !out.contains(d) {
            out.push(d.clone());
        }
        let cccl = d.join("cccl");
        if d.join("cuda_bf16.h").is_file() && cccl.is_dir() && !dirs.contains(&cccl) {
            out.push(cccl);
        }
    }
    out
}

/// The include folders NVRTC needs: `dirs` if one of them holds
/// `cuda_bf16.h`, else `dirs` and the one [`find_cuda_include`] finds; then
/// [`with_cccl`]. What the CUDA device and `check-kernels` both compile with.
pub fn cuda_include_dirs(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, CompileError> {
    let mut all = dirs.to_vec();
    if !all.iter().any(|d| d.join("cuda_bf16.h").is_file()) {
        all.push(find_cuda_include(dirs)?);
    }
    Ok(with_cccl(&all))
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

/// The cache key of a module compiled with `cfg` by NVRTC `nvrtc`: the
/// versions (NVRTC's and the driver's), the architecture, the include
/// folders, every option, whether a cubin is kept, and the full source.
pub fn cache_key(m: &KernelModule, cfg: &CompileConfig, nvrtc: (i32, i32)) -> u64 {
    let version = format!(
        "moshid-kernels-cache-v2 nvrtc {}.{} driver {:?} cubin {}",
        nvrtc.0, nvrtc.1, cfg.driver_version, cfg.cubin
    );
    let includes = cfg
        .include_dirs
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let options = options(cfg).join("\n");
    let source = module_source(m);
    fnv1a(&[
        version.as_bytes(),
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

/// The cache files of a module: its PTX and its cubin.
fn cache_paths(dir: &Path, m: &KernelModule, arch: Arch, key: u64) -> (PathBuf, PathBuf) {
    let stem = format!("{}-{}-{key:016x}", m.name, arch.name);
    (
        dir.join(format!("{stem}.ptx")),
        dir.join(format!("{stem}.cubin")),
    )
}

/// What NVRTC produced for one module.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    /// The PTX.
    pub ptx: String,
    /// The SASS, when asked for.
    pub cubin: Option<Vec<u8>>,
}

/// Compiles one module with NVRTC (no cache). `nvrtc_version` must have
/// succeeded before (it is what makes the NVRTC calls safe from panics).
fn nvrtc_compile(
    m: &'static KernelModule,
    cfg: &CompileConfig,
) -> Result<NvrtcOutput, CompileError> {
    use cudarc::nvrtc::{result, sys};
    let nvrtc = |what: &str, e: result::NvrtcError| CompileError::Nvrtc(format!("{what}: {e:?}"));
    let src = std::ffi::CString::new(module_source(m))
        .map_err(|_| CompileError::Nvrtc(format!("{}: a NUL byte in the source", m.file)))?;
    let name = std::ffi::CString::new(m.file).expect("file names have no NUL");
    let mut opts = options(cfg);
    opts.extend(
        cfg.include_dirs
            .iter()
            .map(|p| format!("--include-path={}", p.display())),
    );
    let to_string = |v: Vec<std::ffi::c_char>| {
        let bytes: Vec<u8> = v.into_iter().map(|c| c as u8).collect();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    };
    guarded(|| {
        let prog = result::create_program(&src, Some(&name))
            .map_err(|e| nvrtc("nvrtcCreateProgram", e))?;
        // SAFETY (whole block): `prog` was just created and is destroyed once,
        // at the end; the source and name CStrings outlive it; the CUBIN
        // buffer is exactly the size NVRTC reported.
        let out = unsafe {
            let r = match result::compile_program(prog, &opts) {
                Err(e) => {
                    let log = result::get_program_log(prog)
                        .map(to_string)
                        .unwrap_or_default();
                    Err(CompileError::Compile {
                        file: m.file,
                        arch: cfg.arch.name,
                        status: format!("{:?}", e.0),
                        log,
                    })
                }
                Ok(()) => result::get_ptx(prog)
                    .map(to_string)
                    .map_err(|e| nvrtc("nvrtcGetPTX", e))
                    .and_then(|ptx| {
                        let cubin = if cfg.cubin {
                            let mut size = 0usize;
                            sys::nvrtcGetCUBINSize(prog, &mut size)
                                .result()
                                .map_err(|e| nvrtc("nvrtcGetCUBINSize", e))?;
                            if size == 0 {
                                return Err(CompileError::Nvrtc(format!(
                                    "{}: NVRTC made no cubin for {}",
                                    m.file, cfg.arch.name
                                )));
                            }
                            let mut buf = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
                                .result()
                                .map_err(|e| nvrtc("nvrtcGetCUBIN", e))?;
                            Some(buf)
                        } else {
                            None
                        };
                        Ok(NvrtcOutput { ptx, cubin })
                    }),
            };
            let _ = result::destroy_program(prog);
            r
        };
        out
    })?
}

/// Compiles (or reads from the cache) one module.
pub fn compile_module(
    m: &'static KernelModule,
    cfg: &CompileConfig,
) -> Result<CompiledModule, CompileError> {
    let version = nvrtc_version()?;
    compile_module_with(m, cfg, version, &|m, cfg| nvrtc_compile(m, cfg))
}

/// A compiler: NVRTC, or a stand-in in the cache's tests.
type Compiler<'a> =
    dyn Fn(&'static KernelModule, &CompileConfig) -> Result<NvrtcOutput, CompileError> + Sync + 'a;

/// Reads a module from the cache, if both its files are there and whole.
fn read_cached(
    m: &KernelModule,
    cfg: &CompileConfig,
    ptx: &Path,
    cubin: &Path,
) -> Option<NvrtcOutput> {
    let text = std::fs::read_to_string(ptx).ok()?;
    missing_entry(m, &text).is_none().then_some(())?;
    let bin = if cfg.cubin {
        Some(std::fs::read(cubin).ok().filter(|b| !b.is_empty())?)
    } else {
        None
    };
    Some(NvrtcOutput {
        ptx: text,
        cubin: bin,
    })
}

/// A name no other writer uses: this process, and a counter shared by its threads.
fn temporary_name(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// Writes `bytes` to `path` atomically: into a temporary file of a name of
/// its own, then renamed over `path` (readers see the old file, no file, or
/// the whole new one; concurrent writers of the same content all succeed).
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = temporary_name(path);
    let r = std::fs::write(&tmp, bytes)
        .map_err(|e| format!("{}: {e}", tmp.display()))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display())));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn compile_module_with(
    m: &'static KernelModule,
    cfg: &CompileConfig,
    version: (i32, i32),
    compiler: &Compiler<'_>,
) -> Result<CompiledModule, CompileError> {
    let key = cache_key(m, cfg, version);
    let paths = cfg
        .cache_dir
        .as_ref()
        .map(|d| cache_paths(d, m, cfg.arch, key));
    if let Some((ptx, cubin)) = &paths {
        if let Some(out) = read_cached(m, cfg, ptx, cubin) {
            return Ok(CompiledModule {
                module: m,
                arch: cfg.arch,
                ptx: out.ptx,
                cubin: out.cubin,
                key,
                from_cache: true,
                cache_warning: None,
            });
        }
    }
    let out = compiler(m, cfg)?;
    if let Some(kernel) = missing_entry(m, &out.ptx) {
        return Err(CompileError::MissingEntry {
            file: m.file,
            arch: cfg.arch.name,
            kernel,
        });
    }
    // The cache is an optimisation: a failure to write it is a warning, the
    // compiled module is in memory.
    let mut cache_warning = None;
    if let (Some(dir), Some((ptx, cubin))) = (&cfg.cache_dir, &paths) {
        let written = std::fs::create_dir_all(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))
            .and_then(|_| match &out.cubin {
                // The cubin first: a reader takes the PTX as the sign that
                // both are there.
                Some(bin) => write_atomically(cubin, bin),
                None => Ok(()),
            })
            .and_then(|_| write_atomically(ptx, out.ptx.as_bytes()));
        if let Err(why) = written {
            eprintln!(
                "<4>kernels: could not write the kernel cache ({why}); {} is compiled and used from memory",
                m.file
            );
            cache_warning = Some(why);
        }
    }
    Ok(CompiledModule {
        module: m,
        arch: cfg.arch,
        ptx: out.ptx,
        cubin: out.cubin,
        key,
        from_cache: false,
        cache_warning,
    })
}

/// Compiles (or reads from the cache) every module of [`MODULES`].
pub fn compile_all(cfg: &CompileConfig) -> Result<Vec<CompiledModule>, CompileError> {
    let version = nvrtc_version()?;
    MODULES
        .iter()
        .map(|m| compile_module_with(m, cfg, version, &|m, cfg| nvrtc_compile(m, cfg)))
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
        let base = CompileConfig::new(a90, vec![PathBuf::from("/x")]);
        let k = cache_key(m, &base, (12, 6));
        assert_eq!(k, cache_key(m, &base.clone(), (12, 6)));
        let changed = [
            CompileConfig {
                arch: a80,
                ..base.clone()
            },
            CompileConfig {
                include_dirs: vec![PathBuf::from("/y")],
                ..base.clone()
            },
            CompileConfig {
                fmad: false,
                ..base.clone()
            },
            CompileConfig {
                cubin: true,
                ..base.clone()
            },
            CompileConfig {
                driver_version: Some(13000),
                ..base.clone()
            },
            CompileConfig {
                driver_version: Some(13010),
                ..base.clone()
            },
        ];
        let mut keys = vec![
            k,
            cache_key(m, &base, (12, 8)),
            cache_key(&MODULES[1], &base, (12, 6)),
        ];
        keys.extend(changed.iter().map(|c| cache_key(m, c, (12, 6))));
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "every change makes a new key");
        // The cache location does not change what is compiled.
        let cached = CompileConfig {
            cache_dir: Some("/c".into()),
            ..base.clone()
        };
        assert_eq!(cache_key(m, &cached, (12, 6)), k);
    }

    #[test]
    fn options_follow_the_config() {
        let mut cfg = CompileConfig::new(Arch::parse("sm_90").unwrap(), vec![]);
        assert!(options(&cfg).contains(&"--fmad=true".to_string()));
        assert!(options(&cfg).contains(&"--gpu-architecture=sm_90".to_string()));
        cfg.fmad = false;
        assert!(options(&cfg).contains(&"--fmad=false".to_string()));
        assert!(!options(&cfg).iter().any(|o| o == "--fmad=true"));
    }

    #[test]
    fn cccl_is_added_after_a_cuda_13_include_folder() {
        let root = tempfile::tempdir().unwrap();
        let (c13, c12) = (root.path().join("13"), root.path().join("12"));
        std::fs::create_dir_all(c13.join("cccl/nv")).unwrap();
        std::fs::create_dir_all(&c12).unwrap();
        for d in [&c13, &c12] {
            std::fs::write(d.join("cuda_bf16.h"), "").unwrap();
        }
        let other = root.path().join("other");
        assert_eq!(
            with_cccl(&[other.clone(), c13.clone()]),
            vec![other.clone(), c13.clone(), c13.join("cccl")]
        );
        // Given already, or a CUDA 12 folder: nothing added, nothing twice.
        assert_eq!(
            with_cccl(&[c13.clone(), c13.join("cccl"), c13.clone()]),
            vec![c13.clone(), c13.join("cccl")]
        );
        assert_eq!(with_cccl(std::slice::from_ref(&c12)), vec![c12.clone()]);
        // The daemon's search: a configured folder without the header gets
        // the found one, with its cccl.
        assert_eq!(
            cuda_include_dirs(&[other.clone(), c13.clone()]).unwrap(),
            vec![other, c13.clone(), c13.join("cccl")]
        );
    }

    /// A stand-in for NVRTC: PTX declaring every kernel of the module, a
    /// cubin of a few bytes, after every caller has arrived at `barrier`
    /// (so that all of them write the cache at the same moment).
    fn fake_compiler(
        barrier: &std::sync::Barrier,
    ) -> impl Fn(&'static KernelModule, &CompileConfig) -> Result<NvrtcOutput, CompileError> + Sync + '_
    {
        move |m, cfg| {
            barrier.wait();
            let ptx: String = m
                .kernels
                .iter()
                .map(|k| format!(".visible .entry {k}(\n)\n{{\n}}\n"))
                .collect();
            Ok(NvrtcOutput {
                ptx,
                cubin: cfg.cubin.then(|| vec![0x7f, b'E', b'L', b'F']),
            })
        }
    }

    #[test]
    fn eight_threads_fill_one_empty_cache() {
        // The GPU tests open devices from parallel threads of one process
        // into one empty cache folder: every one must compile (or read) and
        // succeed, none may see a half-written file, nothing may warn.
        const THREADS: usize = 8;
        for round in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let cfg = CompileConfig {
                cache_dir: Some(dir.path().join("cache")),
                cubin: round % 2 == 0,
                ..CompileConfig::new(Arch::parse("sm_90").unwrap(), vec![])
            };
            let barrier = std::sync::Barrier::new(THREADS);
            let compiler = fake_compiler(&barrier);
            let results: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|_| s.spawn(|| compile_module_with(&MODULES[1], &cfg, (13, 0), &compiler)))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for r in &results {
                let c = r.as_ref().unwrap_or_else(|e| panic!("round {round}: {e}"));
                assert!(!c.from_cache);
                assert_eq!(c.cache_warning, None, "round {round}");
            }
            // The cache now holds the module (and no temporary file).
            let again = compile_module_with(&MODULES[1], &cfg, (13, 0), &|_, _| {
                panic!("compiled although cached")
            })
            .unwrap();
            assert!(again.from_cache && again.ptx == results[0].as_ref().unwrap().ptx);
            assert_eq!(again.cubin.is_some(), cfg.cubin);
            let files = std::fs::read_dir(dir.path().join("cache")).unwrap().count();
            assert_eq!(
                files,
                1 + cfg.cubin as usize,
                "round {round}: temporary files left"
            );
        }
    }

    #[test]
    fn an_unwritable_cache_is_a_warning_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-folder");
        std::fs::write(&file, "").unwrap();
        let cfg = CompileConfig {
            cache_dir: Some(file.join("cache")),
            ..CompileConfig::new(Arch::parse("sm_80").unwrap(), vec![])
        };
        let barrier = std::sync::Barrier::new(1);
        let c = compile_module_with(&MODULES[0], &cfg, (12, 6), &fake_compiler(&barrier)).unwrap();
        assert!(!c.from_cache);
        assert!(c.cache_warning.is_some());
        assert!(c.ptx.contains(".entry rms_norm_f32("));
    }

    #[test]
    fn a_partial_cache_entry_is_compiled_again() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = CompileConfig {
            cache_dir: Some(dir.path().to_path_buf()),
            cubin: true,
            ..CompileConfig::new(Arch::parse("sm_90").unwrap(), vec![])
        };
        let key = cache_key(&MODULES[0], &cfg, (12, 6));
        let (ptx, cubin) = cache_paths(dir.path(), &MODULES[0], cfg.arch, key);
        // PTX lacking a kernel; then whole PTX without its cubin.
        std::fs::write(&ptx, ".entry rms_norm_f32(\n").unwrap();
        let barrier = std::sync::Barrier::new(1);
        let fake = fake_compiler(&barrier);
        assert!(
            !compile_module_with(&MODULES[0], &cfg, (12, 6), &fake)
                .unwrap()
                .from_cache
        );
        std::fs::remove_file(&cubin).unwrap();
        assert!(
            !compile_module_with(&MODULES[0], &cfg, (12, 6), &fake)
                .unwrap()
                .from_cache
        );
        assert!(
            compile_module_with(&MODULES[0], &cfg, (12, 6), &fake)
                .unwrap()
                .from_cache
        );
    }

    /// Why the NVRTC tests are `#[ignore]`d in a plain `cargo test`:
    /// scripts/check-kernels installs NVRTC and runs them
    /// (`--include-ignored`) with CUDA 12's and 13's.
    const NEEDS_NVRTC: &str =
        "NVRTC and the CUDA headers (scripts/check-kernels installs them and runs this test)";

    /// The include folders, or why the NVRTC tests cannot run here.
    fn nvrtc_setup() -> Result<Vec<PathBuf>, String> {
        nvrtc_version().map_err(|e| e.to_string())?;
        cuda_include_dirs(&[]).map_err(|e| e.to_string())
    }

    #[test]
    fn missing_nvrtc_is_an_error_not_a_panic() {
        match nvrtc_version() {
            // Present (scripts/check-kernels puts it on the library path):
            // its absence cannot be tested here, but its answer can.
            Ok(v) => assert!(v.0 >= 12, "libnvrtc {}.{}: older than CUDA 12", v.0, v.1),
            Err(e) => {
                assert!(matches!(e, CompileError::NvrtcMissing { .. }), "{e}");
                let cfg = CompileConfig::new(Arch::parse("sm_90").unwrap(), vec![]);
                assert!(matches!(
                    compile_all(&cfg),
                    Err(CompileError::NvrtcMissing { .. })
                ));
            }
        }
    }

    #[test]
    #[ignore = "needs NVRTC: scripts/check-kernels runs it"]
    fn every_module_compiles_to_ptx_and_cubin_and_is_cached() {
        let include = nvrtc_setup().expect(NEEDS_NVRTC);
        let dir = tempfile::tempdir().unwrap();
        for arch in ["sm_80", "sm_90"] {
            let cfg = CompileConfig {
                cache_dir: Some(dir.path().to_path_buf()),
                cubin: true,
                ..CompileConfig::new(Arch::parse(arch).unwrap(), include.clone())
            };
            let first = compile_all(&cfg).unwrap();
            assert!(first
                .iter()
                .all(|c| !c.from_cache && c.cache_warning.is_none()));
            for c in &first {
                // An ELF image (the SASS), and PTX for the same architecture.
                let bin = c.cubin.as_ref().unwrap();
                assert_eq!(&bin[..4], b"\x7fELF", "{} {arch}", c.module.file);
                assert!(
                    c.ptx.contains(&format!(".target {arch}")),
                    "{}",
                    c.module.file
                );
            }
            let again = compile_all(&cfg).unwrap();
            for (a, b) in first.iter().zip(&again) {
                assert!(b.from_cache && a.ptx == b.ptx && a.key == b.key && a.cubin == b.cubin);
            }
        }
    }

    #[test]
    #[ignore = "needs NVRTC: scripts/check-kernels runs it"]
    fn eight_threads_compile_with_nvrtc_into_one_empty_cache() {
        // As the GPU tests open devices: NVRTC from parallel threads, one
        // empty cache (one small module, to keep CI short; the cache's own
        // protocol is `eight_threads_fill_one_empty_cache`).
        let include = nvrtc_setup().expect(NEEDS_NVRTC);
        let dir = tempfile::tempdir().unwrap();
        let cfg = CompileConfig {
            cache_dir: Some(dir.path().join("cache")),
            cubin: true,
            ..CompileConfig::new(Arch::parse("sm_90").unwrap(), include)
        };
        let m = MODULES.iter().find(|m| m.name == "norm").unwrap();
        let all: Vec<CompiledModule> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| compile_module(m, &cfg).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for c in &all {
            assert!(c.cache_warning.is_none());
            assert_eq!(c.ptx, all[0].ptx);
            assert_eq!(c.cubin, all[0].cubin);
        }
        let files = std::fs::read_dir(dir.path().join("cache")).unwrap().count();
        assert_eq!(files, 2, "one PTX and one cubin, no temporary file");
    }

    #[test]
    #[ignore = "needs NVRTC: scripts/check-kernels runs it"]
    fn without_fmad_no_fused_multiply_add_is_emitted() {
        let include = nvrtc_setup().expect(NEEDS_NVRTC);
        let m = MODULES.iter().find(|m| m.name == "norm").unwrap();
        let mut cfg = CompileConfig::new(Arch::parse("sm_90").unwrap(), include);
        let fused = compile_module(m, &cfg).unwrap().ptx;
        cfg.fmad = false;
        let plain = compile_module(m, &cfg).unwrap().ptx;
        assert!(
            fused.contains("fma.rn.f32"),
            "the norms contract with --fmad=true"
        );
        assert!(!plain.contains("fma.rn.f32"), "--fmad=false leaves no fma");
    }

    #[test]
    #[ignore = "needs NVRTC: scripts/check-kernels runs it"]
    fn a_broken_source_is_a_compile_error_with_the_log() {
        let include = nvrtc_setup().expect(NEEDS_NVRTC);
        static BROKEN: KernelModule = KernelModule {
            name: "broken",
            file: "broken.cu",
            source: "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }\n",
            kernels: &["broken"],
        };
        let cfg = CompileConfig::new(Arch::parse("sm_90").unwrap(), include);
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
