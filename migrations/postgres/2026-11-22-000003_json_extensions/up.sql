-- A customer profile whose business attributes live in one JSON extension column that
-- several services edit at once.
CREATE TABLE profiles (
    id BIGINT PRIMARY KEY NOT NULL,
    name TEXT NOT NULL,
    ext JSONB NOT NULL DEFAULT '{}',
    version BIGINT NOT NULL DEFAULT 0
);
