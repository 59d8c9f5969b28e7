//! Shared pieces of the benchmarks and the load generator.
