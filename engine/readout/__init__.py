"""Read-outs: posterior summaries, joint draws, rank statistics, leaderboards, item analysis.

``engine.readout.report`` (HTML and PNG, imports matplotlib) is imported on its own.
"""

from engine.readout.posterior import Z90, draw_posterior, summarize
from engine.readout.leaderboard import format_leaderboard, leaderboard
from engine.readout.ranking import pairwise_beats, rank_stats, ranks_from_draws, tie_groups
from engine.readout.items import (STRATEGIES, ItemBank, item_bank, item_flags, load_run_responses, next_item,
                                  quartile_table, review_items, strategy_scores)
from engine.readout.subset import evaluate_subsets, select_informative, target_grid
from engine.readout.adaptive import AdaptiveTrialSpec, TrialData, adaptive_trial, load_trial_data, simulate_adaptive
from engine.readout.calibration import (calibration_report, expected_calibration_error, fit_confidence_model,
                                        load_confidences, overconfidence)

__all__ = ["draw_posterior", "summarize", "Z90", "rank_stats", "ranks_from_draws",
           "pairwise_beats", "tie_groups", "leaderboard", "format_leaderboard",
           "ItemBank", "item_bank", "item_flags", "load_run_responses", "quartile_table", "review_items",
           "STRATEGIES", "strategy_scores", "next_item", "select_informative", "target_grid",
           "evaluate_subsets", "AdaptiveTrialSpec", "TrialData", "adaptive_trial", "load_trial_data",
           "simulate_adaptive", "calibration_report", "expected_calibration_error", "fit_confidence_model",
           "load_confidences", "overconfidence"]
