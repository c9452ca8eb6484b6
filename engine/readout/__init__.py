"""Read-outs: posterior summaries, joint draws, rank statistics, leaderboards, item analysis.

``engine.readout.report`` (HTML and PNG, imports matplotlib) is imported on its own.
"""

from engine._lazy import lazy_exports

__all__ = ["draw_posterior", "summarize", "Z90", "rank_stats", "ranks_from_draws",
           "pairwise_beats", "tie_groups", "leaderboard", "format_leaderboard",
           "ItemBank", "item_bank", "item_flags", "load_run_responses", "quartile_table", "review_items",
           "STRATEGIES", "strategy_scores", "next_item", "select_informative", "target_grid",
           "evaluate_subsets", "AdaptiveTrialSpec", "TrialData", "adaptive_trial", "load_trial_data",
           "simulate_adaptive", "calibration_report", "expected_calibration_error", "fit_confidence_model",
           "load_confidences", "overconfidence"]

_HOMES = {
    'draw_posterior': 'engine.readout.posterior',
    'summarize': 'engine.readout.posterior',
    'Z90': 'engine.readout.posterior',
    'rank_stats': 'engine.readout.ranking',
    'ranks_from_draws': 'engine.readout.ranking',
    'pairwise_beats': 'engine.readout.ranking',
    'tie_groups': 'engine.readout.ranking',
    'leaderboard': 'engine.readout.leaderboard',
    'format_leaderboard': 'engine.readout.leaderboard',
    'ItemBank': 'engine.readout.items',
    'item_bank': 'engine.readout.items',
    'item_flags': 'engine.readout.items',
    'load_run_responses': 'engine.readout.items',
    'quartile_table': 'engine.readout.items',
    'review_items': 'engine.readout.items',
    'STRATEGIES': 'engine.readout.items',
    'strategy_scores': 'engine.readout.items',
    'next_item': 'engine.readout.items',
    'select_informative': 'engine.readout.subset',
    'target_grid': 'engine.readout.subset',
    'evaluate_subsets': 'engine.readout.subset',
    'AdaptiveTrialSpec': 'engine.readout.adaptive',
    'TrialData': 'engine.readout.adaptive',
    'adaptive_trial': 'engine.readout.adaptive',
    'load_trial_data': 'engine.readout.adaptive',
    'simulate_adaptive': 'engine.readout.adaptive',
    'calibration_report': 'engine.readout.calibration',
    'expected_calibration_error': 'engine.readout.calibration',
    'fit_confidence_model': 'engine.readout.calibration',
    'load_confidences': 'engine.readout.calibration',
    'overconfidence': 'engine.readout.calibration',
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
