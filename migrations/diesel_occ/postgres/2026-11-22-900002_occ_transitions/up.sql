-- diesel-occ: the history of status transitions, written by transition hooks in the same
-- transaction as the move. `at` is the database's clock (UTC, microseconds):
-- clock_timestamp(), not the transaction's frozen now().
CREATE TABLE occ_transitions (
    id BIGSERIAL PRIMARY KEY,
    entity VARCHAR(191) NOT NULL,
    entity_key VARCHAR(191) NOT NULL,
    from_status VARCHAR(191) NOT NULL,
    to_status VARCHAR(191) NOT NULL,
    at TIMESTAMP NOT NULL DEFAULT (clock_timestamp() AT TIME ZONE 'UTC'),
    actor VARCHAR(191)
);
CREATE INDEX occ_transitions_by_row ON occ_transitions (entity, entity_key, id);
