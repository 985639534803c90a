// Shared set-up of the doc tests: a SQLite database in memory with the given schema.
#[allow(dead_code)]
fn doctest_connection(schema: &str) -> diesel::SqliteConnection {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let mut conn = diesel::SqliteConnection::establish(":memory:").expect("in-memory SQLite");
    conn.batch_execute(schema).expect("doctest schema");
    conn
}
