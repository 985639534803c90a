-- A customer profile whose business attributes live in one JSON extension column that
-- several services edit at once. MariaDB's JSON is LONGTEXT with a JSON_VALID check.
CREATE TABLE profiles (
    id BIGINT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL,
    ext JSON NOT NULL,
    version BIGINT NOT NULL DEFAULT 0
);
