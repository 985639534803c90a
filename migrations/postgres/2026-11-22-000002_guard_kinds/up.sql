-- What the guard kinds beyond the version column need.
-- A table guarded by its last-modified timestamp instead of a version column.
CREATE TABLE documents (
    id BIGINT PRIMARY KEY NOT NULL,
    body TEXT NOT NULL,
    hits BIGINT NOT NULL DEFAULT 0,
    last_modified TIMESTAMP NOT NULL
);

-- A view counter on orders: written without the guard (#[occ(exclude)]).
ALTER TABLE orders ADD COLUMN views BIGINT NOT NULL DEFAULT 0;
