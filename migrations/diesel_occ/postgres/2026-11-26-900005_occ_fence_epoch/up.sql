-- diesel-occ: a fence is the server's timeline times 2^44 plus the next value of
-- occ_fence_source, so that a standby promoted after losing the old primary's last
-- commits (a new, higher timeline) never hands out a fence again. The sequence must stay
-- below 2^44: past it, nextval fails rather than reach into the timeline's bits.
ALTER SEQUENCE occ_fence_source MAXVALUE 17592186044415;
