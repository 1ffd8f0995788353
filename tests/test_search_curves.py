"""Runs' learning curves (search.curves): whether the completed runs' curves back a pruner's early
judgement (early_ranking), and the answer's note that says so."""

from __future__ import annotations

from cubic.codesign.answer import pruning_note
from cubic.core.result import Result
from search.curves import early_ranking
from search.space import Parameter, Space
from search.strategies import Observation

SPACE = Space(parameters=[Parameter(name="x", type="int", low=0, high=99)],
              objectives=[{"metric": "loss", "direction": "minimize", "scale": "linear"}])


def _history(crossing: bool, completed: int = 8, stopped: int = 3) -> list[Observation]:
    """Completed 5-step curves ending at loss 1..completed; with ``crossing`` the runs that end best
    are the worst until step 4 (slow starters), else every step ranks them as the end does."""
    out = []
    for i in range(completed):
        end = 1.0 + i
        early = (10.0 - i) if crossing else (10.0 + i)
        curve = [[st, early - 0.1 * st] for st in (1, 2, 3)] + [[4, end + 0.5], [5, end]]
        out.append(Observation({"x": i}, Result(status="ok", metrics={"loss": end}, extra={"curve": curve})))
    for j in range(stopped):
        stop = Result.failed("pruned", "stopped", metrics={"loss": 20.0, "pruned_step": 2.0},
                             extra={"curve": [[1, 21.0], [2, 20.0]]})
        out.append(Observation({"x": 50 + j}, stop))
    return out


def test_ordered_curves_back_the_pruner():
    r = early_ranking(SPACE, _history(crossing=False))
    assert r["stopped"] == 3 and r["step"] == 2 and r["runs"] == 8 and r["spearman"] > 0.99
    assert r["first_step_ranking_well"] == 2
    assert "back its early judgement" in pruning_note(early_ranking(SPACE, _history(crossing=False)))


def test_crossing_curves_say_a_stopped_run_may_have_won_and_name_the_warmup():
    r = early_ranking(SPACE, _history(crossing=True))
    assert r["spearman"] < -0.99 and r["first_step_ranking_well"] == 4
    note = pruning_note(early_ranking(SPACE, _history(crossing=True)))
    assert "may have been the winner" in note and "--prune-warmup 4" in note and "Spearman -1.00" in note


def test_no_note_without_a_stopped_run_and_a_warning_when_too_few_runs_finished_to_check():
    assert early_ranking(SPACE, _history(crossing=True, stopped=0)) is None
    assert pruning_note(None) is None
    r = early_ranking(SPACE, _history(crossing=False, completed=4))
    assert r["spearman"] is None and r["runs"] == 4 and r["stopped"] == 3
    note = pruning_note(r)  # not silent: silence would read as the curves backing the pruner
    assert "too few (of 5 needed)" in note and "may have been the winner" in note and "back its" not in note
    assert early_ranking(SPACE, _history(crossing=False, completed=0))["runs"] == 0


def test_the_search_benchmark_reads_the_note_by_the_same_words_the_answer_prints():
    """The early-stop benchmark finds the note in the printed answer and reads whether it backs the
    pruner: the words are one record (cubic.codesign.answer), so a reworded note cannot make the
    benchmark's "the note told the truth" count silently wrong."""
    from cubic.codesign.answer import PRUNING_NOTE_HEAD
    from experiments import _search_early_stop as es

    for crossing, warned in ((False, False), (True, True)):
        note = pruning_note(early_ranking(SPACE, _history(crossing=crossing)))
        assert note.startswith(PRUNING_NOTE_HEAD)
        run = {"arm": "median", "seed": 0, "pruning_note": note, "kinds": ["ok", "pruned"],
               "full_final_per_run": [1.0, 2.0], "epochs_per_run": [9, 2], "jobs_wall_s_per_run": [1.0, 0.2],
               "regret_so_far": [0.1, 0.1]}
        assert es.note_check({"campaigns": [run]})["campaigns"][0]["warned"] is warned
