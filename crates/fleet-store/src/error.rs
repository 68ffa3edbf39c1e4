//! The fleet's one error type, and which database failures mean "not there now".

/// What went wrong in the fleet model. An edge answers [`FleetError::is_unavailable`]
/// with "try again shortly" (HTTP `503`) and the rest as its own fault.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The database settings cannot work (a bad URL, a refused login, a missing
    /// database); the text says what to fix.
    #[error("configuration: {0}")]
    Config(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A request the fleet cannot take as it is; the text says what to change.
    #[error("{0}")]
    Invalid(String),
    /// It clashes with what the fleet holds (a name taken); the text says what to do.
    #[error("{0}")]
    Conflict(String),
    /// It names something the fleet does not have; the text says how to list what is.
    #[error("{0}")]
    NotFound(String),
}

impl FleetError {
    /// The database cannot be reached now (the call should be answered from memory or
    /// tried again), rather than a fault in the query.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, FleetError::Database(e) if is_unavailable(e))
    }
}

/// Whether `e` means "the database cannot be reached now" rather than a fault in the
/// query.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| unavailable_state(&code)),
        _ => false,
    }
}

/// Whether `e` is PostgreSQL ending a statement that lost a race for rows to another
/// (a deadlock, or a serialization failure): the same statement again may well go.
pub fn is_lost_race(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c == "40P01" || c == "40001"))
}

/// PostgreSQL's SQLSTATE classes of a database that is going or gone: connection
/// exceptions (08), insufficient resources (53), operator intervention such as a
/// shutdown (57P).
fn unavailable_state(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("53") || code.starts_with("57P")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailability_is_told_from_faults() {
        assert!(is_unavailable(&sqlx::Error::PoolTimedOut));
        assert!(is_unavailable(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_unavailable(&sqlx::Error::RowNotFound));
        assert!(unavailable_state("57P01") && unavailable_state("08006"));
        assert!(!unavailable_state("23505"));
        assert!(FleetError::from(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(!FleetError::Config("x".into()).is_unavailable());
    }
}
