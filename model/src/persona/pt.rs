//! NVIDIA's `.pt` voice prompts: a PyTorch zip pickle (`torch.save` of
//! `{"embeddings": tensor, "cache": tensor}`), read without executing any
//! pickle code.
//!
//! The zip holds stored (uncompressed) entries under one top folder:
//! `<stem>/data.pkl` (pickle protocol 2), `<stem>/data/<key>` (each
//! storage's raw little-endian values), `<stem>/byteorder` (`little`) and a
//! few others. The reader understands exactly the opcodes `torch.save`
//! emits for a dict of tensors; the only callables it evaluates are
//! `torch._utils._rebuild_tensor_v2` (which it interprets itself: storage,
//! offset, size, stride) and `collections.OrderedDict()` (an empty
//! mapping); any other global, opcode or shape is refused with an error
//! saying what and where. Storages may be float32, bfloat16 or float16
//! (embeddings) and int64 (the token ring); the storage's location
//! (`cpu`, `cuda:0`) is ignored.
//!
//! Invariants: never panics on any input; memory is bounded by the input's
//! size (a length is checked against the bytes left before anything is
//! sliced; the pickle machine's stack and memo are capped).

use std::collections::HashMap;

/// Largest `.pt` file read (a 10 s voice of the 7B model is ~1 MB).
pub const MAX_PT_BYTES: usize = 256 << 20;
const MAX_STACK: usize = 4096;
const MAX_MEMO: usize = 4096;

/// Why a `.pt` file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a voice prompt .pt file: {0}")]
pub struct PtError(pub String);

fn err<T>(why: impl Into<String>) -> Result<T, PtError> {
    Err(PtError(why.into()))
}

/// A tensor's values and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct PtTensor<T> {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub values: Vec<T>,
}

/// The contents of NVIDIA's voice prompt file.
#[derive(Debug, Clone, PartialEq)]
pub struct PtVoice {
    /// `[N − 1, 1, 1, dim]`: the summed input embedding of voice frames
    /// `1..N` (as float32).
    pub embeddings: PtTensor<f32>,
    /// `[1, num_codebooks, CT]`: `LMGen`'s token ring after the voice.
    pub cache: PtTensor<i64>,
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, PtError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .map_or_else(|| err(format!("zip: truncated at byte {at}")), Ok)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, PtError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .map_or_else(|| err(format!("zip: truncated at byte {at}")), Ok)
}

/// The stored entries of a zip archive, by name.
fn zip_entries(b: &[u8]) -> Result<HashMap<String, &[u8]>, PtError> {
    const EOCD: u32 = 0x0605_4b50;
    let lo = b.len().saturating_sub(22 + 65_535);
    let eocd = (lo..b.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(b, i).ok() == Some(EOCD))
        .ok_or_else(|| PtError("not a zip archive (no end of central directory)".into()))?;
    let count = u16_at(b, eocd + 10)? as usize;
    let mut at = u32_at(b, eocd + 16)? as usize;
    let mut out = HashMap::new();
    for _ in 0..count {
        if u32_at(b, at)? != 0x0201_4b50 {
            return err(format!("zip: bad central directory entry at byte {at}"));
        }
        let method = u16_at(b, at + 10)?;
        let csize = u32_at(b, at + 20)? as usize;
        let usize_ = u32_at(b, at + 24)? as usize;
        let name_len = u16_at(b, at + 28)? as usize;
        let extra_len = u16_at(b, at + 30)? as usize;
        let comment_len = u16_at(b, at + 32)? as usize;
        let local = u32_at(b, at + 42)? as usize;
        let name = b
            .get(at + 46..at + 46 + name_len)
            .ok_or_else(|| PtError("zip: truncated entry name".into()))?;
        let name = String::from_utf8_lossy(name).into_owned();
        at += 46 + name_len + extra_len + comment_len;
        if method != 0 || csize != usize_ {
            return err(format!(
                "zip entry `{name}` is compressed (torch.save stores entries)"
            ));
        }
        if u32_at(b, local)? != 0x0403_4b50 {
            return err(format!("zip: bad local header of `{name}`"));
        }
        let start = local + 30 + u16_at(b, local + 26)? as usize + u16_at(b, local + 28)? as usize;
        let data = b
            .get(start..start.saturating_add(csize))
            .ok_or_else(|| PtError(format!("zip entry `{name}` runs past the end of the file")))?;
        out.insert(name, data);
    }
    Ok(out)
}

/// A value of the restricted pickle machine.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Mark,
    None,
    Bool(bool),
    Int(i64),
    Str(String),
    Tuple(Vec<Val>),
    Dict(Vec<(Val, Val)>),
    Global(String),
    /// A storage reference: storage type name, key.
    Storage(String, String),
    Tensor {
        storage: String,
        key: String,
        offset: usize,
        size: Vec<usize>,
        stride: Vec<usize>,
    },
}

fn as_usizes(v: &Val, what: &str) -> Result<Vec<usize>, PtError> {
    match v {
        Val::Tuple(items) => items
            .iter()
            .map(|x| match x {
                Val::Int(i) if *i >= 0 => Ok(*i as usize),
                _ => err(format!("{what}: expected non-negative integers")),
            })
            .collect(),
        _ => err(format!("{what}: expected a tuple")),
    }
}

fn rebuild_tensor(args: Val) -> Result<Val, PtError> {
    let Val::Tuple(a) = args else {
        return err("_rebuild_tensor_v2: arguments are not a tuple");
    };
    if a.len() < 4 {
        return err("_rebuild_tensor_v2: too few arguments");
    }
    let Val::Storage(storage, key) = &a[0] else {
        return err("_rebuild_tensor_v2: the first argument is not a storage");
    };
    let Val::Int(offset) = a[1] else {
        return err("_rebuild_tensor_v2: bad storage offset");
    };
    Ok(Val::Tensor {
        storage: storage.clone(),
        key: key.clone(),
        offset: usize::try_from(offset).map_err(|_| PtError("negative storage offset".into()))?,
        size: as_usizes(&a[2], "tensor size")?,
        stride: as_usizes(&a[3], "tensor stride")?,
    })
}

/// Runs the restricted pickle machine over `data.pkl`; returns the top value.
fn unpickle(p: &[u8]) -> Result<Val, PtError> {
    let mut stack: Vec<Val> = Vec::new();
    let mut memo: HashMap<u32, Val> = HashMap::new();
    let mut i = 0usize;
    let take = |i: &mut usize, n: usize| -> Result<&[u8], PtError> {
        let s = p
            .get(*i..i.saturating_add(n))
            .ok_or_else(|| PtError(format!("pickle: truncated at byte {i}")))?;
        *i += n;
        Ok(s)
    };
    fn pop(stack: &mut Vec<Val>, at: usize) -> Result<Val, PtError> {
        stack
            .pop()
            .ok_or_else(|| PtError(format!("pickle: stack underflow at byte {at}")))
    }
    fn pop_mark(stack: &mut Vec<Val>, at: usize) -> Result<Vec<Val>, PtError> {
        let m = stack
            .iter()
            .rposition(|v| *v == Val::Mark)
            .ok_or_else(|| PtError(format!("pickle: no mark at byte {at}")))?;
        let items = stack.split_off(m + 1);
        stack.pop();
        Ok(items)
    }
    loop {
        if stack.len() > MAX_STACK || memo.len() > MAX_MEMO {
            return err("pickle: too deep");
        }
        let at = i;
        let op = take(&mut i, 1)?[0];
        match op {
            0x80 => {
                let v = take(&mut i, 1)?[0];
                if v > 2 {
                    return err(format!("pickle protocol {v} (torch.save writes 2)"));
                }
            }
            b'}' => stack.push(Val::Dict(Vec::new())),
            b')' => stack.push(Val::Tuple(Vec::new())),
            b'(' => stack.push(Val::Mark),
            b'N' => stack.push(Val::None),
            0x88 => stack.push(Val::Bool(true)),
            0x89 => stack.push(Val::Bool(false)),
            b'K' => stack.push(Val::Int(take(&mut i, 1)?[0] as i64)),
            b'M' => {
                let b = take(&mut i, 2)?;
                stack.push(Val::Int(u16::from_le_bytes([b[0], b[1]]) as i64))
            }
            b'J' => {
                let b = take(&mut i, 4)?;
                stack.push(Val::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64))
            }
            0x8a => {
                let n = take(&mut i, 1)?[0] as usize;
                let b = take(&mut i, n)?;
                if n > 8 {
                    return err("pickle: integer too large");
                }
                let mut buf = [0u8; 8];
                buf[..n].copy_from_slice(b);
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    buf[n..].fill(0xff);
                }
                stack.push(Val::Int(i64::from_le_bytes(buf)));
            }
            b'X' => {
                let b = take(&mut i, 4)?;
                let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                let s = take(&mut i, n)?;
                stack.push(Val::Str(String::from_utf8_lossy(s).into_owned()));
            }
            b'c' => {
                let rest = &p[i..];
                let nl1 = rest.iter().position(|&c| c == b'\n');
                let Some(nl1) = nl1 else {
                    return err("pickle: bad GLOBAL");
                };
                let nl2 = rest[nl1 + 1..].iter().position(|&c| c == b'\n');
                let Some(nl2) = nl2 else {
                    return err("pickle: bad GLOBAL");
                };
                let module = String::from_utf8_lossy(&rest[..nl1]);
                let name = String::from_utf8_lossy(&rest[nl1 + 1..nl1 + 1 + nl2]);
                stack.push(Val::Global(format!("{module}.{name}")));
                i += nl1 + nl2 + 2;
            }
            b'q' => {
                let k = take(&mut i, 1)?[0] as u32;
                memo.insert(k, stack.last().cloned().unwrap_or(Val::None));
            }
            b'r' => {
                let b = take(&mut i, 4)?;
                let k = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                memo.insert(k, stack.last().cloned().unwrap_or(Val::None));
            }
            b'h' | b'j' => {
                let k = if op == b'h' {
                    take(&mut i, 1)?[0] as u32
                } else {
                    let b = take(&mut i, 4)?;
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                };
                let v = memo
                    .get(&k)
                    .cloned()
                    .ok_or_else(|| PtError(format!("pickle: memo {k} unset at byte {at}")))?;
                stack.push(v);
            }
            b't' => {
                let items = pop_mark(&mut stack, at)?;
                stack.push(Val::Tuple(items));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return err(format!("pickle: stack underflow at byte {at}"));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Val::Tuple(items));
            }
            b'Q' => {
                let pid = pop(&mut stack, at)?;
                let Val::Tuple(t) = pid else {
                    return err("pickle: a persistent id that is not a tuple");
                };
                match t.as_slice() {
                    [Val::Str(tag), Val::Global(ty), Val::Str(key), _location, _numel]
                        if tag == "storage" =>
                    {
                        stack.push(Val::Storage(ty.clone(), key.clone()))
                    }
                    _ => return err("pickle: a persistent id that is not a torch storage"),
                }
            }
            b'R' => {
                let args = pop(&mut stack, at)?;
                let f = pop(&mut stack, at)?;
                let v = match &f {
                    Val::Global(g) if g == "torch._utils._rebuild_tensor_v2" => {
                        rebuild_tensor(args)?
                    }
                    Val::Global(g) if g == "collections.OrderedDict" => Val::Dict(Vec::new()),
                    Val::Global(g) => return err(format!("pickle: refusing to call `{g}`")),
                    _ => return err(format!("pickle: REDUCE on a non-callable at byte {at}")),
                };
                stack.push(v);
            }
            b's' => {
                let v = pop(&mut stack, at)?;
                let k = pop(&mut stack, at)?;
                match stack.last_mut() {
                    Some(Val::Dict(d)) => d.push((k, v)),
                    _ => return err("pickle: SETITEM without a dict"),
                }
            }
            b'u' => {
                let items = pop_mark(&mut stack, at)?;
                if items.len() % 2 != 0 {
                    return err("pickle: SETITEMS with an odd count");
                }
                let Some(Val::Dict(d)) = stack.last_mut() else {
                    return err("pickle: SETITEMS without a dict");
                };
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
            }
            b'.' => return pop(&mut stack, at),
            other => {
                return err(format!(
                "pickle: opcode 0x{other:02x} at byte {at} is not one torch.save emits for tensors"
            ))
            }
        }
    }
}

/// Bytes per element and a reader for a storage type.
fn storage_kind(ty: &str) -> Option<(usize, &'static str)> {
    Some(match ty.rsplit('.').next()? {
        "FloatStorage" => (4, "f32"),
        "BFloat16Storage" => (2, "bf16"),
        "HalfStorage" => (2, "f16"),
        "LongStorage" => (8, "i64"),
        _ => return None,
    })
}

/// The values of a tensor value (contiguous, row-major), decoded by `f`.
fn tensor_values<T>(
    t: &Val,
    name: &str,
    files: &HashMap<String, &[u8]>,
    root: &str,
    f: impl Fn(&'static str, &[u8]) -> Option<T>,
) -> Result<PtTensor<T>, PtError> {
    let Val::Tensor {
        storage,
        key,
        offset,
        size,
        stride,
    } = t
    else {
        return err(format!("`{name}` is not a tensor"));
    };
    let (elem, kind) = storage_kind(storage).ok_or_else(|| {
        PtError(format!(
            "`{name}`: storage type `{storage}` is not supported"
        ))
    })?;
    let mut expect = 1usize;
    for (&s, &st) in size.iter().zip(stride).rev() {
        if st != expect && s > 1 {
            return err(format!("`{name}` is not contiguous"));
        }
        expect = expect
            .checked_mul(s)
            .ok_or_else(|| PtError(format!("`{name}`: size overflows")))?;
    }
    if size.len() != stride.len() {
        return err(format!("`{name}`: size and stride differ in length"));
    }
    let data = files
        .get(&format!("{root}/data/{key}"))
        .ok_or_else(|| PtError(format!("`{name}`: storage `{key}` is missing")))?;
    let start = offset.checked_mul(elem);
    let len = expect.checked_mul(elem);
    let bytes = match (start, len) {
        (Some(s), Some(l)) => data.get(s..s.saturating_add(l)),
        _ => None,
    }
    .ok_or_else(|| PtError(format!("`{name}`: storage `{key}` is too short")))?;
    let values = bytes
        .chunks_exact(elem)
        .map(|c| f(kind, c))
        .collect::<Option<Vec<T>>>()
        .ok_or_else(|| PtError(format!("`{name}`: unexpected storage type `{storage}`")))?;
    Ok(PtTensor {
        shape: size.clone(),
        values,
    })
}

fn float_of(kind: &str, c: &[u8]) -> Option<f32> {
    match kind {
        "f32" => Some(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        "bf16" => Some(half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        "f16" => Some(half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        _ => None,
    }
}

fn long_of(kind: &str, c: &[u8]) -> Option<i64> {
    (kind == "i64").then(|| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
}

/// Reads a `.pt` voice prompt from its bytes.
pub fn read_pt(bytes: &[u8]) -> Result<PtVoice, PtError> {
    if bytes.len() > MAX_PT_BYTES {
        return err(format!("larger than {MAX_PT_BYTES} bytes"));
    }
    let files = zip_entries(bytes)?;
    let pkl = files
        .keys()
        .find(|k| k.ends_with("/data.pkl") && k.matches('/').count() == 1)
        .cloned()
        .ok_or_else(|| PtError("no `<name>/data.pkl` in the archive".into()))?;
    let root = pkl.trim_end_matches("/data.pkl").to_string();
    if let Some(order) = files.get(&format!("{root}/byteorder")) {
        if *order != b"little" {
            return err("the byte order is not little-endian");
        }
    }
    let top = unpickle(files[&pkl])?;
    let Val::Dict(items) = top else {
        return err("the pickle is not a dict");
    };
    let get = |k: &str| {
        items
            .iter()
            .find(|(key, _)| *key == Val::Str(k.into()))
            .map(|(_, v)| v)
            .ok_or_else(|| PtError(format!("no `{k}` entry")))
    };
    let embeddings = tensor_values(get("embeddings")?, "embeddings", &files, &root, float_of)?;
    let cache = tensor_values(get("cache")?, "cache", &files, &root, long_of)?;
    Ok(PtVoice { embeddings, cache })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Vec<u8> {
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/golden-next/personaplex-tiny/voice_b.pt"
        ))
        .unwrap()
    }

    #[test]
    fn reads_the_fixture_voice() {
        let v = read_pt(&fixture()).unwrap();
        assert_eq!(v.embeddings.shape, [14, 1, 1, 64]);
        assert_eq!(v.cache.shape, [1, 17, 4]);
        assert!(v.embeddings.values.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn truncations_and_corruptions_are_errors_not_panics() {
        let good = fixture();
        for n in (0..good.len()).step_by(97) {
            let _ = read_pt(&good[..n]);
        }
        let mut bad = good.clone();
        for i in (0..bad.len()).step_by(53) {
            bad[i] ^= 0x5a;
            let _ = read_pt(&bad);
            bad[i] ^= 0x5a;
        }
        assert!(read_pt(b"not a zip").is_err());
    }
}
