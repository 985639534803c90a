-- diesel-occ: where fencing tokens come from (MariaDB 10.3+ sequence). A sequence is not
-- touched when lock rows are deleted or the lock table truncated, and never goes back
-- across a restart (values cached before a crash are skipped, not reused), so a lock's
-- fence keeps rising whatever happens to its row. It starts above every fence handed
-- out before it existed.
--
-- On a Galera node the sequence keeps no cache (NOCACHE): each node would otherwise hand
-- out the values of its own cache, the same fences on two nodes (Galera refuses such a
-- sequence). Without a cache every value drawn is a write of the sequence's row, which
-- the cluster certifies: of two transactions on two nodes that drew from it at once, one
-- is aborted and runs again, so fences stay unique and rise in the order grants commit.
-- (INCREMENT BY 0, Galera's other way, gives each node values of its own offset, which
-- do not rise across nodes.)
SELECT COALESCE(MAX(fence), 0) + 1 INTO @diesel_occ_fence_start FROM occ_locks;
SELECT IF(COALESCE((SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES
                    WHERE VARIABLE_NAME = 'WSREP_ON'), 'OFF') = 'ON', ' NOCACHE', '')
    INTO @diesel_occ_fence_cache;
EXECUTE IMMEDIATE CONCAT('CREATE SEQUENCE occ_fence_source START WITH ', @diesel_occ_fence_start,
    @diesel_occ_fence_cache);
