//! lanemq-broker
