//! Every black-box test of `tests/` in one binary: one link instead of one per file (the
//! build is most of the test run's time). Each file is a module named after the part of the
//! spec or the feature it covers; run one with `cargo nextest run -p lanemq-tests -E
//! 'test(/^lanes::/)'` or `cargo test -p lanemq-tests --test it lanes::`.

mod common;

#[path = "common/child.rs"]
#[allow(dead_code, clippy::unwrap_used)] // each module uses a part of it
mod child;

mod admin_api;
mod config_cli;
mod durability_restart;
mod enhanced_auth;
mod flow_control;
mod hibernate;
mod kill9;
mod lanes;
mod lanes_admin;
mod lanes_restart;
mod malformed;
mod mqtt311;
mod mqtt5_connect;
mod mqtt5_features;
mod mqtt5_publish;
mod mqtt5_subscribe;
mod retention;
mod sessions;
mod shared;
mod shutdown;
mod streams;
mod streams_property;
mod streams_restart;
