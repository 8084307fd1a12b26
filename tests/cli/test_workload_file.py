"""The workload file simulate and bench-serve share: what it accepts, and one clear error per bad line."""

from __future__ import annotations

import pytest

from sglang_vpp.workload_file import WorkloadFileError, WorkloadRecord, read_workload_file


def test_reads_lengths_arrivals_and_output_lengths_in_arrival_order(tmp_path):
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"length": 300, "arrival": 0.5, "output_len": 7}\n# note\n\n'
                    '{"input_len": 100, "id": "kept out"}\n{"prompt_len": 2.0, "arrival": 0.5}\n')
    assert read_workload_file(path) == [WorkloadRecord(100, 0.0, None), WorkloadRecord(300, 0.5, 7),
                                        WorkloadRecord(2, 0.5, None)]


@pytest.mark.parametrize("line, fragment", [
    ('{"tokens": 5}', "no length"),
    ('{"length": 0}', "length must be in 1..16777216"),
    ('{"length": -4}', "length must be in 1..16777216"),
    ('{"length": 3.5}', "whole number"),
    ('{"length": true}', "whole number"),
    ('{"length": "12"}', "whole number"),
    ('{"length": Infinity}', "whole number"),
    ('{"length": 8, "arrival": -1}', "arrival must be"),
    ('{"length": 8, "arrival": NaN}', "arrival must be"),
    ('{"length": 8, "arrival": "soon"}', "arrival must be"),
    ('{"length": 8, "arrival": 1e308}', "arrival must be a number of seconds in 0..31536000"),
    ('{"length": 16777217}', "length must be in 1..16777216"),
    ('{"length": 9007199254740993.0}', "length must be in 1..16777216"),
    ('{"length": 8, "output_len": 0}', "output_len must be in 1..16777216"),
    # Two lengths: one would be read, the other silently ignored.
    ('{"length": 64, "input_len": 128}', "length and input_len both give the length; keep one"),
    ('[8, 0.5]', "expected a JSON object"),
    ('{"length": 8,', "Expecting"),
])
def test_a_bad_line_names_the_file_the_line_and_the_expected_form(tmp_path, line, fragment):
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"length": 8}\n' + line + "\n")
    with pytest.raises(WorkloadFileError) as caught:
        read_workload_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: ") and fragment in message and '"length": 4096' in message


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "missing.jsonl", "does not exist"),
    (lambda d: d, "is a directory"),
    (lambda d: (d / "empty.jsonl", (d / "empty.jsonl").write_text("# nothing\n"))[0], "holds no requests"),
])
def test_an_unusable_file_is_one_error(tmp_path, make, fragment):
    with pytest.raises(WorkloadFileError, match=fragment):
        read_workload_file(make(tmp_path))


def test_file_load_refuses_a_bench_serving_without_its_hook_targets(monkeypatch, tmp_path, capsys):
    """bench_serving's dataset and pacing functions are replaced for --workload file; an SGLang
    whose bench_serving lacks them is an error naming the target, not a run with another load."""
    import importlib
    from types import SimpleNamespace

    from sglang_vpp.serving import file_load

    def fake_import(name):
        if name == "sglang.benchmark.serving":
            return SimpleNamespace(get_dataset=lambda *a: [], cli_main=lambda: None)
        return SimpleNamespace(sample_random_requests=lambda **k: [])

    monkeypatch.setattr(importlib, "import_module", fake_import)
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"length": 8}\n')
    with pytest.raises(SystemExit) as caught:
        file_load.main([file_load.WORKLOAD_FILE_FLAG, str(path), "--backend", "sglang"])
    assert "sglang.benchmark.serving.get_request" in str(caught.value)
    assert "DatasetRow.timestamp" in str(caught.value)


def test_a_file_pass_is_paced_by_bench_servings_trace_flag_except_a_warm_up(tmp_path):
    """Measured passes send each request at its arrival; --launch's warm-up pass sends at once."""
    from pathlib import Path

    from sglang_vpp.serving.bench_serving import LoadPlan, Workload

    plan = LoadPlan(Workload.FILE, num_requests=2, input_len=64, output_len=4, concurrency=2,
                    workload_file=tmp_path / "reqs.jsonl")
    measured = plan.argv("http://127.0.0.1:1", Path("out.jsonl"), seed_offset=0)
    warm_up = plan.argv("http://127.0.0.1:1", Path("out.jsonl"), seed_offset=0, paced=False)
    assert measured[1:3] == ["-m", "sglang_vpp.serving.file_load"] and "--use-trace-timestamps" in measured
    assert "--use-trace-timestamps" not in warm_up and "--tokenize-prompt" in warm_up


def test_a_note_with_a_unicode_line_separator_and_a_bom_or_crlf_is_still_one_request_a_line(tmp_path):
    """JSON allows U+2028, U+2029 and U+0085 unescaped in a string; they end no JSONL line."""
    path = tmp_path / "reqs.jsonl"
    path.write_bytes('\ufeff{"length": 100, "note": "a\u2028b\u2029c\x85d"}\r\n{"length": 20, "arrival": 1}\r\n'
                     .encode("utf-8"))
    assert read_workload_file(path) == [WorkloadRecord(100, 0.0, None), WorkloadRecord(20, 1.0, None)]
    path.write_bytes(b'{"length": 100}\r{"length": 20, "arrival": 1}\r')  # old Mac line ends
    assert read_workload_file(path) == [WorkloadRecord(100, 0.0, None), WorkloadRecord(20, 1.0, None)]
