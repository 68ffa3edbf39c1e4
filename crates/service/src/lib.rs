//! The decisions of `agent-service` (the supervisor behind `agent-wrapper.sh` on Unix,
//! the Windows service on Windows), kept apart from the platforms' process calls so
//! that they are built and tested everywhere: what to do after the agent exits
//! ([`policy`]), what `start` reads in the agent's files ([`observe`]), the knobs of
//! `conf/agent-env.sh` ([`knobs`]), the clock the shared files are written in, and the
//! command line both halves read ([`cli`]). The Windows launcher, `<home>\bin\agent.exe`, is here too ([`launcher`]): it reads
//! `current` as the service does.

pub mod cli;
pub mod clock;
pub mod config_check;
pub mod knobs;
pub mod launcher;
pub mod observe;
pub mod policy;
