"""Read-outs: posterior summaries, joint draws, rank statistics, leaderboards."""

from engine.readout.posterior import Z90, draw_posterior, summarize
from engine.readout.leaderboard import format_leaderboard, leaderboard
from engine.readout.ranking import pairwise_beats, rank_stats, ranks_from_draws, tie_groups

__all__ = ["draw_posterior", "summarize", "Z90", "rank_stats", "ranks_from_draws",
           "pairwise_beats", "tie_groups", "leaderboard", "format_leaderboard"]
