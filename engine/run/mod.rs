//! The executor: runs a compiled plan (being built).
