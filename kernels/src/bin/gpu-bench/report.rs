//! The report: a markdown table and a JSON file per run, rewritten after
//! every batch size so that a run cut short keeps what it measured.

use crate::args::Args;
use crate::measure::{Row, Skip};
use crate::profile::{markdown, rates_json, to_json, ProfileRow};
use crate::FRAME_MS;
use moshid_kernels::plan::KvDtype;
use moshid_kernels::profile::roofline::Rates;
use moshid_model::config::LmConfig;
use std::path::PathBuf;

/// `YYYY-MM-DD` and `HH:MM:SSZ` (UTC) of now.
fn utc_now() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    civil(secs)
}

/// `YYYY-MM-DD` and `HH:MM:SSZ` of `secs` seconds after the Unix epoch.
fn civil(secs: i64) -> (String, String) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// The largest measured batch whose p99 is under the frame period.
fn largest_real_time(rows: &[Row], graphs: bool) -> Option<usize> {
    rows.iter()
        .filter(|r| r.graphs == graphs && r.p99 < FRAME_MS)
        .map(|r| r.batch)
        .max()
}

/// Writes (and unless `quiet`, prints) the report of `model` (a built-in
/// shape's name or a checkpoint folder's name).
#[allow(clippy::too_many_arguments)]
pub(crate) fn report(
    a: &Args,
    model: &str,
    lm: &LmConfig,
    gpu: &str,
    total_mem: usize,
    rows: &[Row],
    skips: &[Skip],
    quiet: bool,
) -> Result<(), String> {
    let (date, time) = utc_now();
    let attention = if a.full_context {
        format!(
            "Every slot starts {} positions in, so attention spans the full context.",
            lm.context
        )
    } else {
        format!(
            "Fresh streams: the KV cache holds at most {} positions, so attention does not span the full context.",
            a.warmup + a.steps
        )
    };
    let kv = kv_name(a.kv);
    let precision = if a.f32_weights { "f32" } else { "bf16" };
    let mut md = format!(
        "# gpu-bench: {} on {gpu}\n\n{date} {time}; random weights of the {} shapes (dim {}, {} layers, \
         context {}), {precision} weights, KV cache {kv}; {} timed steps after {} warm-up steps, wall-clock \
         per step including its synchronisation. {attention}\n\n\
         | graphs | batch | p50 ms | p99 ms | max ms | mean ms | faults |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        model,
        model,
        lm.dim,
        lm.num_layers,
        lm.context,
        a.steps,
        a.warmup,
    );
    if !quiet {
        println!();
        println!("graphs  batch    p50 ms    p99 ms    max ms   mean ms  faults");
    }
    for r in rows {
        let g = if r.graphs { "on" } else { "off" };
        if !quiet {
            println!(
                "{g:6} {:6} {:9.2} {:9.2} {:9.2} {:9.2} {:7}",
                r.batch, r.p50, r.p99, r.max, r.mean, r.faults
            );
        }
        md.push_str(&format!(
            "| {g} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |\n",
            r.batch, r.p50, r.p99, r.max, r.mean, r.faults
        ));
    }
    let mut best = Vec::new();
    for &g in &a.graphs {
        let mode = if g { "on" } else { "off" };
        let line = match largest_real_time(rows, g) {
            Some(b) => format!("graphs {mode}: largest batch with p99 < {FRAME_MS} ms: {b}"),
            None => format!("graphs {mode}: no measured batch has p99 < {FRAME_MS} ms"),
        };
        if !quiet {
            println!("{line}");
        }
        md.push_str(&format!("\n{line}"));
        best.push(serde_json::json!({"graphs": g, "largest_batch_p99_under_80ms": largest_real_time(rows, g)}));
    }
    md.push('\n');
    if !skips.is_empty() {
        md.push_str("\nNot measured:\n\n");
        for s in skips {
            md.push_str(&format!(
                "- graphs {} batch {}: {}\n",
                if s.graphs { "on" } else { "off" },
                s.batch,
                s.why
            ));
        }
    }
    let json = serde_json::json!({
        "tool": "gpu-bench",
        "gpu": gpu,
        "gpu_memory_bytes": total_mem,
        "date": date,
        "time_utc": time,
        "model": model,
        "shape": {"dim": lm.dim, "num_layers": lm.num_layers, "num_heads": lm.num_heads,
                  "context": lm.context, "n_q": lm.n_q, "dep_q": lm.dep_q},
        "precision": precision,
        "kv": kv,
        "steps": a.steps,
        "warmup": a.warmup,
        "full_context": a.full_context,
        "kv_positions_at_most": if a.full_context { lm.context } else { a.warmup + a.steps },
        "frame_ms": FRAME_MS,
        "results": rows.iter().map(|r| serde_json::json!({
            "graphs": r.graphs, "batch": r.batch, "p50_ms": r.p50, "p99_ms": r.p99,
            "max_ms": r.max, "mean_ms": r.mean, "steps": r.steps, "faulted_slot_steps": r.faults,
        })).collect::<Vec<_>>(),
        "not_measured": skips.iter().map(|s| serde_json::json!({
            "graphs": s.graphs, "batch": s.batch, "why": s.why,
        })).collect::<Vec<_>>(),
        "summary": best,
    });
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let stem = if a.contexts.len() > 1 {
        format!("gpu-bench-{model}-kv{kv}-ctx{}", lm.context)
    } else {
        format!("gpu-bench-{model}-kv{kv}")
    };
    let jp = a.out.join(format!("{stem}.json"));
    let mp = a.out.join(format!("{stem}.md"));
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&jp, text + "\n").map_err(|e| format!("{}: {e}", jp.display()))?;
    std::fs::write(&mp, md).map_err(|e| format!("{}: {e}", mp.display()))?;
    if !quiet {
        println!("wrote {} and {}", jp.display(), mp.display());
    }
    Ok(())
}

fn kv_name(kv: KvDtype) -> &'static str {
    match kv {
        KvDtype::Bf16 => "bf16",
        KvDtype::Fp8E4m3 => "fp8",
        KvDtype::F32 => "f32",
    }
}

/// Where the profile goes: `--json`, or `--out`/gpu-profile-MODEL-kvKV.json;
/// its markdown beside it.
pub(crate) fn profile_paths(a: &Args, model: &str) -> (PathBuf, PathBuf) {
    let json = a.json.clone().unwrap_or_else(|| {
        a.out
            .join(format!("gpu-profile-{model}-kv{}.json", kv_name(a.kv)))
    });
    (json.clone(), json.with_extension("md"))
}

/// Writes the profile of every batch so far (`--profile`).
pub(crate) fn write_profile(
    a: &Args,
    model: &str,
    lm: &LmConfig,
    gpu: &str,
    rates: &Rates,
    profiles: &[ProfileRow],
) -> Result<(PathBuf, PathBuf), String> {
    let (date, time) = utc_now();
    let kv = kv_name(a.kv);
    let precision = if a.f32_weights { "f32" } else { "bf16" };
    let json = serde_json::json!({
        "tool": "gpu-bench --profile",
        "gpu": gpu,
        "date": date,
        "time_utc": time,
        "model": model,
        "shape": {"dim": lm.dim, "num_layers": lm.num_layers, "num_heads": lm.num_heads,
                  "n_q": lm.n_q, "dep_q": lm.dep_q},
        "precision": precision,
        "kv": kv,
        "steps": a.steps,
        "warmup": a.warmup,
        "profile_steps": a.profile_steps,
        "full_context": a.full_context,
        "rates": rates_json(rates),
        "profiles": profiles.iter().map(to_json).collect::<Vec<_>>(),
    });
    let mut md = format!(
        "# gpu-bench --profile: {model} on {gpu}\n\n{date} {time}; {precision} weights, KV {kv}; \
         rates measured in this run: device memory {:.0} GB/s, host link {:.1} GB/s, bf16 GEMM {:.0} TFLOP/s, \
         f32 GEMM {:.1} TFLOP/s.\n\n",
        rates.hbm_bytes_per_s / 1e9,
        rates.host_bytes_per_s / 1e9,
        rates.bf16_flops_per_s / 1e12,
        rates.f32_flops_per_s / 1e12,
    );
    for p in profiles {
        md.push_str(&markdown(p));
        md.push('\n');
    }
    let (jp, mp) = profile_paths(a, model);
    if let Some(dir) = jp.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&jp, text + "\n").map_err(|e| format!("{}: {e}", jp.display()))?;
    std::fs::write(&mp, md).map_err(|e| format!("{}: {e}", mp.display()))?;
    Ok((jp, mp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil(0), ("1970-01-01".into(), "00:00:00Z".into()));
        assert_eq!(civil(951_782_400 + 3_723).0, "2000-02-29");
        assert_eq!(civil(951_782_400 + 3_723).1, "01:02:03Z");
        assert_eq!(civil(1_735_689_599).0, "2024-12-31");
        assert_eq!(civil(1_735_689_600).0, "2025-01-01");
    }
}
