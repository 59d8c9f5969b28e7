//! The heap's series of `GET /metrics` ([`crate::heap`]), exported whatever
//! the stage-metrics switch says: how an operator (and the soak runner)
//! tells a leak (`in_use` grows with the sessions served) from memory the
//! allocator keeps (`free` grows, `in_use` flat). Absent where the C
//! library is not glibc.

/// Describes the series (once, with the exporter).
pub fn describe() {
    ::metrics::describe_gauge!(
        "moshid_heap_bytes",
        ::metrics::Unit::Bytes,
        "The heap (glibc malloc, all arenas): in_use (allocated, not freed), free (kept in the arenas; trimmed pages stay counted here, unmapped), arena (the arenas' size), mapped (large chunks mapped one by one)"
    );
    ::metrics::describe_counter!(
        "moshid_heap_trims_total",
        "Times the heap's free pages were given back to the system (runtime.heap_trim_ms)"
    );
    ::metrics::describe_counter!(
        "moshid_heap_trim_microseconds_total",
        ::metrics::Unit::Microseconds,
        "Time those trims took (on the main thread)"
    );
}

/// Sets the gauges (scrape time, inside the exporter's recorder).
pub fn record() {
    let (trims, trim_us) = crate::heap::trims();
    ::metrics::counter!("moshid_heap_trims_total").absolute(trims);
    ::metrics::counter!("moshid_heap_trim_microseconds_total").absolute(trim_us);
    let Some(h) = crate::heap::read() else { return };
    for (kind, v) in [
        ("in_use", h.in_use),
        ("free", h.free),
        ("arena", h.arena),
        ("mapped", h.mapped),
    ] {
        ::metrics::gauge!("moshid_heap_bytes", "kind" => kind).set(v as f64);
    }
}
