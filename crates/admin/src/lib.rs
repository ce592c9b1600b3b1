//! REST admin API (placeholder).
