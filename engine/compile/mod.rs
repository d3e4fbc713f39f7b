//! Compilation of a checked workflow into an execution plan.
