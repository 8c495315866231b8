"""The run ledger: an index of run directories, comparisons between groups of runs and\nthe projection of local scores onto the leaderboard (`trnf runs`, `trnf compare`)."""
