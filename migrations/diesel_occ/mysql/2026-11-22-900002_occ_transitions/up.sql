-- diesel-occ: the history of status transitions, written by transition hooks in the same
-- transaction as the move. `at` is the database's clock (UTC, microseconds).
CREATE TABLE occ_transitions (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    entity VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    entity_key VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    from_status VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    to_status VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    actor VARCHAR(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    INDEX occ_transitions_by_row (entity, entity_key, id)
);
