//! Tests of the checkpoint reader ([`super`]) on safetensors files written
//! here: stacked projections read under the split names and cut by the shape
//! asked, bf16 conversion, raw takes, errors naming the tensor, and a garbage
//! file refused.

use super::*;
use safetensors::tensor::TensorView;

fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn stacked_projections_read_as_split() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    // Two steps of a width-2 attention: in_proj [2·3·2, 2], out_proj [2·2, 2].
    let inp: Vec<f32> = (0..24).map(|x| x as f32).collect();
    let out: Vec<f32> = (0..8).map(|x| 100.0 + x as f32).collect();
    write(
        &p,
        &[
            (
                "l.self_attn.in_proj_weight",
                Dtype::F32,
                vec![12, 2],
                f32_bytes(&inp),
            ),
            (
                "l.self_attn.out_proj.weight",
                Dtype::F32,
                vec![4, 2],
                f32_bytes(&out),
            ),
        ],
    );
    let mut w = Weights::open(&p).unwrap();
    assert_eq!(
        w.take("l.self_attn.in_projs.1.weight", &[6, 2]).unwrap(),
        inp[12..].to_vec()
    );
    assert_eq!(
        w.take("l.self_attn.in_projs.0.weight", &[6, 2]).unwrap(),
        inp[..12].to_vec()
    );
    assert_eq!(
        w.take("l.self_attn.out_projs.1.weight", &[2, 2]).unwrap(),
        out[4..].to_vec()
    );
    let e = w
        .take("l.self_attn.out_projs.0.weight", &[3, 2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("out_projs.0") && e.contains("out_proj.weight") && e.contains("[4, 2]"),
        "{e}"
    );
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("out_projs.0"), "{e}");
}

#[test]
fn stacked_projections_are_cut_by_the_shape_asked() {
    // Grouped-query attention, width 4, one key/value head of 2: a step's
    // in-projection has 4 + 2·2 = 8 rows, which the file cannot tell
    // from 3·4 = 12. Three steps: [24, 4] — also a multiple of 12.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    let inp: Vec<f32> = (0..96).map(|x| x as f32).collect();
    write(
        &p,
        &[(
            "l.self_attn.in_proj_weight",
            Dtype::F32,
            vec![24, 4],
            f32_bytes(&inp),
        )],
    );
    let ck = Checkpoint::open(&p).unwrap();
    let specs: Vec<TensorSpec> = (0..3)
        .map(|i| TensorSpec::new(format!("l.self_attn.in_projs.{i}.weight"), &[8, 4]))
        .collect();
    assert_eq!(ck.validate(&specs).unwrap(), 96);
    // Two steps of 8 rows leave the third unexplained, named.
    let e = ck.validate(&specs[..2]).unwrap_err().to_string();
    assert!(
        e.contains("unexpected tensor `l.self_attn.in_projs.2.weight`"),
        "{e}"
    );
    // A step beyond the stack, or rows that do not divide it, are refused.
    let e = ck
        .validate(&[TensorSpec::new("l.self_attn.in_projs.3.weight", &[8, 4])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("in_projs.3") && e.contains("[24, 4]"), "{e}");
    let e = ck
        .validate(&[TensorSpec::new("l.self_attn.in_projs.0.weight", &[7, 4])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be cut"), "{e}");
    let mut w = Weights::open(&p).unwrap();
    assert_eq!(
        w.take("l.self_attn.in_projs.2.weight", &[8, 4]).unwrap(),
        inp[64..].to_vec()
    );
    assert!(w.contains("l.self_attn.in_projs.0.weight"));
    // Nothing asked of the stack: the stacked tensor itself is named.
    let e = Checkpoint::open(&p)
        .unwrap()
        .validate(&[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`l.self_attn.in_proj_weight`"), "{e}");
}

#[test]
fn bf16_and_errors_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    let vals = [1.5f32, -2.0, 0.25];
    let bf: Vec<u8> = vals
        .iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect();
    write(
        &p,
        &[
            ("a", Dtype::BF16, vec![3], bf),
            ("ints", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec()),
        ],
    );
    let mut w = Weights::open(&p).unwrap();
    assert_eq!(w.take("a", &[3]).unwrap(), vals.to_vec());
    let e = w.take("missing", &[1]).unwrap_err().to_string();
    assert!(e.contains("missing tensor `missing`"), "{e}");
    let e = w.take("ints", &[1]).unwrap_err().to_string();
    assert!(e.contains("`ints`") && e.contains("I64"), "{e}");
    let ck = w.checkpoint();
    let e = ck
        .validate(&[TensorSpec::new("a", &[3])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unexpected tensor `ints`"), "{e}");
}

#[test]
fn raw_takes_are_the_stored_bytes_of_split_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    let inp: Vec<f32> = (0..24).map(|x| x as f32 - 7.5).collect();
    let bf: Vec<u8> = inp
        .iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect();
    let hf: Vec<u8> = [0.5f32, -3.0]
        .iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect();
    write(
        &p,
        &[
            (
                "l.self_attn.in_proj_weight",
                Dtype::BF16,
                vec![12, 2],
                bf.clone(),
            ),
            ("h", Dtype::F16, vec![2], hf.clone()),
            ("f", Dtype::F32, vec![2], f32_bytes(&[1.25, 9.0])),
        ],
    );
    let mut w = Weights::open(&p).unwrap();
    let step1 = w
        .take_raw("l.self_attn.in_projs.1.weight", &[6, 2])
        .unwrap();
    assert_eq!(step1.dtype, RawDtype::Bf16);
    assert_eq!(step1.bytes, &bf[24..]);
    assert_eq!(step1.numel(), 12);
    assert_eq!(step1.get_f32(0), inp[12]);
    let h = w.take_raw("h", &[2]).unwrap();
    assert_eq!((h.dtype, h.bytes), (RawDtype::F16, &hf[..]));
    assert_eq!(h.get_f32(1), -3.0);
    let e = w.take_raw("f", &[3]).unwrap_err().to_string();
    assert!(e.contains("`f`") && e.contains("[3]"), "{e}");
    assert_eq!(w.take_raw("f", &[2]).unwrap().get_f32(0), 1.25);
    // Only what was taken counts: step 0 is still missing.
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("in_projs.0"), "{e}");
}

#[test]
fn garbage_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.safetensors");
    std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
    assert!(matches!(
        Weights::open(&p),
        Err(CheckpointError::Format { .. })
    ));
}
