//! A claim's extra condition: only the waiting rows that also match a condition of the
//! caller's (one tenant's jobs, one kind of job), written as a diesel expression on the
//! entity's table and checked against it at compile time
//! ([`GuardedClaim::claim_where`](crate::GuardedClaim::claim_where)).
//!
//! The condition is kept as SQL for each backend built in, behind one type, so that a
//! filtered claim sends the same statements as any other: its read becomes
//! `WHERE <claimable> AND (<condition>)`, nothing else changes. The condition's values are
//! bound parameters, as in any diesel query.

use std::sync::Arc;

use diesel::query_builder::QueryFragment;

/// The condition of a filtered claim, as SQL for every backend built in (what
/// `claim_where` hands the claim machinery; not made by callers).
#[doc(hidden)]
#[derive(Clone)]
pub struct ClaimFilter {
    #[cfg(feature = "sqlite")]
    sqlite: Arc<dyn QueryFragment<diesel::sqlite::Sqlite> + Send + Sync>,
    #[cfg(feature = "postgres")]
    postgres: Arc<dyn QueryFragment<diesel::pg::Pg> + Send + Sync>,
    #[cfg(feature = "mysql")]
    mysql: Arc<dyn QueryFragment<diesel::mysql::Mysql> + Send + Sync>,
}

impl ClaimFilter {
    /// The filter of `condition`.
    pub(crate) fn of<G: ClaimCondition>(condition: G) -> Self {
        #[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
        let _ = condition;
        ClaimFilter {
            #[cfg(feature = "sqlite")]
            sqlite: Arc::new(condition.clone()),
            #[cfg(feature = "postgres")]
            postgres: Arc::new(condition.clone()),
            #[cfg(feature = "mysql")]
            mysql: Arc::new(condition),
        }
    }
}

/// A backend's SQL of a [`ClaimFilter`].
pub(crate) trait FilterSql: diesel::backend::Backend {
    /// The condition, as this backend's SQL.
    fn claim_filter(filter: &ClaimFilter) -> &(dyn QueryFragment<Self> + Send + Sync);
}

#[cfg(feature = "sqlite")]
impl FilterSql for diesel::sqlite::Sqlite {
    fn claim_filter(filter: &ClaimFilter) -> &(dyn QueryFragment<Self> + Send + Sync) {
        &*filter.sqlite
    }
}

#[cfg(feature = "postgres")]
impl FilterSql for diesel::pg::Pg {
    fn claim_filter(filter: &ClaimFilter) -> &(dyn QueryFragment<Self> + Send + Sync) {
        &*filter.postgres
    }
}

#[cfg(feature = "mysql")]
impl FilterSql for diesel::mysql::Mysql {
    fn claim_filter(filter: &ClaimFilter) -> &(dyn QueryFragment<Self> + Send + Sync) {
        &*filter.mysql
    }
}

impl std::fmt::Debug for ClaimFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimFilter")
    }
}

/// A condition a claim can be filtered by: a diesel expression that renders as SQL on
/// every backend built in, and can go to the task or thread that sends it (`Clone`,
/// `Send`, `Sync`, `'static`: owned values, as `tasks::kind.eq("email")` or
/// `tasks::tenant.eq(tenant.to_string())`). Which table it may name and that it is a
/// boolean are checked where the claim is made. Not a trait to implement.
pub trait ClaimCondition:
    Clone
    + Send
    + Sync
    + 'static
    + on_backends::OnSqlite
    + on_backends::OnPostgres
    + on_backends::OnMysql
{
}

impl<G> ClaimCondition for G where
    G: Clone
        + Send
        + Sync
        + 'static
        + on_backends::OnSqlite
        + on_backends::OnPostgres
        + on_backends::OnMysql
{
}

/// "Renders on this backend, if it is built in": one trait per backend, empty when its
/// feature is off, so that [`ClaimCondition`] asks for the backends there are.
#[doc(hidden)]
pub mod on_backends {
    use diesel::query_builder::QueryFragment;

    /// Renders on SQLite (when its feature is on).
    #[cfg(feature = "sqlite")]
    pub trait OnSqlite: QueryFragment<diesel::sqlite::Sqlite> {}
    #[cfg(feature = "sqlite")]
    impl<G: QueryFragment<diesel::sqlite::Sqlite>> OnSqlite for G {}
    /// Renders on SQLite (when its feature is on).
    #[cfg(not(feature = "sqlite"))]
    pub trait OnSqlite {}
    #[cfg(not(feature = "sqlite"))]
    impl<G> OnSqlite for G {}

    /// Renders on PostgreSQL (when its feature is on).
    #[cfg(feature = "postgres")]
    pub trait OnPostgres: QueryFragment<diesel::pg::Pg> {}
    #[cfg(feature = "postgres")]
    impl<G: QueryFragment<diesel::pg::Pg>> OnPostgres for G {}
    /// Renders on PostgreSQL (when its feature is on).
    #[cfg(not(feature = "postgres"))]
    pub trait OnPostgres {}
    #[cfg(not(feature = "postgres"))]
    impl<G> OnPostgres for G {}

    /// Renders on MySQL / MariaDB (when its feature is on).
    #[cfg(feature = "mysql")]
    pub trait OnMysql: QueryFragment<diesel::mysql::Mysql> {}
    #[cfg(feature = "mysql")]
    impl<G: QueryFragment<diesel::mysql::Mysql>> OnMysql for G {}
    /// Renders on MySQL / MariaDB (when its feature is on).
    #[cfg(not(feature = "mysql"))]
    pub trait OnMysql {}
    #[cfg(not(feature = "mysql"))]
    impl<G> OnMysql for G {}
}
