//! What only Windows needs of the launcher: a running program cannot be deleted, so
//! `agent uninstall`, run through the launcher, moves it aside, and the launcher deletes
//! itself once it has ended.

/// After the agent (pid `child`) has ended: if it moved this launcher aside (an
/// uninstall), the file goes once this process ends.
pub(super) fn after(child: u32) {
    let aside = agent_updater::launcher::set_aside(child);
    if aside.exists()
        && let Err(e) = self_replace::self_delete_at(&aside)
    {
        eprintln!(
            "agent: cannot remove the launcher's old program {} ({e}); delete it by hand",
            aside.display()
        );
    }
}
