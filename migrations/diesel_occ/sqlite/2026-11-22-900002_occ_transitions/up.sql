-- diesel-occ: the history of status transitions, written by transition hooks in the same
-- transaction as the move. `at` is the database's clock (UTC, milliseconds), in the text
-- form diesel reads as a timestamp.
CREATE TABLE occ_transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    entity TEXT NOT NULL,
    entity_key TEXT NOT NULL,
    from_status TEXT NOT NULL,
    to_status TEXT NOT NULL,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    actor TEXT
);
CREATE INDEX occ_transitions_by_row ON occ_transitions (entity, entity_key, id);
