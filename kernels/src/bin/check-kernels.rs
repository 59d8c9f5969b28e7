//! `check-kernels`: the compile gate that needs no GPU.
//!
//! Compiles every kernel of `moshid-kernels` for each `--arch` through
//! [`moshid_kernels::compile::compile_all`] (the daemon's code path: its
//! include-folder search with CUDA 13's `include/cccl`, PTX and cubin, the
//! cache included: a fresh cache is filled, then read back and compared), writes the
//! PTX under `--out`, assembles each file with `ptxas -arch=… -v`, and prints
//! registers, shared memory, stack and spills per kernel. Exits non-zero on a
//! compile or assembly error, a kernel missing from ptxas's report, or any
//! spill.
//!
//! ```text
//! check-kernels --arch sm_80 --arch sm_90 [--include DIR]… [--ptxas PATH] [--out DIR]
//! ```
//! NVRTC is found through the library path (LD_LIBRARY_PATH); ptxas through
//! `--ptxas` or PATH. `scripts/check-kernels` sets both up from pip wheels.

use moshid_kernels::compile::{self, Arch, CompileConfig, MODULES};
use moshid_kernels::ptxas;
use std::path::PathBuf;
use std::process::ExitCode;

struct Args {
    archs: Vec<Arch>,
    includes: Vec<PathBuf>,
    ptxas: PathBuf,
    out: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut archs = Vec::new();
    let mut includes = Vec::new();
    let mut ptxas = PathBuf::from("ptxas");
    let mut out = PathBuf::from("target/check-kernels");
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--arch" => archs.push(Arch::parse(&value("--arch")?).map_err(|e| e.to_string())?),
            "--include" => includes.push(PathBuf::from(value("--include")?)),
            "--ptxas" => ptxas = PathBuf::from(value("--ptxas")?),
            "--out" => out = PathBuf::from(value("--out")?),
            "-h" | "--help" => {
                return Err("usage: check-kernels --arch sm_XX [--arch …] [--include DIR]… [--ptxas PATH] [--out DIR]".into())
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if archs.is_empty() {
        return Err("give at least one --arch (e.g. --arch sm_90)".into());
    }
    Ok(Args {
        archs,
        includes,
        ptxas,
        out,
    })
}

fn run(args: &Args) -> Result<bool, String> {
    let (major, minor) = compile::nvrtc_version().map_err(|e| e.to_string())?;
    // The daemon's own search (CUDA 13's include/cccl added).
    let include = compile::cuda_include_dirs(&args.includes).map_err(|e| e.to_string())?;
    println!(
        "NVRTC {major}.{minor}; CUDA headers: {}",
        include
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut ok = true;
    let mut rows = Vec::new();
    for &arch in &args.archs {
        let dir = args.out.join(arch.name());
        let cache = dir.join("ptx-cache");
        if cache.exists() {
            std::fs::remove_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
        }
        // As the CUDA device compiles: PTX and the architecture's SASS.
        let cfg = CompileConfig {
            cache_dir: Some(cache),
            cubin: true,
            ..CompileConfig::new(arch, include.clone())
        };
        let t = std::time::Instant::now();
        let compiled = compile::compile_all(&cfg).map_err(|e| e.to_string())?;
        let secs = t.elapsed().as_secs_f64();
        let again = compile::compile_all(&cfg).map_err(|e| e.to_string())?;
        for (a, b) in compiled.iter().zip(&again) {
            if a.from_cache || !b.from_cache || a.ptx != b.ptx || a.cubin != b.cubin {
                return Err(format!(
                    "PTX cache misbehaved for {} on {arch}",
                    a.module.name
                ));
            }
        }
        let sass: usize = compiled
            .iter()
            .map(|c| c.cubin.as_ref().map_or(0, Vec::len))
            .sum();
        if let Some(c) = compiled
            .iter()
            .find(|c| c.cubin.as_ref().is_none_or(|b| !b.starts_with(b"\x7fELF")))
        {
            return Err(format!(
                "NVRTC made no cubin of {} for {arch}",
                c.module.file
            ));
        }
        println!(
            "{arch}: {} modules compiled to PTX and SASS ({sass} bytes of cubin) in {secs:.1} s (cache checked)",
            compiled.len()
        );
        for c in &compiled {
            let ptx = dir.join(format!("{}.ptx", c.module.name));
            std::fs::write(&ptx, &c.ptx).map_err(|e| format!("{}: {e}", ptx.display()))?;
            let cubin = dir.join(format!("{}.cubin", c.module.name));
            let run = ptxas::run(&args.ptxas, &ptx, arch.name(), &cubin)?;
            for &k in c.module.kernels {
                match run.kernels.iter().find(|r| r.name == k) {
                    Some(r) => {
                        ok &= !r.spills();
                        rows.push((c.module.name, r.clone()));
                    }
                    None => {
                        eprintln!(
                            "error: ptxas reported nothing for {k} ({arch}):\n{}",
                            run.report
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    println!(
        "\n{:<7} {:<12} {:<26} {:>5} {:>7} {:>6} {:>12}",
        "arch", "module", "kernel", "regs", "smem B", "stack", "spill st/ld"
    );
    for (module, r) in &rows {
        println!(
            "{:<7} {:<12} {:<26} {:>5} {:>7} {:>6} {:>7}/{:<4}{}",
            r.arch,
            module,
            r.name,
            r.registers,
            r.shared_bytes,
            r.stack_bytes,
            r.spill_stores,
            r.spill_loads,
            if r.spills() { "  SPILLS" } else { "" }
        );
    }
    let kernels: usize = MODULES.iter().map(|m| m.kernels.len()).sum();
    println!(
        "\n{} kernels × {} architectures checked",
        kernels,
        args.archs.len()
    );
    Ok(ok)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("check-kernels: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => {
            println!("check-kernels: ok (no compile error, no spill)");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("check-kernels: FAILED (spills or missing kernels above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("check-kernels: {e}");
            ExitCode::FAILURE
        }
    }
}
