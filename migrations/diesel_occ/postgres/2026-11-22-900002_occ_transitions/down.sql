DROP TABLE occ_transitions;
