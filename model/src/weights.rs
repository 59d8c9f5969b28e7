//! Checkpoint files: safetensors read through mmap, with the official tensor
//! names, into float32 for the CPU backend; and header-only validation.
//!
//! Two naming schemes exist for attention projections and both load: the
//! published checkpoints stack every step's projection into one tensor
//! (`…self_attn.in_proj_weight` `[n·r, d]`, `…self_attn.out_proj.weight`
//! `[n·d, d]`), the current official code saves them split
//! (`…self_attn.in_projs.{i}.weight`, `…self_attn.out_projs.{i}.weight`). The
//! reader presents the split names whatever the file holds, so model code asks
//! for one scheme only. A stacked tensor is cut when a part is asked for, by
//! the shape asked (as the official loader's `weight.view(mult, -1, d)` cuts
//! it by the module's step count): the rows of one step (`r = 3·d`, or
//! `d + 2·kv_dim` with grouped-query attention) cannot be told from the file.
//!
//! Invariants: a tensor is handed out at most once ([`Weights::take`]); a
//! missing tensor, a wrong shape or an unsupported dtype is an error naming the
//! tensor; [`Weights::finish`] refuses a checkpoint with tensors nobody asked for.

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A checkpoint that cannot be used, naming the file and tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The safetensors header is invalid.
    #[error("{path}: not a valid safetensors file: {why}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        why: String,
    },
    /// A tensor the model needs is absent.
    #[error("{path}: missing tensor `{name}`")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// A tensor has another shape than the configuration implies.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Shape in the file.
        found: Vec<usize>,
        /// Shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A tensor is stored in a type we do not read.
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected BF16, F16 or F32")]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor the configuration does not explain.
    #[error("{path}: unexpected tensor `{name}` (the configuration does not use it)")]
    Extra {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
    },
    /// The memory for a tensor's values could not be had.
    #[error("{path}: tensor `{name}`: {source}")]
    Alloc {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// What the allocator refused.
        source: crate::alloc::AllocError,
    },
    /// A LoRA adapter that cannot be merged exactly.
    #[error("{path}: LoRA adapter refused: {why}")]
    Lora {
        /// The adapter file.
        path: PathBuf,
        /// What is wrong, naming the tensor.
        why: String,
    },
    /// A stacked attention tensor that cannot be split evenly.
    #[error("{path}: stacked tensor `{name}` of shape {shape:?} cannot be split into per-step projections")]
    BadStack {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A per-step projection that its stacked tensor does not hold.
    #[error(
        "{path}: tensor `{name}` of shape {expected:?} cannot be cut from stacked `{stacked}` of shape {found:?}"
    )]
    StackPart {
        /// The file.
        path: PathBuf,
        /// The split-scheme name asked for.
        name: String,
        /// The stacked tensor in the file.
        stacked: String,
        /// Its shape.
        found: Vec<usize>,
        /// The shape of one step the configuration implies.
        expected: Vec<usize>,
    },
}

/// The name and shape of one tensor a configuration requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Official (split-scheme) name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from a name and a shape.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// Number of values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Where a split-scheme tensor lives in the file.
#[derive(Debug, Clone)]
struct Entry {
    dtype: Dtype,
    /// Shape of this (possibly split-out) tensor.
    shape: Vec<usize>,
    /// Byte offset of its first value in the mapped file.
    byte_start: usize,
}

/// A stacked attention tensor of the file, cut into steps on demand.
#[derive(Debug, Clone)]
struct Stacked {
    /// Its name in the file.
    name: String,
    dtype: Dtype,
    /// `[steps · rows per step, cols]`.
    shape: Vec<usize>,
    byte_start: usize,
}

/// A safetensors file, indexed by split-scheme names: mapped for loading
/// ([`Checkpoint::open`]), or its header alone for validation
/// ([`Checkpoint::open_header`]).
pub struct Checkpoint {
    path: PathBuf,
    /// `None` for a header-only open.
    mmap: Option<Mmap>,
    entries: BTreeMap<String, Entry>,
    /// Stacked tensors by split-scheme prefix (`….self_attn.in_projs`).
    stacks: BTreeMap<String, Stacked>,
}

/// `(prefix, i)` of a split-scheme per-step name `{prefix}.{i}.weight`.
fn split_part(name: &str) -> Option<(&str, usize)> {
    let rest = name.strip_suffix(".weight")?;
    let (prefix, i) = rest.rsplit_once('.')?;
    Some((prefix, i.parse().ok()?))
}

const IN_STACKED: &str = ".self_attn.in_proj_weight";
const OUT_STACKED: &str = ".self_attn.out_proj.weight";

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

/// Reads and checks a safetensors header from the file itself (never more
/// than the header): the tensors, and where the data region starts.
fn read_header(path: &Path, file: &mut File) -> Result<(Metadata, usize), CheckpointError> {
    use std::io::Read;
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let format = |why: String| CheckpointError::Format {
        path: path.to_path_buf(),
        why,
    };
    let file_len = file.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|e| format(format!("no header ({e})")))?;
    let n = u64::from_le_bytes(len);
    // safetensors' own bound on a header (100 MB).
    if n > 100_000_000 || 8 + n > file_len {
        return Err(format(format!(
            "header of {n} bytes in a file of {file_len}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(io)?;
    let text = std::str::from_utf8(&header).map_err(|e| format(e.to_string()))?;
    let meta: Metadata = serde_json::from_str(text).map_err(|e| format(e.to_string()))?;
    // What `SafeTensors::deserialize` checks, without the data in memory:
    // the tensors tile the data region exactly, each its dtype × shape.
    let mut spans: Vec<(usize, usize, usize)> = meta
        .tensors()
        .values()
        .map(|t| {
            let bytes = t.shape.iter().product::<usize>() * t.dtype.bitsize() / 8;
            (t.data_offsets.0, t.data_offsets.1, bytes)
        })
        .collect();
    spans.sort_unstable();
    let mut end = 0;
    for (start, stop, bytes) in &spans {
        if *start != end || stop.checked_sub(*start) != Some(*bytes) {
            return Err(format(format!(
                "tensor data offsets {start}..{stop} do not tile the data region"
            )));
        }
        end = *stop;
    }
    if 8 + n + end as u64 != file_len {
        return Err(format(format!(
            "the header describes {} bytes of data, the file holds {}",
            end,
            file_len - 8 - n
        )));
    }
    Ok((meta, 8 + n as usize))
}

impl Checkpoint {
    /// Maps a file and reads its header. Touches no tensor data.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let mut ck = Self::open_header(path)?;
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the file is mapped read-only; a checkpoint modified while
        // mapped is outside what we support (as for every mmap-based loader),
        // and every view into the map is bounds-checked (the header was
        // checked against the file's length).
        ck.mmap = Some(unsafe { Mmap::map(&file) }.map_err(io)?);
        Ok(ck)
    }

    /// Reads a file's header only: names, shapes and dtypes, for
    /// validation. Reads and maps nothing else, so a checkpoint of any size
    /// is checked in milliseconds and within any memory limit; its tensors
    /// cannot be read ([`Checkpoint::raw`] and [`Checkpoint::read_f32`] fail).
    pub fn open_header(path: &Path) -> Result<Self, CheckpointError> {
        let mut file = File::open(path).map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let (meta, data_start) = read_header(path, &mut file)?;
        let mut entries = BTreeMap::new();
        let mut stacks = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let shape = info.shape.clone();
            let dtype = info.dtype;
            let byte_start = data_start + info.data_offsets.0;
            let prefix = if let Some(head) = name.strip_suffix(IN_STACKED) {
                Some(format!("{head}.self_attn.in_projs"))
            } else {
                name.strip_suffix(OUT_STACKED)
                    .map(|head| format!("{head}.self_attn.out_projs"))
            };
            match prefix {
                Some(prefix) => {
                    if shape.len() != 2 || shape[0] == 0 || shape[1] == 0 {
                        return Err(CheckpointError::BadStack {
                            path: path.to_path_buf(),
                            name,
                            shape,
                        });
                    }
                    stacks.insert(
                        prefix,
                        Stacked {
                            name,
                            dtype,
                            shape,
                            byte_start,
                        },
                    );
                }
                None => {
                    entries.insert(
                        name,
                        Entry {
                            dtype,
                            shape,
                            byte_start,
                        },
                    );
                }
            }
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            mmap: None,
            entries,
            stacks,
        })
    }

    /// The mapped file; an error for a header-only open.
    fn mapped(&self) -> Result<&Mmap, CheckpointError> {
        self.mmap.as_ref().ok_or_else(|| CheckpointError::Io {
            path: self.path.clone(),
            source: std::io::Error::other("opened for its header only"),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names and shapes of every tensor in the file: split-scheme names,
    /// and stacked attention tensors under their own names (they are cut
    /// only by the shape a configuration asks for).
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[usize])> {
        self.entries
            .iter()
            .map(|(k, e)| (k.as_str(), e.shape.as_slice()))
            .chain(
                self.stacks
                    .values()
                    .map(|s| (s.name.as_str(), s.shape.as_slice())),
            )
    }

    /// The first tensor of the file that `used` (split-scheme names) does not
    /// account for: a plain tensor not named, or a part of a stacked tensor
    /// whose step was not named (the whole stack when none was).
    fn first_unused(&self, used: &HashMap<&str, &[usize]>) -> Option<String> {
        if let Some(name) = self.entries.keys().find(|k| !used.contains_key(k.as_str())) {
            return Some(name.clone());
        }
        for (prefix, st) in &self.stacks {
            // The rows of one step, from any part that was used.
            let rows = used.iter().find_map(|(n, shape)| {
                split_part(n)
                    .filter(|(p, _)| p == prefix)
                    .and_then(|_| shape.first().copied())
            });
            let Some(rows) = rows.filter(|&r| r > 0) else {
                return Some(st.name.clone());
            };
            for i in 0..st.shape[0] / rows {
                let part = format!("{prefix}.{i}.weight");
                if !used.contains_key(part.as_str()) {
                    return Some(part);
                }
            }
        }
        None
    }

    /// Checks names, shapes and dtypes against what a configuration needs,
    /// without reading tensor data. Returns the number of parameters.
    pub fn validate(&self, specs: &[TensorSpec]) -> Result<usize, CheckpointError> {
        let mut wanted: HashMap<&str, &[usize]> = HashMap::new();
        let mut params = 0;
        for s in specs {
            let e = self.entry(&s.name, &s.shape)?;
            params += e.shape.iter().product::<usize>();
            wanted.insert(s.name.as_str(), s.shape.as_slice());
        }
        match self.first_unused(&wanted) {
            Some(name) => Err(CheckpointError::Extra {
                path: self.path.clone(),
                name,
            }),
            None => Ok(params),
        }
    }

    /// The stored tensor `name` of `shape`: a plain entry, or step `i` of
    /// a stacked tensor cut into parts of `shape`.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<Entry, CheckpointError> {
        let e = match self.entries.get(name) {
            Some(e) => e.clone(),
            None => self.stack_part(name, shape)?,
        };
        if e.shape != shape {
            return Err(CheckpointError::Shape {
                path: self.path.clone(),
                name: name.to_string(),
                found: e.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        if !matches!(e.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(CheckpointError::Dtype {
                path: self.path.clone(),
                name: name.to_string(),
                dtype: dtype_name(e.dtype),
            });
        }
        Ok(e)
    }

    /// Step `i` of the stacked tensor holding `{prefix}.{i}.weight`, cut in
    /// parts of `shape` (`[rows, cols]`).
    fn stack_part(&self, name: &str, shape: &[usize]) -> Result<Entry, CheckpointError> {
        let missing = || CheckpointError::Missing {
            path: self.path.clone(),
            name: name.to_string(),
        };
        let (prefix, i) = split_part(name).ok_or_else(missing)?;
        let st = self.stacks.get(prefix).ok_or_else(missing)?;
        let (rows, cols) = (st.shape[0], st.shape[1]);
        let fits = shape.len() == 2
            && shape[0] > 0
            && shape[1] == cols
            && rows.is_multiple_of(shape[0])
            && i < rows / shape[0];
        if !fits {
            return Err(CheckpointError::StackPart {
                path: self.path.clone(),
                name: name.to_string(),
                stacked: st.name.clone(),
                found: st.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        let elem_bytes = if st.dtype == Dtype::F32 { 4 } else { 2 };
        Ok(Entry {
            dtype: st.dtype,
            shape: shape.to_vec(),
            byte_start: st.byte_start + i * shape[0] * cols * elem_bytes,
        })
    }

    /// One tensor's stored bytes, in the mapped file (no copy, no
    /// conversion): for loaders that convert straight into their own buffers.
    pub fn raw(&self, name: &str, shape: &[usize]) -> Result<RawTensor<'_>, CheckpointError> {
        let e = self.entry(name, shape)?;
        let dtype = match e.dtype {
            Dtype::F32 => RawDtype::F32,
            Dtype::BF16 => RawDtype::Bf16,
            Dtype::F16 => RawDtype::F16,
            _ => unreachable!("entry() admits float dtypes only"),
        };
        let numel: usize = e.shape.iter().product();
        let bytes = &self.mapped()?[e.byte_start..e.byte_start + numel * dtype.bytes()];
        Ok(RawTensor { dtype, bytes })
    }

    /// Reads one tensor as float32 (converting bf16/f16).
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let e = self.entry(name, shape)?;
        let numel: usize = e.shape.iter().product();
        let elem_bytes = if e.dtype == Dtype::F32 { 4 } else { 2 };
        let bytes = &self.mapped()?[e.byte_start..e.byte_start + numel * elem_bytes];
        // Fallible: a checkpoint too big for this machine is an error naming
        // the tensor, not an abort (the preflight should have said so first).
        let mut out =
            crate::alloc::with_capacity::<f32>(numel, || format!("{numel} float32 values"))
                .map_err(|source| CheckpointError::Alloc {
                    path: self.path.clone(),
                    name: name.to_string(),
                    source,
                })?;
        match e.dtype {
            Dtype::F32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Dtype::BF16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            Dtype::F16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            ),
            _ => unreachable!("entry() admits float dtypes only"),
        }
        Ok(out)
    }
}

/// How a checkpoint stores a tensor's values (little-endian, as safetensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawDtype {
    /// IEEE float32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE float16.
    F16,
}

impl RawDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            RawDtype::F32 => 4,
            RawDtype::Bf16 | RawDtype::F16 => 2,
        }
    }
}

/// A tensor's values as stored: `bytes.len() == numel · dtype.bytes()`,
/// row-major, little-endian.
#[derive(Debug, Clone, Copy)]
pub struct RawTensor<'a> {
    /// Storage type.
    pub dtype: RawDtype,
    /// The values' bytes.
    pub bytes: &'a [u8],
}

impl RawTensor<'_> {
    /// Number of values.
    pub fn numel(&self) -> usize {
        self.bytes.len() / self.dtype.bytes()
    }

    /// Value `i` as float32 (exact: bf16 and f16 widen without rounding).
    pub fn get_f32(&self, i: usize) -> f32 {
        let b = self.bytes;
        match self.dtype {
            RawDtype::F32 => {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
            RawDtype::Bf16 => half::bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
            RawDtype::F16 => half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32(),
        }
    }
}

/// The bytes of float32 values (little-endian hosts only, as every target).
fn f32_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the
    // slice covers exactly the values' memory and borrows `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Tensors of one checkpoint handed out by name, each once, with a LoRA
/// adapter merged into the tensors it adapts (see [`crate::lora`]).
pub struct Weights {
    ckpt: Checkpoint,
    /// Names and shapes handed out.
    taken: Vec<(String, Vec<usize>)>,
    lora: Option<crate::lora::LoraAdapter>,
    /// The last adapted tensor [`Weights::take_raw`] handed out.
    merged: Vec<f32>,
}

impl Weights {
    /// Opens a checkpoint for loading.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        Ok(Weights {
            ckpt: Checkpoint::open(path)?,
            taken: Vec::new(),
            lora: None,
            merged: Vec::new(),
        })
    }

    /// Opens a checkpoint whose tensors are read with `lora` merged in.
    pub fn open_with_lora(
        path: &Path,
        lora: crate::lora::LoraAdapter,
    ) -> Result<Self, CheckpointError> {
        let mut w = Self::open(path)?;
        w.lora = Some(lora);
        Ok(w)
    }

    /// The underlying file.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    /// Whether the file holds a tensor of that (split-scheme) name: a plain
    /// tensor, or a per-step name whose stacked tensor exists (whether that
    /// step exists depends on the shape asked for, see [`Weights::take`]).
    pub fn contains(&self, name: &str) -> bool {
        self.ckpt.entries.contains_key(name)
            || split_part(name).is_some_and(|(p, _)| self.ckpt.stacks.contains_key(p))
    }

    /// Takes a tensor of the given shape, as float32 in row-major order.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let mut v = self.ckpt.read_f32(name, shape)?;
        if let Some(l) = &self.lora {
            l.apply(name, shape, &mut v)?;
        }
        self.taken.push((name.to_string(), shape.to_vec()));
        Ok(v)
    }

    /// Takes a tensor of the given shape as stored in the file (see
    /// [`Checkpoint::raw`]); it counts as taken like [`Weights::take`].
    pub fn take_raw(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<RawTensor<'_>, CheckpointError> {
        self.ckpt.entry(name, shape)?;
        if self.lora.as_ref().is_some_and(|l| l.touches(name)) {
            self.merged = self.take(name, shape)?;
            return Ok(RawTensor {
                dtype: RawDtype::F32,
                bytes: f32_bytes(&self.merged),
            });
        }
        self.taken.push((name.to_string(), shape.to_vec()));
        self.ckpt.raw(name, shape)
    }

    /// Marks a tensor the model never uses as accounted for, after checking
    /// that it exists with that shape (its values are not read). For the
    /// depformer steps PersonaPlex stores but never computes.
    pub fn skip(&mut self, name: &str, shape: &[usize]) -> Result<(), CheckpointError> {
        self.ckpt.entry(name, shape)?;
        self.taken.push((name.to_string(), shape.to_vec()));
        Ok(())
    }

    /// Ends loading: every tensor in the file must have been taken.
    pub fn finish(self) -> Result<(), CheckpointError> {
        let taken: HashMap<&str, &[usize]> = self
            .taken
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
            .collect();
        match self.ckpt.first_unused(&taken) {
            Some(name) => Err(CheckpointError::Extra {
                path: self.ckpt.path.clone(),
                name,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
