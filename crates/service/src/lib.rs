//! The decisions of `agent-service.exe`, kept apart from its Windows calls so that they
//! are built and tested everywhere.

pub mod policy;
