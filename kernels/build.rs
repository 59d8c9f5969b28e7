//! Builds the emulator device's native half (`src/device/emu/`): every
//! kernel source of `cuda/` compiled for the host by the system C++ compiler
//! (g++ or clang++, C++17), with the CUDA stand-ins of `emu/cuda_emu.h` and the
//! fiber scheduler of `emu/emu_runtime.cpp`, into one static library.
//!
//! Per module `cuda/NAME.cu` one translation unit is generated: the shim, then
//! `common.cuh` and `NAME.cu` included (so diagnostics name the real files and
//! lines) inside `namespace emu_mod_NAME` (so that helpers of the common
//! header, compiled into every module, never clash when the modules link
//! together; the kernels are `extern "C"` with names unique across modules, a
//! test of compile.rs checks it, and a macro renames them `moshid_emu_k_NAME`
//! so that their C symbols cannot clash with another library's), then the
//! module's kernel table (which keeps the sources' names): for every
//! `extern "C" __global__` function found in the source, its name, a thunk
//! that calls it with parameter i read from `args[i]` as its declared type
//! (deduced from the function's type, no signature parsing), its parameter
//! kinds and its `__launch_bounds__`. A generated registry joins the tables.
//! `emu/selftest.cu` (kernels that check the scheduler itself, names
//! `emu_selftest_*`) is compiled the same way, into the emulator only.
//!
//! The sources are included through copies in `OUT_DIR` that differ only by
//! a call after every `__shared__` declaration that poisons the variable at
//! the start of each block (see `poison_shared`; `#line` keeps the real file
//! names and lines). The `emu-ubsan` feature builds everything under
//! UndefinedBehaviorSanitizer.
//!
//! The sources are read from disk here; `cargo:rerun-if-changed` names every
//! one, so editing a kernel rebuilds the library.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One kernel found in a source: its name and its launch-bounds expression.
struct Kernel {
    name: String,
    bounds: Option<String>,
}

/// The `extern "C" __global__` functions of a source, in order (the same
/// reading as compile.rs's `declared_kernels` test).
fn kernels_of(src: &str, file: &Path) -> Vec<Kernel> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("extern \"C\" __global__") {
        rest = &rest[i + 1..];
        let body = rest
            .find('{')
            .unwrap_or_else(|| panic!("{}: a kernel without a body", file.display()));
        let mut sig = rest[..body].to_string();
        let mut bounds = None;
        if let Some(lb) = sig.find("__launch_bounds__(") {
            let open = lb + "__launch_bounds__(".len();
            let close = open
                + sig[open..]
                    .find(')')
                    .unwrap_or_else(|| panic!("{}: unclosed __launch_bounds__", file.display()));
            // Only the first argument (max threads per block) matters here.
            let expr = sig[open..close].split(',').next().unwrap_or("").trim();
            bounds = Some(expr.to_string());
            sig.replace_range(lb..=close, " ");
        }
        let paren = sig
            .find('(')
            .unwrap_or_else(|| panic!("{}: a kernel without parameters", file.display()));
        let name = sig[..paren]
            .split_whitespace()
            .last()
            .unwrap_or_else(|| panic!("{}: a kernel without a name", file.display()))
            .to_string();
        out.push(Kernel { name, bounds });
    }
    out
}

fn main() {
    let root = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cuda = root.join("cuda");
    let emu = root.join("emu");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", cuda.display());
    println!("cargo:rerun-if-changed={}", emu.display());
    for f in [
        "cuda_emu.h",
        "emu_runtime.cpp",
        "selftest.cu",
        "include/cuda_bf16.h",
        "include/cuda_fp8.h",
    ] {
        println!("cargo:rerun-if-changed={}", emu.join(f).display());
    }

    let common = cuda.join("common.cuh");
    println!("cargo:rerun-if-changed={}", common.display());
    let common_src =
        std::fs::read_to_string(&common).unwrap_or_else(|e| panic!("{}: {e}", common.display()));
    let common_poisoned = out.join("emu_common.poisoned.cuh");
    write_if_changed(&common_poisoned, &poison_shared(&common_src, &common));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&cuda)
        .expect("kernels/cuda is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    // The emulator's own self-test kernels, compiled like a module.
    files.push(emu.join("selftest.cu"));

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .include(&emu)
        .include(emu.join("include"))
        // The host result is the plain IEEE evaluation of the source.
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-exceptions")
        .flag_if_supported("-fno-rtti")
        // The library only ever links into executables: the cheapest TLS.
        .flag_if_supported("-ftls-model=initial-exec")
        // `#pragma unroll` is CUDA's; parameters unused in some instantiations.
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-unused-parameter")
        .file(emu.join("emu_runtime.cpp"));
    // `--features emu-ubsan` (CI): the emulated kernels and the scheduler
    // under UndefinedBehaviorSanitizer — misaligned loads (the kernels' paired
    // bf16 reads), out-of-bounds indexing of fixed-size (shared) arrays,
    // signed overflow, float-to-int conversions out of range — every finding
    // fatal, so the test process aborts with the source line.
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_EMU_UBSAN");
    if std::env::var_os("CARGO_FEATURE_EMU_UBSAN").is_some() {
        build
            .flag("-fsanitize=undefined,float-cast-overflow")
            .flag("-fno-sanitize-recover=all")
            .flag("-fno-omit-frame-pointer")
            .debug(true);
        if build.get_compiler().is_like_clang() {
            println!("cargo:rustc-link-lib=dylib=clang_rt.ubsan_standalone-x86_64");
        } else {
            println!("cargo:rustc-link-lib=dylib=ubsan");
        }
    }

    let mut registry = String::from(
        "// Generated by kernels/build.rs: the emulator's table of every kernel.\n#include \"cuda_emu.h\"\n\n",
    );
    let mut rows = String::new();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let src =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let module = file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name")
            .to_string();
        let kernels = kernels_of(&src, file);
        let ns = format!("emu_mod_{module}");
        let mut tu = String::new();
        writeln!(
            tu,
            "// Generated by kernels/build.rs: {module}.cu for the emulator."
        )
        .unwrap();
        writeln!(tu, "#include \"cuda_emu.h\"\n").unwrap();
        // The kernels' C symbols get a prefix, so that no other library of
        // the final binary can clash with them (`add_f32`, `gelu_f32`, …).
        for k in &kernels {
            writeln!(tu, "#define {0} moshid_emu_k_{0}", k.name).unwrap();
        }
        writeln!(tu, "namespace {ns} {{").unwrap();
        writeln!(tu, "#include \"{}\"", common_poisoned.display()).unwrap();
        let poisoned = out.join(format!("emu_{module}.poisoned.cu"));
        write_if_changed(&poisoned, &poison_shared(&src, file));
        writeln!(tu, "#include \"{}\"", poisoned.display()).unwrap();
        writeln!(tu, "}}  // namespace {ns}\n").unwrap();
        writeln!(
            tu,
            "extern \"C\" const emu::kernel_info moshid_emu_{module}_kernels[] = {{"
        )
        .unwrap();
        for k in &kernels {
            let bounds = k.bounds.as_deref().unwrap_or("1024");
            writeln!(tu, "    EMU_KERNEL({ns}, {}, {bounds}),", k.name).unwrap();
        }
        if kernels.is_empty() {
            writeln!(tu, "    {{nullptr, nullptr, 0, nullptr, nullptr, 0}},").unwrap();
        }
        writeln!(tu, "}};").unwrap();
        for k in &kernels {
            writeln!(tu, "#undef {}", k.name).unwrap();
        }
        writeln!(
            tu,
            "extern \"C\" const unsigned moshid_emu_{module}_count = {};",
            kernels.len()
        )
        .unwrap();
        let path = out.join(format!("emu_{module}.cpp"));
        write_if_changed(&path, &tu);
        build.file(&path);

        writeln!(
            registry,
            "extern \"C\" const emu::kernel_info moshid_emu_{module}_kernels[];\nextern \"C\" const unsigned moshid_emu_{module}_count;"
        )
        .unwrap();
        writeln!(
            rows,
            "    {{moshid_emu_{module}_kernels, &moshid_emu_{module}_count}},"
        )
        .unwrap();
    }
    write!(
        registry,
        r#"
namespace {{
struct module_row {{
    const emu::kernel_info* kernels;
    const unsigned* count;
}};
const module_row modules[] = {{
{rows}}};
}}  // namespace

// Number of kernels of every module.
extern "C" size_t moshid_emu_kernel_count(void) {{
    size_t n = 0;
    for (const auto& m : modules) n += *m.count;
    return n;
}}

// Kernel i of the concatenated tables, or null past the end.
extern "C" const emu::kernel_info* moshid_emu_kernel(size_t i) {{
    for (const auto& m : modules) {{
        if (i < *m.count) return &m.kernels[i];
        i -= *m.count;
    }}
    return nullptr;
}}
"#
    )
    .unwrap();
    let path = out.join("emu_registry.cpp");
    write_if_changed(&path, &registry);
    build.file(&path);
    build.compile("moshid_emu");
}

/// The names a declaration declares: `float a[N][M], b, c[K]` → a, b, c.
fn declarator_names(decl: &str) -> Option<Vec<String>> {
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0i32, String::new());
    for ch in decl.chars() {
        match ch {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(ch);
    }
    parts.push(cur);
    let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut names = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let head = part.split('[').next()?.trim();
        let name = head.split_whitespace().last()?;
        // The first declarator carries the type; the others are bare names.
        if !ident(name) || (i == 0 && head.split_whitespace().count() < 2) {
            return None;
        }
        names.push(name.to_string());
    }
    Some(names)
}

/// `src` with `EMU_SHARED_POISON(name);` after every `__shared__`
/// declaration, on the same line (line numbers, and so barrier sites and
/// diagnostics, stay those of the file, named by the `#line` directive): the
/// first thread of a block to reach a declaration fills the variable with
/// garbage (`cuda_emu.h`), as CUDA leaves shared memory undefined. A
/// declaration the rewrite does not understand fails the build, rather than
/// going unpoisoned.
fn poison_shared(src: &str, file: &Path) -> String {
    let mut out = format!("#line 1 \"{}\"\n", file.display());
    for (n, line) in src.lines().enumerate() {
        out.push_str(line);
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("__shared__ ") {
            let names = rest
                .trim_end()
                .strip_suffix(';')
                .filter(|d| !d.contains(';') && !d.contains('='))
                .and_then(declarator_names)
                .unwrap_or_else(|| {
                    panic!(
                        "{}:{}: the emulator poisons shared memory only in declarations of the form \
                         `__shared__ TYPE a[N], b;` on one line, without initialisers: `{t}`",
                        file.display(),
                        n + 1
                    )
                });
            for name in names {
                write!(out, " EMU_SHARED_POISON({name});").unwrap();
            }
        } else if !t.starts_with("//") && line.contains("__shared__") {
            panic!(
                "{}:{}: `__shared__` the emulator cannot poison (put the declaration on a line of its own)",
                file.display(),
                n + 1
            );
        }
        out.push('\n');
    }
    out
}

/// Writes `text` to `path` unless it already holds it (keeps mtimes stable).
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
