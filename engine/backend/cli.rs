//! Backends (being built).

use super::{AgentConfig, Backend};

/// Builds a backend of this family.
pub fn build(config: &AgentConfig) -> Result<Box<dyn Backend>, String> {
    Err(format!(
        "agent `{}`: the {} backend is not built yet",
        config.name,
        config.kind.as_str()
    ))
}
