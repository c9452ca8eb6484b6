"""Property tests for the evaluation-log readers (Every Eval Ever JSONL, lm-evaluation-harness
``--log_samples`` folders, HELM run folders): each generated input gives a clean one-line
error with nothing written, or a store equal to a strict reference parser's result.

The reference parsers below are written from the layouts cited in ``test_every_eval_ever.py``,
``test_lm_eval_logs.py`` and ``test_helm_logs.py`` (one JSON object per line / a JSON array of
``PerInstanceStats``) and the log rules of ``engine.data.formats.logs`` (ids are stripped,
non-empty text; a value is a finite number >= 0 storable as float32, JSON ``NaN`` is an
error; the same model answering the same item twice is an error unless ``keep`` says which
to use, runs in file then line order), with the standard library only. They decide *whether*
an input is valid: the reader must reject exactly what the reference rejects. Store contents
are compared as ``(subject, item) -> value`` maps (row and column order are the store's
business). ``FUZZ_EXAMPLES`` sets the examples per reader (derandomized; the benchmark run
uses more).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.data import ingest
from engine.errors import IRTError

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
FUZZ = settings(derandomize=True, max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
REJECT = "reject"
F32_MAX = float(np.finfo(np.float32).max)
OUTCOMES: dict[str, dict[str, int]] = {}  # reader -> outcome counts (printed with -s)

# JSON texts of ids and values: ordinary ones (7 times in 8) and the hostile ones
IDS = ['"a"', '"b"', '"c"', '"m/x-7b"', '"\\u00e9"', '"NA"', '"d"']
EDGE_IDS = ['""', '" "', '" a"', "101", "null", "true", "1.5", '["a"]', "{}", '"\\ud800"',
            '"\\u0001x"', '"\\u001fa\\u001f"', '"a\\u0000"', '"\\u2028"', '"\\u200b"',
            '"\x01raw"', '"a"']
VALUES = ["0", "1", "0.5", "1.0", "0.25", "true", "false", "0", "1"]
EDGE_VALUES = ["2", "-1", "-0.0", "1e-50", "-1e-50", "1.00000001", "NaN", "Infinity",
               "-Infinity", "1e39", "1e400", "1" + "0" * 400, "9" * 5000, "null", '"1"',
               "[1]", "{}", "3.5"]


def mostly(plain: list, edge: list, hostile: bool = True):
    """A strategy for one value: plain 7 times in 8, else an edge case (always plain in a
    well-formed example, ``hostile`` False)."""
    if not hostile:
        return st.sampled_from(plain)
    return st.integers(0, 7).flatmap(lambda k: st.sampled_from(edge if k == 0 else plain))


# ----------------------------------------------------------------------------- reference

def ref_id(value, numbers: bool = False) -> str:
    """An id field: text (or an integer when ``numbers``), stripped, non-empty, encodable."""
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(value)
    text = value.strip()
    if not text:
        raise ValueError("empty id")
    text.encode("utf-8")  # a lone surrogate: UnicodeEncodeError is a ValueError
    return text


def ref_number(value) -> float:
    """A per-sample score: a JSON number or true/false (float64); anything else raises."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)  # a huge integer raises OverflowError (a rejection)
    raise ValueError(value)


def ref_json_lines(text: str) -> list[tuple[int, dict]]:
    """``(line, object)`` of the non-blank lines; any other line is an error."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.lstrip("\ufeff") if n == 1 else line
        if not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        out.append((n, obj))
    return out


def ref_resolve(records: list[tuple[str, str, float]], keep: str | None):
    """Records ``(subject, item, value)`` in run order -> the expected ``(cells, kind)``."""
    if not records:
        raise ValueError("no responses")
    runs: dict[tuple[str, str], list[float]] = {}
    for s, i, v in records:
        if math.isnan(v) or math.isinf(v) or abs(v) > F32_MAX or v < 0:
            raise ValueError("value no kind holds")
        runs.setdefault((s, i), []).append(v + 0.0)
    cells = {}
    for key, values in runs.items():
        if len(values) > 1 and keep is None:
            raise ValueError("duplicate (model, sample)")
        cells[key] = {None: values[0], "first": values[0], "latest": values[-1],
                      "mean": math.fsum(values) / len(values)}[keep]
    values = list(cells.values())
    if all(v in (0.0, 1.0) for v in values):
        kind = "binary"
    else:
        kind = "unit" if all(v <= 1 for v in values) else "nonnegative"
    return cells, kind


def ref_every_eval_ever(files: list[str], metric: str, keep: str | None):
    """Every Eval Ever instance lines: model_id, evaluation_name, sample_id (text; sample id
    also an integer), ``evaluation`` an object holding the metric; item = evaluation/sample."""
    records = []
    for text in files:
        for _, obj in ref_json_lines(text):
            subject = ref_id(obj.get("model_id"))
            evaluation = ref_id(obj.get("evaluation_name"))
            sample = ref_id(obj.get("sample_id"), numbers=True)
            scores = obj.get("evaluation")
            if not isinstance(scores, dict) or scores.get(metric) is None:
                raise ValueError("no metric")
            records.append((subject, f"{evaluation}/{sample}", ref_number(scores[metric])))
    return ref_resolve(records, keep)


def ref_model_name(results) -> str:
    """The model lm-eval names in ``results_<date>.json``: ``model_name``, else the first of
    peft/delta/pretrained/model/path/engine in ``config.model_args``."""
    if not isinstance(results, dict):
        raise ValueError("results not an object")
    name = results.get("model_name")
    if not (isinstance(name, str) and name.strip()):
        args = (results.get("config") or {}).get("model_args")
        keys = ("peft", "delta", "pretrained", "model", "path", "engine")
        name = None
        if isinstance(args, dict):
            name = next((str(args[k]) for k in keys if args.get(k)), None)
        elif isinstance(args, str):
            pairs = dict(p.split("=", 1) for p in args.split(",") if "=" in p)
            pairs = {k.strip(): v for k, v in pairs.items()}
            name = next((pairs[k] for k in keys if k in pairs and pairs[k]), None)
    return ref_id(name)


def ref_lm_eval(runs: list[tuple[str, str, dict[str, str]]], metric: str | None,
                keep: str | None):
    """Runs ``(date, results text, {task: samples text})``, read in date order."""
    records = []
    for date, results, samples in sorted(runs, key=lambda r: r[0]):
        model = ref_model_name(json.loads(results))
        for task, text in sorted(samples.items()):
            for _, obj in ref_json_lines(text):
                doc = ref_id(obj.get("doc_id"), numbers=True)
                names = obj.get("metrics")
                if not isinstance(names, list) or not all(isinstance(m, str) for m in names):
                    raise ValueError("metrics")
                want = metric or (names[0] if len(names) == 1 else None)
                if want is None or obj.get(want) is None:
                    raise ValueError("no metric")
                value = ref_number(obj[want])
                filt = obj.get("filter", "none")
                if not isinstance(filt, str):
                    raise ValueError("filter")
                item = f"{task}/{doc}" if filt == "none" else f"{task}/{filt}/{doc}"
                records.append((model, item, value))
    return ref_resolve(records, keep)


def ref_helm(runs: list[tuple[str, str]], metric: str, keep: str | None):
    """Run folders ``(run_spec text, per_instance_stats text)`` in folder order."""
    records = []
    for spec_text, stats_text in runs:
        spec = json.loads(spec_text)
        adapter = spec.get("adapter_spec") if isinstance(spec, dict) else None
        model = (adapter.get("model") or adapter.get("model_deployment")
                 if isinstance(adapter, dict) else None)
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            raise ValueError("run name")
        model = ref_id(model)
        head, _, args = name.partition(":")
        kept = [a for a in args.split(",")
                if a and not a.startswith(("model=", "model_deployment="))]
        scenario = head + (":" + ",".join(kept) if kept else "")
        entries = json.loads(stats_text)
        if not isinstance(entries, list):
            raise ValueError("not an array")
        for entry in entries:
            if not isinstance(entry, dict):
                raise ValueError("entry")
            if entry.get("perturbation"):
                continue
            instance = ref_id(entry.get("instance_id"))  # PerInstanceStats: a str
            stats = entry.get("stats")
            if not isinstance(stats, list):
                raise ValueError("stats")
            found = None
            for stat in stats:
                label = stat.get("name") if isinstance(stat, dict) else None
                if (isinstance(label, dict) and label.get("name") == metric
                        and not label.get("perturbation")):
                    found = stat
                    break
            if found is None:
                raise ValueError("no stat")
            mean, total, count = found.get("mean"), found.get("sum"), found.get("count")
            if isinstance(mean, (int, float)) and not isinstance(mean, bool):
                value = float(mean)
            elif (isinstance(total, (int, float)) and not isinstance(total, bool)
                  and isinstance(count, int) and not isinstance(count, bool) and count > 0):
                value = float(total) / count
            else:
                raise ValueError("no mean")
            records.append((model, f"{scenario}/{instance}", value))
    return ref_resolve(records, keep)


def reference(fn, *args):
    try:
        return fn(*args)
    except (ValueError, OverflowError, RecursionError):
        return REJECT


# ----------------------------------------------------------------------------- the check

def check(reader: str, tmp: Path, expected, **kw) -> None:
    """Ingest ``tmp/in`` to ``tmp/out.zarr`` and compare with the reference's ``expected``."""
    out = tmp / "out.zarr"
    try:
        store = ingest(tmp / "in", out, **kw)
    except IRTError as err:
        message = str(err)
        assert "\n" not in message and message, message
        assert not out.exists(), "a failed ingest left its output"
        assert [p.name for p in tmp.iterdir() if p.name.startswith(".")] == []
        assert expected == REJECT, f"reader rejected a valid input: {message}"
        _count(reader, "error")
        return
    assert expected != REJECT, "reader accepted an input the reference rejects"
    cells, kind = expected
    assert store.kind == kind
    subjects, items = list(store.subjects), list(store.items)
    assert sorted(subjects) == sorted({s for s, _ in cells})
    assert sorted(items) == sorted({i for _, i in cells})
    got = store.load()
    if kind == "binary":
        want = np.full(got.shape, -1, np.int8)
    else:
        want = np.full(got.shape, np.nan, np.float32)
    for (s, i), v in cells.items():
        want[subjects.index(s), items.index(i)] = v
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    _count(reader, "store")


def _count(reader: str, outcome: str) -> None:
    counts = OUTCOMES.setdefault(reader, {})
    counts[outcome] = counts.get(outcome, 0) + 1


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / "in" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8", "surrogatepass"))


def _mangle(draw, lines: list[str], hostile: bool) -> list[str]:
    """Now and then: a truncated line, a blank line, a line that is not an object."""
    k = draw(st.integers(0, 19)) if hostile else 1 + 19 * draw(st.integers(0, 1))
    if lines and k == 0:
        lines[-1] = lines[-1][:-2]
    elif k == 1:
        lines.insert(draw(st.integers(0, len(lines))), "")
    elif k == 2:
        lines.append(draw(st.sampled_from(["[1]", "null", "\"x\"", "{"])))
    return lines


# ----------------------------------------------------------------------------- Every Eval Ever

@st.composite
def eee_line(draw, models, evals, samples, hostile):
    fields = {"schema_version": '"0.2.0"',
              "model_id": draw(mostly(models, EDGE_IDS, hostile)),
              "evaluation_name": draw(mostly(evals, EDGE_IDS, hostile)),
              "sample_id": draw(mostly(samples, EDGE_IDS + ["7", "-3", "2.0"], hostile)),
              "sample_hash": '"h"'}
    score = draw(mostly(VALUES, EDGE_VALUES, hostile))
    correct = draw(mostly(["true", "false"], ["1", "0", "0.5", "2", "null", '"yes"'], hostile))
    evaluation = "{" + ", ".join(f'"{k}": {v}' for k, v in
                                 (("score", score), ("is_correct", correct))
                                 if not hostile or draw(st.integers(0, 15))) + "}"
    fields["evaluation"] = draw(mostly([evaluation], ["null", "[]", '"x"', "1"], hostile))
    fields["input"] = '{"raw": "q"}'
    for key in list(fields):
        if hostile and key != "schema_version" and draw(st.integers(0, 39)) == 0:
            del fields[key]  # a missing field
    if draw(st.integers(0, 9)) == 0:
        fields["extra_field"] = draw(st.sampled_from(['{"a": [1, 2]}', "null", '"x"']))
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


@st.composite
def eee_inputs(draw):
    models = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=3, unique=True))
    evals = draw(st.lists(st.sampled_from(['"gsm8k"', '"mmlu"', '"arc/easy"']), min_size=1,
                          max_size=2, unique=True))
    samples = draw(st.lists(st.sampled_from(['"s1"', '"s2"', '"s3"', "4", '"4"', '"s5"',
                                             '"s6"', '"\\u00e9"']),
                            min_size=1, max_size=6, unique=True))
    hostile = draw(st.booleans())
    files = {}
    for k in range(draw(st.integers(1, 3))):
        lines = [draw(eee_line(models, evals, samples, hostile))
                 for _ in range(draw(st.integers(0 if hostile else 1, 5)))]
        folder = draw(st.sampled_from(["", "mmlu/openai/gpt/", "a/b/c/d/"]))
        files[f"{folder}run{k}.jsonl"] = "\n".join(_mangle(draw, lines, hostile)) + "\n"
    metric = draw(st.sampled_from(["score", "score", "is_correct"]))
    keep = draw(st.sampled_from([None, None, "first", "latest", "mean"]))
    return files, metric, keep


def _run_eee(inputs):
    files, metric, keep = inputs
    order = sorted(files, key=lambda rel: Path(rel).parts)  # the folder walk's sorted order
    expected = reference(ref_every_eval_ever, [files[r] for r in order], metric, keep)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, {**files, "mmlu/aggregate.json": '{"skipped": true}'})
        check("every-eval-ever", root, expected, fmt="every-eval-ever", metric=metric,
              keep=keep)


EEE_LINE = ('{"model_id": "a", "evaluation_name": "gsm8k", "sample_id": "s1", '
            '"evaluation": {"score": %s}}')


@given(eee_inputs())
@FUZZ
@example(({"run0.jsonl": EEE_LINE % ("1" + "0" * 400) + "\n"}, "score", None))  # was OverflowError
@example(({"run0.jsonl": "null\n"}, "score", None))  # crashed pyarrow's JSON reader (SIGSEGV)
@example(({"r.jsonl": EEE_LINE % "1" + "\n[1]\n"}, "score", None))
@example(({"r.jsonl": (EEE_LINE % "1" + "\n") * 2}, "score", "mean"))  # a duplicated pair
def test_every_eval_ever_reader(inputs):
    _run_eee(inputs)


# ----------------------------------------------------------------------------- lm-eval

MODEL_NAMES = ['"org/model-7b"', '"m2"', '" padded "', '"\\u00e9"']
EDGE_MODEL_NAMES = ['""', '"  "', '"\\ud800"', "null", "7", '"\\u0001"']
MODEL_ARGS = ['"pretrained=org/m,dtype=float16"', '{"pretrained": "org/m"}', '"dtype=float16"',
              '{"pretrained": "  "}', '{"peft": "a", "pretrained": "b"}', "null", "[1]",
              '"model=x,pretrained= y"', '{"pretrained": "\\ud800"}']


@st.composite
def lm_eval_line(draw, docs, names, hostile):
    fields = {"doc_id": draw(mostly(docs, EDGE_IDS, hostile)),
              "doc": '{"question": "q"}', "target": '"A"',
              "filter": draw(mostly(['"none"'], ['"strict-match"', "null", "1", '"none "'],
                                    hostile)),
              "metrics": json.dumps(names)}
    for name in names:
        fields[name] = draw(mostly(VALUES, EDGE_VALUES, hostile))
    if hostile and draw(st.integers(0, 9)) == 0:
        fields["metrics"] = draw(st.sampled_from(['"acc"', "[1]", "null", '["acc", 2]']))
    for key in ("doc_id", "filter", "metrics"):
        if hostile and draw(st.integers(0, 39)) == 0:
            del fields[key]
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


@st.composite
def lm_eval_inputs(draw):
    hostile = draw(st.booleans())
    files, runs = {}, []
    docs = draw(st.lists(st.sampled_from(["0", "1", "2", "3", '"4"', '"q\\u00e9"']),
                         min_size=1, max_size=4, unique=True))
    metric = draw(mostly([None, None, "acc"], ["exact_match", "acc_norm"], hostile))
    for k in range(draw(st.integers(1, 3))):
        date = f"2024-0{draw(st.integers(1, 3))}-0{k + 1}T10-00-00.{k}"
        folder = draw(st.sampled_from(["org__m", "org__m2", "deep/er/org__m"]))
        name = draw(mostly(MODEL_NAMES, EDGE_MODEL_NAMES + ["absent"], hostile))
        results = {"config": f'{{"model_args": {draw(st.sampled_from(MODEL_ARGS))}}}'}
        if name != "absent":
            results["model_name"] = name
        results_text = "{" + ", ".join(f'"{k}": {v}' for k, v in results.items()) + "}"
        if hostile and draw(st.integers(0, 19)) == 0:
            results_text = draw(st.sampled_from(["", "[1]", results_text[:-1]]))
        tasks = {}
        for task in draw(st.lists(st.sampled_from(["arc_easy", "gsm8k", "mmlu_x_y"]),
                                  min_size=1, max_size=2, unique=True)):
            names = draw(mostly([["acc"], ["acc"], ["acc", "exact_match"]],
                                [["exact_match"], ["acc", "acc_norm"], []], hostile))
            lines = [draw(lm_eval_line(docs, names, hostile))
                     for _ in range(draw(st.integers(0 if hostile else 1, 4)))]
            tasks[task] = "\n".join(_mangle(draw, lines, hostile)) + "\n"
            files[f"{folder}/samples_{task}_{date}.jsonl"] = tasks[task]
        files[f"{folder}/results_{date}.json"] = results_text
        runs.append((date, results_text, tasks))
    keep = draw(st.sampled_from([None, None, "first", "latest", "mean"]))
    return files, runs, metric, keep


def _lm_eval_example(results: str):
    date, samples = "2024-01-01T10-00-00.0", '{"doc_id": 0, "metrics": ["acc"], "acc": 1}\n'
    return ({f"m/results_{date}.json": results, f"m/samples_t_{date}.jsonl": samples},
            [(date, results, {"t": samples})], None, None)


@given(lm_eval_inputs())
@FUZZ
@example(_lm_eval_example('{"model_name": "\\ud800"}'))  # was UnicodeEncodeError
@example(_lm_eval_example('{"config": {"model_args": {"pretrained": "  "}}}'))  # empty model:
def test_lm_eval_reader(inputs):  # was an error naming a scratch file
    files, runs, metric, keep = inputs
    expected = reference(ref_lm_eval, runs, metric, keep)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, files)
        check("lm-eval", root, expected, fmt="lm-eval", metric=metric, keep=keep)


# ----------------------------------------------------------------------------- HELM

NUMBERS = ["0", "1", "0.5", "1.0", "0.25", "0", "1"]  # a Stat's mean and sum are numbers


def helm_stat(name: str, mean: str, hostile_total: str | None = None) -> str:
    total = hostile_total if hostile_total is not None else mean
    return (f'{{"name": {{"name": "{name}", "split": "test"}}, "count": 1, "sum": {total}, '
            f'"mean": {mean}}}')


@st.composite
def helm_entry(draw, instances, hostile):
    instance = draw(mostly(instances, EDGE_IDS, hostile))
    mean = draw(mostly(NUMBERS, EDGE_VALUES + ["true", "false"], hostile))
    stats = [helm_stat("num_prompt_tokens", "120.0")]
    if not hostile or draw(st.integers(0, 15)):
        if hostile and draw(st.integers(0, 9)) == 0:  # no mean: sum / count
            stats.append(f'{{"name": {{"name": "exact_match"}}, "count": '
                         f'{draw(st.sampled_from(["2", "0", "null", "1.5"]))}, '
                         f'"sum": {draw(mostly(VALUES, EDGE_VALUES))}}}')
        else:
            stats.append(helm_stat("exact_match", mean))
    if hostile and draw(st.integers(0, 9)) == 0:
        stats.insert(0, draw(st.sampled_from(
            ['{"name": {"name": "exact_match", "perturbation": {"name": "typos"}}, "mean": 0}',
             '{"name": "exact_match", "mean": 0}', "null", "[1]"])))
    fields = {"instance_id": instance, "train_trial_index": "0",
              "stats": "[" + ", ".join(stats) + "]"}
    if draw(st.integers(0, 9)) == 0:
        fields["perturbation"] = draw(st.sampled_from(['{"name": "typos"}', "null", "{}"]))
    if hostile and draw(st.integers(0, 29)) == 0:
        del fields[draw(st.sampled_from(["instance_id", "stats"]))]
    if hostile and draw(st.integers(0, 29)) == 0:
        return draw(st.sampled_from(["null", "[]", '"x"']))
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


@st.composite
def helm_inputs(draw):
    hostile = draw(st.booleans())
    instances = draw(st.lists(st.sampled_from(['"id0"', '"id1"', '"id2"', "3", '"\\u00e9"']),
                              min_size=1, max_size=4, unique=True))
    files, runs = {}, []
    for k in range(draw(st.integers(1, 3))):
        scenario = draw(st.sampled_from(["boolq", "mmlu:subject=anatomy", "mmlu:subject=law"]))
        model = draw(mostly(['"openai/gpt2"', '"meta/llama"', '" padded "'],
                            ['""', '"\\ud800"', "null", "3"], hostile))
        sep = "," if ":" in scenario else ":"
        name = f"{scenario}{sep}model=m{k}"
        spec = f'{{"name": "{name}", "adapter_spec": {{"model": {model}, "max_tokens": 1}}}}'
        if hostile and draw(st.integers(0, 19)) == 0:
            spec = draw(st.sampled_from(["[]", '{"name": 3}', spec[:-2]]))
        entries = [draw(helm_entry(instances, hostile))
                   for _ in range(draw(st.integers(0 if hostile else 1, 4)))]
        stats = "[" + ",\n".join(entries) + "]"
        if hostile and draw(st.integers(0, 19)) == 0:
            stats = draw(st.sampled_from(["", "{}", stats[:-1]]))
        folder = draw(st.sampled_from(["runs/v1/", "runs/v2/deeper/", ""])) + f"run{k}"
        files[f"{folder}/run_spec.json"] = spec
        files[f"{folder}/per_instance_stats.json"] = stats
        files[f"{folder}/stats.json"] = "{}"
        runs.append((Path(folder).parts, spec, stats))
    keep = draw(st.sampled_from([None, None, "first", "latest", "mean"]))
    return files, runs, keep


def _helm_example(stat: str, keep=None, model='"m"'):
    spec = '{"name": "boolq:model=m", "adapter_spec": {"model": %s}}' % model
    stats = f'[{{"instance_id": "id0", "stats": [{stat}]}}]'
    return ({"r/run_spec.json": spec, "r/per_instance_stats.json": stats},
            [(("r",), spec, stats)], keep)


@given(helm_inputs())
@FUZZ
@example(_helm_example(helm_stat("exact_match", "1" + "0" * 400)))  # was OverflowError
@example(_helm_example(helm_stat("exact_match", "true")))  # a boolean sum was taken as 1
@example(_helm_example(helm_stat("exact_match", "1"), model='"\\ud800"'))  # UnicodeEncodeError
@example(_helm_example(helm_stat("exact_match", "null", "3").replace('"count": 1', '"count": 4')))
def test_helm_reader(inputs):
    files, runs, keep = inputs
    ordered = [(spec, stats) for _, spec, stats in sorted(runs)]  # the folder walk's order
    expected = reference(ref_helm, ordered, "exact_match", keep)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _write(root, files)
        check("helm", root, expected, fmt="helm", keep=keep)


def test_outcome_counts_cover_both_branches():
    """Run after the readers (file order): each reader produced both stores and errors, so
    the generators reach valid inputs as well as invalid ones."""
    print("fuzz outcomes", OUTCOMES)
    assert len(OUTCOMES) == 3
    for reader, counts in OUTCOMES.items():
        assert counts.get("store", 0) > 0 and counts.get("error", 0) > 0, (reader, counts)
