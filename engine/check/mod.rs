//! Static checks of a lowered workflow.
