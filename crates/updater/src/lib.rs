//! The updater (placeholder until the updater issue lands).

#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    #[error("{0}")]
    Failed(String),
}

pub fn run_update(
    _bundle: &std::path::Path,
    _home: &std::path::Path,
    _wait_pid: Option<u32>,
) -> Result<String, UpdateError> {
    Err(UpdateError::Failed("the updater is not built yet".into()))
}
