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
///
/// One arm per opcode; each opcode's work is a [`Machine`] method.
fn unpickle(p: &[u8]) -> Result<Val, PtError> {
    let mut m = Machine {
        p,
        i: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        if m.stack.len() > MAX_STACK || m.memo.len() > MAX_MEMO {
            return err("pickle: too deep");
        }
        let at = m.i;
        let op = m.take(1)?[0];
        match op {
            0x80 => m.protocol()?,
            b'}' => m.stack.push(Val::Dict(Vec::new())),
            b')' => m.stack.push(Val::Tuple(Vec::new())),
            b'(' => m.stack.push(Val::Mark),
            b'N' => m.stack.push(Val::None),
            0x88 => m.stack.push(Val::Bool(true)),
            0x89 => m.stack.push(Val::Bool(false)),
            b'K' => {
                let v = m.take(1)?[0] as i64;
                m.stack.push(Val::Int(v));
            }
            b'M' => {
                let b = m.take(2)?;
                m.stack
                    .push(Val::Int(u16::from_le_bytes([b[0], b[1]]) as i64))
            }
            b'J' => {
                let b = m.take(4)?;
                m.stack
                    .push(Val::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64))
            }
            0x8a => m.long1()?,
            b'X' => m.binunicode()?,
            b'c' => m.global()?,
            b'q' => {
                let k = m.take(1)?[0] as u32;
                m.memo_put(k);
            }
            b'r' => {
                let k = m.u32_arg()?;
                m.memo_put(k);
            }
            b'h' => {
                let k = m.take(1)?[0] as u32;
                m.memo_get(k, at)?;
            }
            b'j' => {
                let k = m.u32_arg()?;
                m.memo_get(k, at)?;
            }
            b't' => {
                let items = m.pop_mark(at)?;
                m.stack.push(Val::Tuple(items));
            }
            0x85..=0x87 => m.tuple_n((op - 0x84) as usize, at)?,
            b'Q' => m.persistent_id(at)?,
            b'R' => m.reduce(at)?,
            b's' => m.set_item(at)?,
            b'u' => m.set_items(at)?,
            b'.' => return m.pop(at),
            other => {
                return err(format!(
                "pickle: opcode 0x{other:02x} at byte {at} is not one torch.save emits for tensors"
            ))
            }
        }
    }
}

/// The restricted pickle machine's state: the input and read position, the
/// value stack and the memo. Every method reads its opcode's arguments (the
/// opcode itself already taken) and refuses what it cannot do with an error.
struct Machine<'a> {
    p: &'a [u8],
    i: usize,
    stack: Vec<Val>,
    memo: HashMap<u32, Val>,
}

impl<'a> Machine<'a> {
    /// The next `n` bytes, or an error if the input ends first.
    fn take(&mut self, n: usize) -> Result<&'a [u8], PtError> {
        let i = self.i;
        let s = self
            .p
            .get(i..i.saturating_add(n))
            .ok_or_else(|| PtError(format!("pickle: truncated at byte {i}")))?;
        self.i += n;
        Ok(s)
    }

    /// A 4-byte little-endian unsigned argument.
    fn u32_arg(&mut self) -> Result<u32, PtError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The top of the stack (`at`: the opcode's byte, for the error).
    fn pop(&mut self, at: usize) -> Result<Val, PtError> {
        self.stack
            .pop()
            .ok_or_else(|| PtError(format!("pickle: stack underflow at byte {at}")))
    }

    /// The values above the topmost mark, the mark removed.
    fn pop_mark(&mut self, at: usize) -> Result<Vec<Val>, PtError> {
        let m = self
            .stack
            .iter()
            .rposition(|v| *v == Val::Mark)
            .ok_or_else(|| PtError(format!("pickle: no mark at byte {at}")))?;
        let items = self.stack.split_off(m + 1);
        self.stack.pop();
        Ok(items)
    }

    /// PROTO: only the protocols up to the one `torch.save` writes.
    fn protocol(&mut self) -> Result<(), PtError> {
        let v = self.take(1)?[0];
        if v > 2 {
            return err(format!("pickle protocol {v} (torch.save writes 2)"));
        }
        Ok(())
    }

    /// LONG1: a little-endian two's complement integer of up to 8 bytes.
    fn long1(&mut self) -> Result<(), PtError> {
        let n = self.take(1)?[0] as usize;
        let b = self.take(n)?;
        if n > 8 {
            return err("pickle: integer too large");
        }
        let mut buf = [0u8; 8];
        buf[..n].copy_from_slice(b);
        if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
            buf[n..].fill(0xff);
        }
        self.stack.push(Val::Int(i64::from_le_bytes(buf)));
        Ok(())
    }

    /// BINUNICODE: a string with a 4-byte length (invalid UTF-8 replaced).
    fn binunicode(&mut self) -> Result<(), PtError> {
        let n = self.u32_arg()? as usize;
        let s = self.take(n)?;
        self.stack
            .push(Val::Str(String::from_utf8_lossy(s).into_owned()));
        Ok(())
    }

    /// GLOBAL: `module\nname\n`, pushed as a name only (nothing is imported;
    /// REDUCE decides what a global may do).
    fn global(&mut self) -> Result<(), PtError> {
        let rest = &self.p[self.i..];
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
        self.stack.push(Val::Global(format!("{module}.{name}")));
        self.i += nl1 + nl2 + 2;
        Ok(())
    }

    /// BINPUT / LONG_BINPUT: memoises the top of the stack (`None` if empty).
    fn memo_put(&mut self, k: u32) {
        self.memo
            .insert(k, self.stack.last().cloned().unwrap_or(Val::None));
    }

    /// BINGET / LONG_BINGET: pushes a memoised value.
    fn memo_get(&mut self, k: u32, at: usize) -> Result<(), PtError> {
        let v = self
            .memo
            .get(&k)
            .cloned()
            .ok_or_else(|| PtError(format!("pickle: memo {k} unset at byte {at}")))?;
        self.stack.push(v);
        Ok(())
    }

    /// TUPLE1..TUPLE3: the top `n` values as a tuple.
    fn tuple_n(&mut self, n: usize, at: usize) -> Result<(), PtError> {
        if self.stack.len() < n {
            return err(format!("pickle: stack underflow at byte {at}"));
        }
        let items = self.stack.split_off(self.stack.len() - n);
        self.stack.push(Val::Tuple(items));
        Ok(())
    }

    /// BINPERSID: only a torch storage reference
    /// `("storage", type, key, location, numel)`.
    fn persistent_id(&mut self, at: usize) -> Result<(), PtError> {
        let pid = self.pop(at)?;
        let Val::Tuple(t) = pid else {
            return err("pickle: a persistent id that is not a tuple");
        };
        match t.as_slice() {
            [Val::Str(tag), Val::Global(ty), Val::Str(key), _location, _numel]
                if tag == "storage" =>
            {
                self.stack.push(Val::Storage(ty.clone(), key.clone()))
            }
            _ => return err("pickle: a persistent id that is not a torch storage"),
        }
        Ok(())
    }

    /// REDUCE: only the two callables `torch.save` uses for a dict of
    /// tensors, both interpreted here; any other global is refused.
    fn reduce(&mut self, at: usize) -> Result<(), PtError> {
        let args = self.pop(at)?;
        let f = self.pop(at)?;
        let v = match &f {
            Val::Global(g) if g == "torch._utils._rebuild_tensor_v2" => rebuild_tensor(args)?,
            Val::Global(g) if g == "collections.OrderedDict" => Val::Dict(Vec::new()),
            Val::Global(g) => return err(format!("pickle: refusing to call `{g}`")),
            _ => return err(format!("pickle: REDUCE on a non-callable at byte {at}")),
        };
        self.stack.push(v);
        Ok(())
    }

    /// SETITEM: one key and value into the dict below them.
    fn set_item(&mut self, at: usize) -> Result<(), PtError> {
        let v = self.pop(at)?;
        let k = self.pop(at)?;
        match self.stack.last_mut() {
            Some(Val::Dict(d)) => d.push((k, v)),
            _ => return err("pickle: SETITEM without a dict"),
        }
        Ok(())
    }

    /// SETITEMS: the key/value pairs above the mark into the dict below it.
    fn set_items(&mut self, at: usize) -> Result<(), PtError> {
        let items = self.pop_mark(at)?;
        if items.len() % 2 != 0 {
            return err("pickle: SETITEMS with an odd count");
        }
        let Some(Val::Dict(d)) = self.stack.last_mut() else {
            return err("pickle: SETITEMS without a dict");
        };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
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
