//! One field of a resource definition that failed validation (a stream, a lite parent, a
//! config section or a REST body), with the reason. The resource crates (`lanemq-streams`,
//! `lanemq-lite`) validate their definitions into `Vec<ValidationError>` (empty: valid); the
//! admin API turns the list into one 400 answer and the config loader into one start-up error.

use std::fmt;

/// One field that failed validation, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// The field's name as the user wrote it (`topic_filter`, `lane.ttl`, ...).
    pub field: String,
    /// What is wrong with it, in words a user can act on.
    pub message: String,
}

impl ValidationError {
    /// A failure of `field`.
    pub fn new(field: &str, message: impl Into<String>) -> ValidationError {
        ValidationError {
            field: field.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ValidationError {}
