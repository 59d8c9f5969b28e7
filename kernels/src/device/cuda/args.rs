//! Kernel arguments: [`PackedArgs`] packs a launch's [`Arg`]s into 8-byte
//! slots on the stack (what `cuLaunchKernel` reads through its parameter
//! array), and [`entry_params`] reads the parameter sizes of a kernel's PTX
//! `.entry` declaration, against which a launch's arguments are checked.
//!
//! Invariants: at most [`MAX_ARGS`] arguments, no heap allocation per
//! launch; an argument's bytes come first in its slot (4 for int, unsigned
//! and float, 8 for pointers and 64-bit integers); a declaration that is
//! absent or not understood is `None` (unchecked), never a guess.

use crate::device::{Arg, DeviceError, DeviceResult};
use std::ffi::c_void;

/// Most arguments one launch takes.
pub const MAX_ARGS: usize = 24;

/// Launch arguments as values on the stack, each in an 8-byte slot holding
/// the argument's bytes first (what `cuLaunchKernel` reads through each
/// parameter pointer: 4 bytes for int / unsigned / float, 8 for pointers and
/// size_t).
#[derive(Debug, Clone, Copy)]
pub struct PackedArgs {
    values: [u64; MAX_ARGS],
    sizes: [u8; MAX_ARGS],
    len: usize,
}

impl PackedArgs {
    /// Packs `args`; more than [`MAX_ARGS`] is an error.
    pub fn new(args: &[Arg]) -> DeviceResult<PackedArgs> {
        if args.len() > MAX_ARGS {
            return Err(DeviceError::shape(
                "launch",
                format!("{} arguments, at most {MAX_ARGS}", args.len()),
            ));
        }
        let mut p = PackedArgs {
            values: [0; MAX_ARGS],
            sizes: [0; MAX_ARGS],
            len: args.len(),
        };
        for (i, a) in args.iter().enumerate() {
            let (v, n) = match *a {
                Arg::Ptr(v) | Arg::U64(v) => (v, 8),
                Arg::I32(v) => (four(v.to_ne_bytes()), 4),
                Arg::U32(v) => (four(v.to_ne_bytes()), 4),
                Arg::F32(v) => (four(v.to_ne_bytes()), 4),
            };
            p.values[i] = v;
            p.sizes[i] = n;
        }
        Ok(p)
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte size of each argument.
    pub fn sizes(&self) -> &[u8] {
        &self.sizes[..self.len]
    }

    /// The parameter array `cuLaunchKernel` takes: one pointer per argument,
    /// into `self` (which must stay in place while the array is used).
    pub fn pointers(&mut self) -> [*mut c_void; MAX_ARGS] {
        let mut out = [std::ptr::null_mut(); MAX_ARGS];
        for (o, v) in out.iter_mut().zip(self.values[..self.len].iter_mut()) {
            *o = v as *mut u64 as *mut c_void;
        }
        out
    }
}

/// Four bytes at the start of an 8-byte slot.
fn four(b: [u8; 4]) -> u64 {
    let mut s = [0u8; 8];
    s[..4].copy_from_slice(&b);
    u64::from_ne_bytes(s)
}

/// Byte sizes of the parameters of `.entry kernel(...)` in `ptx`, or `None`
/// when the declaration is absent or not understood.
pub fn entry_params(ptx: &str, kernel: &str) -> Option<Vec<u16>> {
    let head = format!(".entry {kernel}(");
    let start = ptx.find(&head)? + head.len();
    let end = start + ptx[start..].find(')')?;
    let list = ptx[start..end].trim();
    if list.is_empty() {
        return Some(Vec::new());
    }
    list.split(',').map(param_size).collect()
}

/// Size of one `.param …` declaration: `.param .u64 x`, `.param .u64 .ptr
/// .align 4 x`, `.param .align 8 .b8 x[24]`.
fn param_size(decl: &str) -> Option<u16> {
    let mut words = decl.split_whitespace();
    if words.next()? != ".param" {
        return None;
    }
    let mut elem: Option<u16> = None;
    let mut last = "";
    for w in words {
        let bits = w
            .strip_prefix(".u")
            .or_else(|| w.strip_prefix(".s"))
            .or_else(|| w.strip_prefix(".b"))
            .or_else(|| w.strip_prefix(".f"))
            .and_then(|b| b.parse::<u16>().ok());
        if let Some(bits) = bits {
            elem = Some(bits / 8);
        }
        last = w;
    }
    let elem = elem?;
    match last.find('[') {
        Some(i) => {
            let n: u16 = last[i + 1..].strip_suffix(']')?.parse().ok()?;
            elem.checked_mul(n)
        }
        None => Some(elem),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{self, Arch, CompileConfig};
    use crate::device::DeviceError;

    #[test]
    fn arguments_pack_into_their_first_bytes() {
        let args = [
            Arg::Ptr(0x1234_5678_9abc_def0),
            Arg::I32(-2),
            Arg::U32(7),
            Arg::F32(1.5),
            Arg::U64(u64::MAX - 1),
        ];
        let mut p = PackedArgs::new(&args).unwrap();
        assert_eq!(p.len(), 5);
        assert_eq!(p.sizes(), &[8, 4, 4, 4, 8]);
        let ptrs = p.pointers();
        assert!(ptrs[5..].iter().all(|q| q.is_null()));
        // SAFETY: each pointer points at an 8-byte slot of `p`, alive here.
        unsafe {
            assert_eq!(*(ptrs[0] as *const u64), 0x1234_5678_9abc_def0);
            assert_eq!(*(ptrs[1] as *const i32), -2);
            assert_eq!(*(ptrs[2] as *const u32), 7);
            assert_eq!(*(ptrs[3] as *const f32), 1.5);
            assert_eq!(*(ptrs[4] as *const u64), u64::MAX - 1);
        }
        assert!(PackedArgs::new(&[]).unwrap().is_empty());
        assert!(PackedArgs::new(&[Arg::I32(0); MAX_ARGS]).is_ok());
        assert!(matches!(
            PackedArgs::new(&[Arg::I32(0); MAX_ARGS + 1]),
            Err(DeviceError::Shape { what: "launch", .. })
        ));
    }

    #[test]
    fn ptx_entry_parameters_are_read() {
        let ptx = "
.visible .entry other(
\t.param .u32 other_param_0
)
.visible .entry k(
\t.param .u64 .ptr .align 4 k_param_0,
\t.param .u64 k_param_1,
\t.param .f32 k_param_2,
\t.param .u32 k_param_3,
\t.param .align 4 .b8 k_param_4[16],
\t.param .u64 k_param_5
)
{
\tret;
}
.visible .entry none()
{
}
";
        assert_eq!(entry_params(ptx, "k"), Some(vec![8, 8, 4, 4, 16, 8]));
        assert_eq!(entry_params(ptx, "other"), Some(vec![4]));
        assert_eq!(entry_params(ptx, "none"), Some(vec![]));
        assert_eq!(entry_params(ptx, "absent"), None);
        assert_eq!(entry_params(".entry bad(\n.param .weird x\n)", "bad"), None);
    }

    /// Every kernel's PTX declaration is understood, and takes only
    /// parameters an [`Arg`] can pass (4 or 8 bytes: no struct by value).
    /// Needs NVRTC: `scripts/check-kernels` sets it up and runs it.
    #[test]
    #[ignore = "needs NVRTC: scripts/check-kernels runs it"]
    fn every_kernel_declaration_parses() {
        let include = compile::nvrtc_version()
            .map_err(|e| e.to_string())
            .and_then(|_| compile::cuda_include_dirs(&[]).map_err(|e| e.to_string()))
            .expect("NVRTC and the CUDA headers (scripts/check-kernels installs them)");
        let cfg = CompileConfig::new(Arch::parse("sm_90").unwrap(), include);
        for c in compile::compile_all(&cfg).unwrap() {
            for &k in c.module.kernels {
                let p = entry_params(&c.ptx, k);
                assert!(
                    p.as_ref()
                        .is_some_and(|p| !p.is_empty() && p.len() <= MAX_ARGS),
                    "{k}: {p:?}"
                );
                assert!(p.unwrap().iter().all(|&s| s == 4 || s == 8), "{k}");
            }
        }
    }
}
