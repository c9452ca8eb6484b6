"""What the leaderboard says under its table about how the run was fitted."""

from engine.readout.leaderboard import fit_notes


def test_a_converged_fit_has_no_note():
    assert fit_notes({"converged": True, "ability_factor": {"method": "quadrature"}}) == []


def test_an_unconverged_fit_names_what_to_raise():
    (vi,) = fit_notes({"converged": False, "method": "vi"})
    assert "did not converge" in vi and "--max-passes" in vi
    (nuts,) = fit_notes({"converged": False, "method": "nuts", "max_rhat": 1.01})
    assert "--warmup/--samples (R-hat over 1.01)" in nuts and "--max-passes" not in nuts
    assert fit_notes({"converged": False}, convergence=False) == []  # the fit command said it


def test_the_mean_field_fallback_is_named_with_its_cost_and_the_exact_alternative():
    info = {"converged": True, "ability_factor": {
        "method": "gaussian", "quadrature_wall_s": 10.44,
        "quadrature_not_converged": "no progress from iteration 70 on, stopped at 100; the "
                                    "mean-field fit was run instead"}}
    (note,) = fit_notes(info)
    assert "did not converge in 10.4 s" in note and "mean-field fit's intervals" in note
    assert "--method nuts" in note
    older = {"converged": True, "ability_factor": {"method": "gaussian",
                                                   "quadrature_not_converged": "..."}}
    assert "did not converge;" in fit_notes(older)[0]  # a run written before the time was kept


def test_the_nuts_fallback_is_named_and_not_called_mean_field():
    info = {"converged": False, "method": "nuts", "max_rhat": 1.01, "ability_factor": {
        "method": "nuts", "quadrature_wall_s": 20.2,
        "quadrature_not_converged": "no progress from iteration 70 on, stopped at 100; NUTS "
                                    "sampled the posterior instead (4 chains x 1000 draws, R-hat "
                                    "1.023 > 1.01: not converged)"}}
    fallback, unconverged = fit_notes(info)
    assert "did not converge in 20.2 s; NUTS sampled the posterior instead" in fallback
    assert "mean-field" not in fallback and "rhat_max" in fallback
    assert "refit with `fit --method nuts` and more --warmup/--samples (R-hat over 1.01)" in unconverged


def test_compare_names_the_fit_each_fallen_back_row_scores():
    from engine.readout.leaderboard import fallback_notes

    table = {"model": ["1pl", "2pl", "3pl"], "fit_method": ["mean-field", "nuts", "quadrature"],
             "fit_note": ["3 iterations; the mean-field fit was run instead",
                          "3 iterations; NUTS sampled the posterior instead (...)", ""]}
    first, second = fallback_notes(table)
    assert first.startswith("1pl: ") and first.endswith("its row scores the mean-field fit")
    assert second.startswith("2pl: ") and second.endswith("its row scores the NUTS fit")
    older = {"model": ["1pl"], "fit_note": ["3 iterations"]}  # written before fit_method
    assert fallback_notes(older)[0].endswith("the mean-field fit")
    # a row whose scored fit did not converge says so (a NUTS row read converged False alone)
    table |= {"converged": [True, False, False]}
    notes = fallback_notes(table)
    assert len(notes) == 4
    assert notes[2].startswith("2pl: the fit its row scores did not converge (NUTS: R-hat over 1.01")
    assert notes[3].startswith("3pl: the fit its row scores did not converge (it stopped at --max-passes")


def test_divergent_nuts_transitions_are_named_with_the_remedy():
    info = {"converged": True, "method": "nuts", "divergences": 466, "transitions": 8000,
            "target_accept": 0.8}
    (note,) = fit_notes(info)
    assert note.startswith("note: 466 of 8000 NUTS transitions diverged (target acceptance 0.8)")
    assert "`fit --method nuts --target-accept 0.95`" in note
    fallback = {"converged": True, "divergences": 3, "ability_factor": {"method": "nuts"}}
    assert fit_notes(fallback)[0].startswith("note: 3 NUTS transitions diverged: ")
    assert fit_notes({**info, "divergences": 0}) == []
    assert fit_notes({"converged": True, "method": "vi", "divergences": 5}) == []


def test_nuts_restart_in_standardised_coordinates_is_named():
    first = {"rhat_max": 1.0246, "ess_bulk_min": 254.0, "wall_s": 95.6,
             "coordinates": {"standardised": [], "anchored": []},
             "shrinkage_over": {"discrimination": 0.94}, "shrinkage_threshold": 0.5}
    info = {"converged": True, "method": "nuts", "divergences": 0,
            "coordinates": {"standardised": ["difficulty", "discrimination"], "anchored": [],
                            "shrinkage": {"difficulty": 0.29, "discrimination": 0.94},
                            "restarted_from": first}}
    (note,) = fit_notes(info)
    assert note.startswith("note: NUTS's first run did not converge (R-hat 1.025, 96 s) and "
                           "its item draws were mostly their pools' prior (discrimination "
                           "shrinkage 0.94), so it sampled again from the start")
    assert fit_notes(info, convergence=False) == [note]  # the fit command prints it too
    old = {k: v for k, v in first.items() if not k.startswith("shrinkage_")}  # before 12-05
    assert fit_notes({**info, "coordinates": {**info["coordinates"], "restarted_from": old}}) == [note]
    kept = {**info, "coordinates": {**info["coordinates"], "restarted_from": None}}
    assert fit_notes(kept) == [] and fit_notes({"converged": True, "method": "nuts"}) == []
