//! The SQL type of the lock table's times: an instant on PostgreSQL (`timestamptz`, so
//! that no session's or server's time zone moves a lease, and an operator's
//! `expires_at > now()` is right in any zone), UTC without a zone elsewhere (MySQL's
//! `DATETIME(6)`, SQLite's fixed-width text), where the backends have no zoned type
//! that fits. Read and bound as a UTC `chrono::NaiveDateTime` on every backend.

use chrono::NaiveDateTime;
use diesel::deserialize::{self, FromSql};
use diesel::query_builder::QueryId;
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::{HasSqlType, SqlType};

/// A time of the lock table (`acquired_at`, `renewed_at`, `expires_at`): PostgreSQL's
/// `timestamptz`, MySQL's and SQLite's `Timestamp`, as UTC `NaiveDateTime`.
#[derive(Debug, Clone, Copy, Default, QueryId, SqlType)]
pub struct LockTime;

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use diesel::pg::{Pg, PgValue};
    use diesel::sql_types::Timestamptz;

    impl HasSqlType<LockTime> for Pg {
        fn metadata(lookup: &mut Self::MetadataLookup) -> Self::TypeMetadata {
            <Pg as HasSqlType<Timestamptz>>::metadata(lookup)
        }
    }

    impl FromSql<LockTime, Pg> for NaiveDateTime {
        fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
            <NaiveDateTime as FromSql<Timestamptz, Pg>>::from_sql(bytes)
        }
    }

    impl ToSql<LockTime, Pg> for NaiveDateTime {
        fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
            <NaiveDateTime as ToSql<Timestamptz, Pg>>::to_sql(self, out)
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel::mysql::{Mysql, MysqlValue};
    use diesel::sql_types::Timestamp;

    impl HasSqlType<LockTime> for Mysql {
        fn metadata(lookup: &mut ()) -> Self::TypeMetadata {
            <Mysql as HasSqlType<Timestamp>>::metadata(lookup)
        }
    }

    impl FromSql<LockTime, Mysql> for NaiveDateTime {
        fn from_sql(bytes: MysqlValue<'_>) -> deserialize::Result<Self> {
            <NaiveDateTime as FromSql<Timestamp, Mysql>>::from_sql(bytes)
        }
    }

    impl ToSql<LockTime, Mysql> for NaiveDateTime {
        fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Mysql>) -> serialize::Result {
            <NaiveDateTime as ToSql<Timestamp, Mysql>>::to_sql(self, out)
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use diesel::sql_types::Timestamp;
    use diesel::sqlite::{Sqlite, SqliteValue};

    impl HasSqlType<LockTime> for Sqlite {
        fn metadata(lookup: &mut ()) -> Self::TypeMetadata {
            <Sqlite as HasSqlType<Timestamp>>::metadata(lookup)
        }
    }

    impl FromSql<LockTime, Sqlite> for NaiveDateTime {
        fn from_sql(bytes: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
            <NaiveDateTime as FromSql<Timestamp, Sqlite>>::from_sql(bytes)
        }
    }

    impl ToSql<LockTime, Sqlite> for NaiveDateTime {
        fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
            <NaiveDateTime as ToSql<Timestamp, Sqlite>>::to_sql(self, out)
        }
    }
}
