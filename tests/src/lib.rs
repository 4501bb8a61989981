//! Workspace-level integration tests live in `tests/`; this crate has no library code.
