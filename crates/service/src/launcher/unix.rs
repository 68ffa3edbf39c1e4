//! The launcher on Unix: nothing to do after the agent ends (its own program is never
//! moved aside there; `current/bin/agent` is the stable path).

/// After the agent (pid `child`) has ended.
pub(super) fn after(_child: u32) {}
