//! End-to-end tests: the built binaries, real processes, real files and sockets.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a failed step should fail the test loudly"
)]

mod agent;
mod alert_rules;
mod approvals;
mod audit_export;
mod blame;
mod bundle;
mod cloud;
mod commands;
mod config;
mod config_exporter;
mod day_two;
mod delta;
mod delta_server;
mod deployments;
mod first_day;
mod fleet;
mod full_disk;
mod hand_drop;
mod handlers;
mod hostile_archives;
mod hostile_clients;
mod install;
mod labels;
mod leaving;
mod locks;
mod long_poll;
mod maintenance;
mod networks;
mod no_waiting;
mod opamp;
mod opamp_hostile;
mod opamp_sim;
mod operator_day;
mod operators;
mod outside;
mod page;
mod page_governance;
mod planned_stop;
mod platforms;
mod publish_bounds;
mod quickstart;
mod releases;
mod remote_config;
mod rollback;
mod rollout;
mod server;
mod server_restart;
mod sim;
mod stamp;
mod telemetry;
mod traps;
mod trust;
mod update;
mod upgrade;
mod webhooks;
mod windows;
mod workload;
