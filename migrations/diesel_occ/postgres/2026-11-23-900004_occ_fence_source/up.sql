-- diesel-occ: where fencing tokens come from. A sequence is not touched when lock rows
-- are deleted or the lock table truncated, and never goes back across a restart, so a
-- lock's fence keeps rising whatever happens to its row. It starts above every fence
-- handed out before it existed.
CREATE SEQUENCE occ_fence_source AS BIGINT;
SELECT setval('occ_fence_source', (SELECT COALESCE(MAX(fence), 0) + 1 FROM occ_locks), false);
