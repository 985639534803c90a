-- A customer profile whose business attributes live in one JSON extension column that
-- several services edit at once. SQLite keeps JSON as TEXT.
CREATE TABLE profiles (
    id BIGINT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL,
    ext TEXT NOT NULL DEFAULT '{}',
    version BIGINT NOT NULL DEFAULT 0
);
