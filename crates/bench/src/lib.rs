//! lanemq-bench
