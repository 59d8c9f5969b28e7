//! Assembling PTX with `ptxas -v` and reading its resource report: registers,
//! static shared memory, stack frame and spills per kernel.
//!
//! Used by the `check-kernels` binary (the compile gate that needs no GPU).
//! The report is ptxas's text, which has been stable across CUDA 11–12:
//!
//! ```text
//! ptxas info    : Compiling entry function 'rms_norm_bf16' for 'sm_90'
//! ptxas info    : Function properties for rms_norm_bf16
//!     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//! ptxas info    : Used 16 registers, used 1 barriers, 32 bytes smem, 400 bytes cmem[0]
//! ```
//!
//! Invariant: [`parse_verbose`] reports only entry functions (kernels), each
//! once, with every number it found (absent numbers are 0, as ptxas omits
//! zero shared memory).

use std::path::Path;
use std::process::Command;

/// Resources of one kernel as ptxas reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// Kernel (entry) name.
    pub name: String,
    /// Target, e.g. `sm_90`.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u64,
    /// Stack frame per thread, bytes (local memory).
    pub stack_bytes: u64,
    /// Spill stores, bytes.
    pub spill_stores: u64,
    /// Spill loads, bytes.
    pub spill_loads: u64,
}

impl KernelResources {
    /// Whether the kernel spills registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// The number before `unit` in `text` (`"32 bytes smem"` → 32 for `bytes smem`).
fn number_before(text: &str, unit: &str) -> Option<u64> {
    let i = text.find(unit)?;
    text[..i]
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

fn quoted(text: &str, n: usize) -> Option<&str> {
    text.split('\'').nth(2 * n + 1)
}

/// Reads the `-v` report of ptxas (stdout and stderr together).
pub fn parse_verbose(text: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    // Index into `out` of the entry that the following lines describe.
    let mut current: Option<usize> = None;
    let mut properties_for: Option<String> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.contains("Compiling entry function") {
            if let (Some(name), Some(arch)) = (quoted(l, 0), quoted(l, 1)) {
                out.push(KernelResources {
                    name: name.to_string(),
                    arch: arch.to_string(),
                    ..Default::default()
                });
                current = Some(out.len() - 1);
            }
            properties_for = None;
        } else if let Some(rest) = l.split("Function properties for ").nth(1) {
            properties_for = Some(rest.trim().to_string());
        } else if l.contains("bytes stack frame") {
            let target = properties_for.take();
            if let Some(k) = out
                .iter_mut()
                .rev()
                .find(|k| Some(&k.name) == target.as_ref())
            {
                k.stack_bytes = number_before(l, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(l, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(l, "bytes spill loads").unwrap_or(0);
            }
        } else if l.contains("Used ") && l.contains(" registers") {
            if let Some(k) = current.take().and_then(|i| out.get_mut(i)) {
                k.registers = number_before(l, " registers").unwrap_or(0) as u32;
                k.shared_bytes = number_before(l, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// What running ptxas on one PTX file gave.
#[derive(Debug, Clone)]
pub struct PtxasRun {
    /// Per-kernel resources.
    pub kernels: Vec<KernelResources>,
    /// The full report.
    pub report: String,
}

/// Runs `ptxas -arch=ARCH -v PTX -o CUBIN`; an error carries ptxas's output.
pub fn run(ptxas: &Path, ptx: &Path, arch: &str, cubin: &Path) -> Result<PtxasRun, String> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!(
            "ptxas failed on {} ({}):\n{report}",
            ptx.display(),
            out.status
        ));
    }
    Ok(PtxasRun {
        kernels: parse_verbose(&report),
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'rms_norm_bf16' for 'sm_90'
ptxas info    : Function properties for rms_norm_bf16
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 1 barriers, 32 bytes smem, 400 bytes cmem[0]
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'big' for 'sm_80'
ptxas info    : Function properties for big
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, 384 bytes cmem[0]
";

    #[test]
    fn parses_entries_registers_smem_and_spills() {
        let k = parse_verbose(SAMPLE);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelResources {
                name: "rms_norm_bf16".into(),
                arch: "sm_90".into(),
                registers: 18,
                shared_bytes: 32,
                stack_bytes: 0,
                spill_stores: 0,
                spill_loads: 0,
            }
        );
        assert!(!k[0].spills());
        assert_eq!(
            (k[1].registers, k[1].shared_bytes, k[1].stack_bytes),
            (255, 0, 24)
        );
        assert_eq!((k[1].spill_stores, k[1].spill_loads), (20, 16));
        assert!(k[1].spills());
    }
}
