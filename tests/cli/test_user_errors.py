"""Every user error a newcomer hit: one line naming the bad value, exit code 2, before any work.

Nothing here starts a server or a rank process: each case must fail in validation, which is
what makes the test fast (an unreachable --url proves no request was sent first).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli import bench_serve_launch
from sglang_vpp.cli.app import app

_URL = ["bench-serve", "--url", "http://127.0.0.1:1", "--no-progress"]
_BENCH = ["bench", "--quiet", "--seq-len", "512", "--requests", "1"]

CASES = [
    (_URL + ["--num-requests", "0"], "--num-requests"),
    (_URL + ["--input-len", "0"], "--input-len"),
    (_URL + ["--output-len", "0"], "--output-len"),
    (_URL + ["--input-len", "12q"], "--input-len"),
    (_URL + ["--concurrency", "0"], "--concurrency"),
    (_URL + ["--warmup", "-1"], "--warmup"),
    (_URL + ["--request-rate", "-1"], "--request-rate"),
    (_URL + ["--vocab-size", "0"], "--vocab-size"),
    (_URL + ["--timeout", "0"], "--timeout"),
    (_URL + ["--json", "/dev/null/out.json"], "--json"),
    # A blank server name would title the tables and the JSON with the URL, or with nothing.
    (_URL + ["--label", ""], "--label '' is empty; give the server a name"),
    (_URL + ["--label", "  "], "--label '  ' is empty"),
    (["bench-serve", "--url", "=http://127.0.0.1:1", "--no-progress"], "has an empty name before '='"),
    (["bench-serve", "--url", "http://127.0.0.1:abc", "--no-progress"], "port"),
    (["bench-serve", "--url", "http://127.0.0.1:99999", "--no-progress"], "port"),
    (["bench-serve", "--launch", "nonsense", "--no-progress"], "nonsense"),
    (["bench-serve", "--launch", "cpp", "--chunked-prefill-size", "0", "--no-progress"], "--chunked-prefill-size"),
    (["bench-serve", "--launch", "cpp,vpp-pack", "--port", "65535", "--no-progress"], "--port 65535"),
    (["bench-serve", "--launch", "cpp", "--port", "0", "--no-progress"], "--port 0"),
    (_URL + ["--workload", "file", "--file", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (_URL + ["--workload", "file"], "--file PATH"),
    (_URL + ["--file", "REQS"], "--workload file only"),
    (_URL + ["--repeats", "5"], "--repeats applies to --launch only; drop it with --url"),
    (_URL + ["--pp-size", "4", "--server-arg=--tp-size=2"], "--pp-size, --server-arg apply to --launch only"),
    # --model-path that does not exist: were the check to regress, the command still stops before any server.
    (["bench-serve", "--launch", "cpp", "--label", "x", "--model-path", "/nonexistent-model", "--no-progress"],
     "--label applies to --url only"),
    (_URL + ["--workload", "short", "--max-input-len", "4k"], "--max-input-len is read only with --workload mixed"),
    (_URL + ["--workload", "mixed", "--input-len", "1k", "--max-input-len", "4k"], "drop --input-len"),
    (_URL + ["--workload", "file", "--file", "REQS", "--input-len", "8"], "drop --input-len"),
    (_URL + ["--workload", "file", "--file", "REQS", "--request-rate", "2"], "drop --request-rate"),
    (_URL + ["--workload", "file", "--file", "REQS", "--num-requests", "5"], "holds 2 request(s)"),
    (_URL + ["--workload", "file", "--file", "REQS", "--dataset-name", "random-ids"], "--dataset-name"),
    (_URL + ["--workload", "file", "--file", "REQS", "--timeout", "0.5"], "past --timeout 0.5 s"),
    (_URL + ["--workload", "file", "--file", "REQS", "--bench-arg=--request-rate=4"], "--bench-arg=--request-rate"),
    (_URL + ["--workload", "file", "--file", "REQS", "--bench-arg=--rust-client"], "--bench-arg=--rust-client"),
    (_URL + ["--workload", "file", "--file", "BAD_LEN"], "BAD_LEN:2: length must be in 1..16777216"),
    (["simulate", "--workload", "file", "--file", "BAD_LEN"], "BAD_LEN:2: length must be in 1..16777216"),
    (_URL + ["--format", "xml"], "--format"),
    (_URL + ["--dataset-name", "sharegpt", "--dataset-path", "FOLDER.json"], "FOLDER.json: a directory, not a file"),
    (_URL + ["--dataset-name", "sharegpt"], "--dataset-path"),
    (_BENCH + ["--backend", "nope"], "nope"),
    (_BENCH + ["--backend", "nccl"], "nccl"),
    (_BENCH + ["--device", "cuda"], "cuda"),
    (_BENCH + ["--device", "tpu"], "--device"),
    (_BENCH + ["--model", "/nonexistent-model"], "no such path"),
    (_BENCH + ["--seq-len", "0"], "--seq-len"),
    (_BENCH + ["--chunk-size", "1x"], "--chunk-size"),
    (_BENCH + ["--timeout", "0"], "--timeout"),
    (_BENCH + ["--repeat", "0"], "--repeat"),
    (_BENCH + ["--pp", "1"], "--pp"),
    (_BENCH + ["--modes", ""], "no mode given"),
    (_BENCH + ["--modes", "cpp,zigzag"], "zigzag"),
    (_BENCH + ["--modes", "vpp", "--split", "1,1"], "layer split"),
    (_BENCH + ["--arrival-interval", "-1"], "--arrival-interval"),
    (_BENCH + ["--plot", "/dev/null/gantt.png"], "--plot"),
    (_BENCH + ["--json", "/dev/null/out.json"], "--json"),
    (["bench-serve", "--launch", "cpp", "--model-path", "/nonexistent-model", "--no-progress"], "--model-path"),
    (_URL + ["--input-len", "1k", "--output-len", "1k"], "does not answer"),  # sizes accepted: the URL fails
    (["simulate", "--costs", "NOT_JSON"], "is not readable JSON"),
    # JSON nested thousands deep: the decoder's RecursionError is not a JSONDecodeError (json_text).
    (["simulate", "--costs", "DEEP.json"], "is not readable JSON (nested too deep to read"),
    (["simulate", "--model", "DEEP.json"], "is not valid JSON: nested too deep to read"),
    (["simulate", "--workload", "file", "--file", "DEEP.json"], "DEEP.json:1: nested too deep to read"),
    (["simulate", "--costs", "NO_FORMAT"], 'has no "format" field'),
    (["simulate", "--costs", "/nonexistent.json"], "does not exist"),
    (["simulate", "--costs", "BAD_FIT"], "is a malformed sglang-vpp.fitted-cost file (KeyError: 'b')"),
    (["simulate", "--costs", "BAD_TABLE"], "is a malformed sglang-vpp.table-cost file"),
    # Unchecked, a NaN coefficient ends in a traceback and a negative measured time in negative TTFTs.
    (["simulate", "--costs", "NAN_FIT", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: per_layer coefficient d is nan, not a finite number >= 0)"),
    # A negative coefficient (the fit writes none) gave negative TTFTs and compute times.
    (["simulate", "--costs", "NEG_FIT", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: per_layer coefficient d is -0.01, not a finite number >= 0)"),
    (["simulate", "--costs", "INF_COUNT", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: per_layer num_samples is inf, not a whole number >= 0)"),
    # Unchecked, a string or boolean where a number goes reads as one (float("1e-9"), true as 1).
    (["simulate", "--costs", "STR_FIT", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: per_layer coefficient a is '1e-9', not a finite number >= 0)"),
    # Unchecked, a stage's layer count of 1.5 or true matches no stage (or a 1-layer one).
    (["simulate", "--costs", "HALF_LAYERS", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: stage 1 layers is 1.5, not a whole number >= 1)"),
    (["simulate", "--costs", "BOOL_LAYERS", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.fitted-cost file (ValueError: stage 0 layers is True, not a whole number >= 1)"),
    # Fitted per stage of another layout: refused before the first mode runs (unchecked: at vpp's first estimate).
    (["simulate", "--costs", "PP2_FIT", "--model", "qwen3-tiny", "--seq-len", "8k", "--modes", "cpp,vpp"],
     "was fitted for stages 0 (2 layers), 1 (2 layers) with no per-layer fit; used with a model of 4 layers in "
     "4 foldback stages (2 ranks) of 1, 1, 1, 1 layers, and stages 0, 1, 2, 3 have no fit"),
    (["simulate", "--costs", "INF_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (OverflowError: cannot convert float infinity to integer)"),
    (["simulate", "--costs", "NEG_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (ValueError: a time of -1.0 s, not a finite number >= 0)"),
    # A table of no compute rows, or rows float() and int() read loosely, ran every action (or the
    # mis-keyed ones) on the analytic fallback under the title "on the measured costs in FILE".
    (["simulate", "--costs", "EMPTY_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     'is a sglang-vpp.table-cost file with no "compute" rows'),
    (["simulate", "--costs", "STR_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (ValueError: a time of '0.5', not a number of seconds)"),
    (["simulate", "--costs", "BOOL_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (ValueError: a time of True, not a number of seconds)"),
    (["simulate", "--costs", "FRACTION_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (ValueError: an index of 0.7, not a whole number >= 0)"),
    (["simulate", "--costs", "NEG_INDEX_TABLE", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "is a malformed sglang-vpp.table-cost file (ValueError: an index of -1, not a whole number >= 0)"),
    # A fitted file times every stage itself: --hardware and --tp ran, ignored, with the same numbers.
    (["simulate", "--costs", "PER_LAYER_FIT", "--seq-len", "8k", "--modes", "cpp", "--tp", "4"],
     "is a fitted cost model, which times every stage itself: --tp would change nothing; drop --tp"),
    (["simulate", "--costs", "PER_LAYER_FIT", "--seq-len", "8k", "--modes", "cpp", "--hardware", "h200"],
     "--hardware would change nothing; drop --hardware"),
    # An output naming a file the command reads overwrote (--output-file: appended to) it after the run.
    (["simulate", "--costs", "PER_LAYER_FIT", "--seq-len", "8k", "--modes", "cpp", "--json", "PER_LAYER_FIT"],
     "the file --costs reads: the output would be written into it; give the output another file"),
    (["simulate", "--workload", "file", "--file", "REQS", "--modes", "cpp", "--trace", "REQS"],
     "the file --file reads"),
    (["simulate", "--model", "MODEL.json", "--seq-len", "8k", "--modes", "cpp", "--json", "MODEL.json"],
     "the file --model reads"),
    (_URL + ["--workload", "file", "--file", "REQS", "--output-file", "REQS"], "the file --file reads"),
    (_URL + ["--dataset-name", "sharegpt", "--dataset-path", "REQS", "--json", "REQS"], "the file --dataset-path reads"),
    # A --plot suffix matplotlib cannot write failed only when the plot was saved, after the run.
    (["simulate", "--seq-len", "8k", "--modes", "cpp", "--plot", "PLOT.txt"],
     "matplotlib writes no .txt files; end the name in .png, .svg or .pdf"),
    (_BENCH + ["--plot", "PLOT.txt", "--device", "npu"], "matplotlib writes no .txt files"),
    (_URL + ["--plot", "PLOT.txt"], "matplotlib writes no .txt files"),
    (["simulate", "--seq-len", "8k", "--json", "/dev/null/out.json"], "--json"),
    (["simulate", "--seq-len", "8k", "--plot", "/dev/null/gantt.png"], "--plot"),
    (["simulate", "--seq-len", "8k", "--trace", "/dev/null/trace.json"], "--trace"),
    (["simulate", "--workload", "short"], "needs --seq-len"),
    # Only mixed draws with --seed: given explicitly (even at its default 0) elsewhere it is refused.
    (["simulate", "--seed", "0"], "the long workload does not read --seed"),
    (["simulate", "--seq-len", "8k", "--jitter", "0.03", "--seed", "1"], "drop --seed (--jitter's draws are seeded by --jitter-seed)"),
    # A flag another one replaces would run as if not given.
    (["simulate", "--seq-len", "8k", "--modes", "cpp", "--chunk-size", "4k", "--sweep-chunk", "2k,8k", "--jitter", "2"],
     "--sweep-chunk replaces --chunk-size; give the sizes to sweep in --sweep-chunk and drop --chunk-size"),
    (["simulate", "--seq-len", "8k", "--modes", "cpp", "--jitter-seed", "3"],
     "--jitter-seed seeds --jitter's draws, and without --jitter there are none"),
    (["simulate", "--workload", "short", "--seq-len", "4k", "--seed", "7"], "the short workload does not read --seed"),
    (["simulate", "--workload", "file", "--file", "REQS", "--seed", "7"], "the file workload does not read --seed"),
    # random.Random seeds with the absolute value: --seed -1 drew the same workload as --seed 1.
    (["simulate", "--workload", "mixed", "--requests", "4", "--seed", "-1"], "--seed must be in 0..4294967295, got -1"),
    (["simulate", "--workload", "short", "--seq-len", "4k,8k"], "takes one --seq-len"),
    (["simulate", "--tp", "0"], "--tp"),
    (["simulate", "--tp", "-3"], "--tp"),
    (["simulate", "--requests", "0"], "--requests"),
    (["simulate", "--concurrency", "0"], "--concurrency"),
    (["simulate", "--pp", "0", "--seq-len", "8k"], "--pp"),
    (["simulate", "--seq-len", "0"], "--seq-len"),
    (["simulate", "--seq-len", "8k", "--sweep-chunk", "8k,0"], "--sweep-chunk"),
    (["simulate", "--model", "PARTIAL.json"], "missing fields"),
    (["simulate", "--workload", "file", "--file", "NOT_JSON"], "NOT_JSON:1"),
    (["simulate", "--workload", "file", "--file", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["doctor", "--timeout", "0"], "--timeout"),
    (["doctor", "--backend", "nope"], "nope"),
    # Output paths that exist but cannot be written (even by root): checked by creating the file.
    (["simulate", "--json", "/proc/sglang-vpp-out.json"], "--json '/proc/sglang-vpp-out.json' cannot be written"),
    (["simulate", "--plot", "/proc/gantt.png"], "--plot '/proc/gantt.png' cannot be written"),
    (["simulate", "--trace", "/proc/a/trace.json"], "--trace '/proc/a/trace.json' cannot be written"),
    (_BENCH + ["--json", "/proc/out.json"], "--json '/proc/out.json' cannot be written"),
    (_BENCH + ["--trace", "/proc/trace.json"], "--trace '/proc/trace.json' cannot be written"),
    (_BENCH + ["--plot", "/proc/gantt"], "--plot '/proc/gantt.png' cannot be written"),
    (_BENCH + ["--costs", "/proc/costs.json"], "--costs '/proc/costs.json' cannot be written"),
    (_URL + ["--json", "/proc/out.json"], "--json '/proc/out.json' cannot be written"),
    (_URL + ["--plot", "/proc/plot.png"], "--plot '/proc/plot.png' cannot be written"),
    # Two outputs to one file: the one written last replaced the other, with no word said.
    (["simulate", "--seq-len", "8k", "--json", "OUT.json", "--trace", "OUT.json"],
     "--json and --trace both name"),
    (["simulate", "--seq-len", "8k", "--json", "OUT.png", "--plot", "OUT.png"], "--json and --plot both name"),
    (_BENCH + ["--costs", "OUT.json", "--json", "OUT.json"], "--json and --costs both name"),
    (_URL + ["--json", "OUT.json", "--output-file", "OUT.json"], "--json and --output-file both name"),
    # Sizes and counts of the plan commands name their flag.
    (["schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "0", "--chunk-size", "8"], "--seq-len '0'"),
    (["schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "1x"], "--chunk-size '1x'"),
    (["schedule", "--mode", "cpp", "--pp", "0", "--seq-len", "64", "--chunk-size", "8"], "--pp must be >= 1"),
    (["schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--layers", "0"],
     "--layers must be >= 1"),
    (["check", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "0"], "--chunk-size '0'"),
    # auto is what simulate and bench take; here it read as a malformed size.
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "auto"],
     "--chunk-size auto is chosen while a run goes (simulate, bench)"),
    (["check", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "AUTO"], "--chunk-size auto is chosen"),
    (["check", "--mode", "cpp", "--pp", "2", "--seq-len", "-5", "--chunk-size", "8"], "--seq-len '-5'"),
    (["check", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--groups", "0"],
     "--groups must be 1 or 2"),
    # One chunk past the limit of chunks per request, in every command that cuts chunks (at 1m
    # tokens of 1-token chunks each took a minute and a gigabyte before printing anything).
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "16385", "--chunk-size", "1", "--layers", "2"],
     "a --seq-len request of 16385 tokens at --chunk-size 1 is 16385 chunks, more than the limit of 16384 "
     "per request; raise --chunk-size to 2 or more"),
    (["check", "--mode", "cpp", "--pp", "2", "--seq-len", "16385", "--chunk-size", "1", "--layers", "2"],
     "is 16385 chunks, more than the limit of 16384"),
    (["simulate", "--seq-len", "16385", "--chunk-size", "1", "--modes", "cpp"], "is 16385 chunks"),
    (["simulate", "--seq-len", "16385", "--sweep-chunk", "2,1", "--modes", "cpp"], "raise --sweep-chunk to 2"),
    (["simulate", "--workload", "file", "--file", "LONG_REQ", "--chunk-size", "1", "--modes", "cpp"],
     "the longest file request of 16385 tokens at --chunk-size 1 is 16385 chunks"),
    # --device npu: were the chunk count not checked first, the missing torch_npu would be the error.
    (_BENCH + ["--seq-len", "16385", "--chunk-size", "1", "--modes", "cpp", "--device", "npu"], "is 16385 chunks"),
    # A workload within the per-request limit but past the per-run one (at 8-token chunks the
    # default mixed workload is 1.4M chunks: minutes per mode with no output).
    (["simulate", "--workload", "mixed", "--chunk-size", "8", "--modes", "vpp"],
     "the mixed workload (500 requests, 11529308 tokens) at --chunk-size 8 is 1441375 chunks on 4 stages: "
     "5765500 units of planning work (chunks x stages), more than the limit of 4194304 per run; raise "
     "--chunk-size to 11 or more, send fewer requests or plan fewer stages (a smaller pp)"),
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "1", "--requests", "16385",
      "--layers", "4"], "the --requests x --seq-len load (16385 requests, 1048640 tokens) at --chunk-size 1 is "
     "1048640 chunks on 4 stages: 4194560 units"),
    (_BENCH + ["--requests", "16385", "--seq-len", "64", "--chunk-size", "1", "--modes", "cpp,vpp"],
     "the --requests x --seq-len load (16385 requests, 1048640 tokens) at --chunk-size 1 is 1048640 chunks on 4 "
     "stages"),
    # Deep plans of few chunks per stage: the work is chunks x stages (x ranks/24 past 24 ranks), so
    # 16384 chunks on 256 stages would plan for minutes with no output. The later error each case also
    # has (a --split of one entry, a --jitter past 1, a missing torch_npu) is the one a command
    # that did not weigh the stages would give.
    (["check", "--mode", "vpp", "--pp", "128", "--layers", "256", "--seq-len", "512k", "--chunk-size", "32",
      "--split", "1"],
     "the --requests x --seq-len load (1 requests, 524288 tokens) at --chunk-size 32 is 16384 chunks on 256 "
     "stages of 128 ranks: 22369621 units of planning work (chunks x stages x ranks/24), more than the limit "
     "of 4194304 per run; raise --chunk-size to 171 or more or plan fewer stages (a smaller pp)"),
    (["schedule", "--mode", "cpp", "--pp", "128", "--layers", "256", "--seq-len", "512k", "--chunk-size", "32",
      "--split", "1"], "is 16384 chunks on 128 stages of 128 ranks"),
    (["simulate", "--pp", "30", "--seq-len", "1m", "--requests", "4", "--chunk-size", "64", "--modes", "cpp,vpp",
      "--jitter", "2"],
     "the long workload (4 requests, 4194304 tokens) at --chunk-size 64 is 65536 chunks on 60 stages of 30 ranks"),
    (_BENCH + ["--seq-len", "1m", "--pp", "64", "--chunk-size", "64", "--modes", "vpp", "--device", "npu"],
     "is 16384 chunks on 128 stages of 64 ranks: 5592405 units"),
    (["layout", "--pp", "2", "--layers", "8", "--mode", "foo"], "expected one of contiguous, cpp, dcpp,"),
    # A --pp past sys.maxsize: the stage count took len() of a range and ended in OverflowError.
    (["layout", "--pp", "99999999999999999999", "--layers", "8"], "8 layers cannot fill 199999999999999999998 stages"),
    (["check", "--mode", "cpp", "--pp", "99999999999999999999", "--seq-len", "8", "--chunk-size", "8"],
     "is at least 1 chunks on 99999999999999999999 stages"),
    (["simulate", "--pp", "99999999999999999999", "--seq-len", "8", "--modes", "vpp"],
     "is 1 chunks on 199999999999999999998 stages"),
    (["layout", "--pp", "0", "--layers", "8"], "--pp must be >= 1"),
    # --fold: the value, and what a fused fold changes (2P-1 stages; only vpp modes have a fold).
    (["layout", "--pp", "2", "--layers", "8", "--fold", "merged"], "--fold must be split or fused, got 'merged'"),
    (["layout", "--pp", "2", "--layers", "8", "--mode", "cpp", "--fold", "fused"], "has no fold"),
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--fold", "x"],
     "--fold must be split or fused"),
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--layers", "8",
      "--fold", "fused", "--split", "2,2,2,2"], "has 4 entries; the foldback layout (fused fold) with pp=2 has 3"),
    (["check", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--fold", "x"],
     "--fold must be split or fused"),
    (["simulate", "--modes", "vpp", "--fold", "x"], "--fold must be split or fused"),
    (_BENCH + ["--fold", "x"], "--fold must be split or fused"),
    (_BENCH + ["--modes", "vpp", "--fold", "fused", "--split", "2,2,2,2"], "(fused fold) with pp=2 has 3 stages"),
    # Values that once passed the checks and failed in the rank processes or in C with a traceback.
    (_BENCH + ["--arrival-interval", "inf"], "--arrival-interval must be a finite number, got inf"),
    # A finite interval past a week: the run would wait for the second request in real time
    # (--device npu: without this check, the missing torch_npu would be the error).
    (_BENCH + ["--arrival-interval", "1e300", "--device", "npu"],
     "--arrival-interval must be at most 604800 s (a week of real time), got 1e+300"),
    (_BENCH + ["--requests", "3", "--arrival-interval", "302401", "--device", "npu"],
     "--arrival-interval must be at most 302400 s with --requests 3 (the last arrival within 604800 s, a week "
     "of real time), got 302401"),
    (_BENCH + ["--timeout", "inf"], "--timeout must be at most 604800 s (a week), got inf"),
    (_BENCH + ["--backend", "gloo@double"], "only device backends (nccl, hccl) have a test double"),
    # Counts that would run for days or fill the memory (--device npu, --port 70000: refused later).
    (_URL + ["--num-requests", str(10**12)], "--num-requests must be at most 100000 (requests per pass), got "
     "1000000000000"),
    (_URL + ["--warmup", str(10**12)], "--warmup must be at most 100000 (requests per pass), got 1000000000000"),
    (_BENCH + ["--repeat", str(10**12), "--device", "npu"], "--repeat must be at most 100 (runs per mode), got "
     "1000000000000"),
    (["bench-serve", "--launch", "cpp", "--no-progress", "--repeats", "101", "--port", "70000"],
     "--repeats must be at most 100 (passes per server), got 101"),
    (["doctor", "--timeout", "1e300"], "--timeout must be at most 604800 s"),
    (["doctor", "--backend", "gloo@double"], "only device backends (nccl, hccl) have a test double"),
    (_URL + ["--timeout", "inf"], "--timeout must be at most 604800 s"),
    (["simulate", "--sweep-chunk", ""], "--sweep-chunk needs at least one size"),
    # '-' is stdout for --json only: a trace, plot or cost file was written to a file named '-'.
    (["simulate", "--seq-len", "8k", "--trace", "-"], "--trace '-': only --json writes to stdout"),
    (["simulate", "--seq-len", "8k", "--plot", "-"], "--plot '-': only --json writes to stdout"),
    (_BENCH + ["--costs", "-"], "--costs '-': only --json writes to stdout"),
    (_BENCH + ["--trace", "-"], "--trace '-': only --json writes to stdout"),
    (_URL + ["--output-file", "-"], "--output-file '-': only --json writes to stdout"),
    (["simulate", "--model", "/nonexistent.json"], "model preset file '/nonexistent.json' does not exist"),
    # Values that would end in a traceback, run for minutes, or run something not asked for. A trailing
    # --jitter 2, --device npu or --port 70000 is refused later in each command: the error a
    # command without the check gives (and, for --launch, refused before any server starts).
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "inf", "--chunk-size", "8"],
     "--seq-len 'inf' is not a size >= 1"),
    (["simulate", "--chunk-size", "inf", "--modes", "cpp"], "--chunk-size 'inf' is not a size >= 1"),
    (_URL + ["--input-len", "inf"], "--input-len 'inf' is not a size >= 1"),
    (["simulate", "--seq-len", "16777217", "--modes", "cpp", "--jitter", "2"],
     "--seq-len '16777217' is 16777217 tokens, more than the most any size takes, 16777216 (16m)"),
    (_URL + ["--output-len", "1e30"], "--output-len '1e30' is 1000000000000000019884624838656 tokens, more than"),
    (["schedule", "--mode", "vpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--requests", "2000000"],
     "--requests 2000000 is at least 2000000 chunks on 4 stages, more than the limit of 4194304 units of "
     "planning work per run at any chunk size; send at most 1048576 requests"),
    (["simulate", "--workload", "mixed", "--requests", "5000000", "--modes", "cpp"],
     "--requests 5000000 is at least 5000000 chunks on 2 stages"),
    (_BENCH + ["--requests", "2000000", "--seq-len", "64", "--chunk-size", "64", "--modes", "vpp"],
     "--requests 2000000 is at least 2000000 chunks on 4 stages"),
    (["simulate", "--split", "", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "--split '' gives no count; give one per stage like 3,3,3,3, or drop --split"),
    (_BENCH + ["--split", "", "--device", "npu"], "--split '' gives no count"),
    # One split for modes of P and 2P stages fits neither: the per-layout error sent the user from one count to the other.
    (["simulate", "--seq-len", "8k", "--split", "30,31"],
     "--split 30,31 gives one layer count per stage, but at --pp 2 the modes lay out different stage counts (cpp, "
     "dcpp: 2; vpp, vpp-async, vpp-pack, vpp-taper, vpp-stream: 4): run the modes of one stage count per command "
     "(its 2 counts fit --modes cpp,dcpp), or drop --split"),
    (["simulate", "--seq-len", "8k", "--modes", "vpp,cpp", "--split", "15,15,15,16"], "(its 4 counts fit --modes vpp)"),
    (["simulate", "--seq-len", "8k", "--modes", "cpp,vpp", "--fold", "fused", "--split", "1,2"],
     "different stage counts (cpp: 2; vpp: 3)"),
    (_BENCH + ["--modes", "cpp,vpp", "--split", "4,4"], "(cpp: 2; vpp: 4): run the modes of one stage count"),
    (["layout", "--pp", "2", "--layers", "8", "--mode", "vpp", "--split", "2,,2,2,2"],
     "--split '2,,2,2,2' has an empty entry; give one count per stage like 3,3,3,3"),
    (["schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--layers", "4",
      "--split", "2,2,"], "--split '2,2,' has an empty entry"),
    (["layout", "--pp", "2", "--layers", "100000"], "--layers must be at most 4096 (the most layers a model takes)"),
    (["check", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8", "--layers", "5000"],
     "--layers must be at most 4096"),
    (["simulate", "--tp", "100000", "--seq-len", "8k", "--modes", "cpp", "--jitter", "2"],
     "--tp must be at most 65536 chips per pipeline rank, got 100000"),
    (["doctor", "--sglang", "--backend", "gloo"], "--sglang lists the SGLang surface and runs no self-test; "
     "drop --backend"),
    (["doctor", "--sglang", "--no-self-test", "--timeout", "5"], "drop --no-self-test, --timeout"),
    (_BENCH + ["--model", "", "--device", "npu"], "--model '' is empty"),
    (_BENCH + ["--backend", "", "--device", "npu"], "--backend '' is empty"),
    (["check", "--trace", ""], "--trace '' is empty"),
    (_URL + ["--tokenizer", ""], "--tokenizer '' is empty"),
    (_URL + ["--dataset-name", " "], "--dataset-name ' ' is empty"),
    (_URL + ["--bench-arg", ""], "--bench-arg '' is empty; give one argument per --bench-arg"),
    (["bench-serve", "--launch", "cpp", "--no-progress", "--model-path", "", "--port", "70000"],
     "--model-path '' is empty"),
    (["bench-serve", "--launch", "cpp", "--no-progress", "--server-arg", "", "--port", "70000"],
     "--server-arg '' is empty; give one argument per --server-arg, e.g. --server-arg=--max-total-tokens"),
    (["bench-serve", "--launch", "cpp", "--no-progress", "--device", "", "--port", "70000"], "--device '' is empty"),
    (_URL + ["--work-dir", "NOT_JSON"], "is a file; give a directory (made if missing)"),
    (["bench-serve", "--url", "http://[::1", "--no-progress"], "--url 'http://[::1' is not a URL (Invalid IPv6 URL)"),
    (["bench-serve", "--url", "vpp=", "--no-progress"], "--url 'vpp=' has no URL after '='"),
    # A pass that would only be cut off by --timeout, and seeds numpy (bench_serving) or torch
    # (bench's reference) would refuse after the work started.
    (_URL + ["--request-rate", "1e-300"], "--request-rate 1e-300 sends 16 requests over about 1.6e+301 s, past "
     "--timeout 600 s for one pass; raise --request-rate or --timeout"),
    (_URL + ["--seed", "-1"], "--seed must be in 0..4294967295, got -1"),
    (["bench-serve", "--launch", "cpp", "--no-progress", "--seed", "4294967295", "--port", "70000"],
     "--seed must be in 0..4294966295 (it adds up to 1000 for repeats and warm-up)"),
    (_BENCH + ["--seed", "4294967296", "--device", "npu"], "--seed must be in 0..4294967295, got 4294967296"),
    (["simulate", "--hardware", "LIST.json"], "holds list, not a JSON object"),
    (["simulate", "--model", "FOLDER.json"], "cannot be read (Is a directory)"),
    # --jitter 2 is refused after the presets are read: the error a preset left unchecked gives.
    (["simulate", "--hardware", "NO_HOP.json", "--jitter", "2"],
     "NO_HOP.json': pp_tensors is 0, not a whole number in [1, 16]"),
]


def _assert_one_line_error(result, fragment: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], result.output
    # No Python value or signature leaks into the message.
    assert not any(leak in lines[0] for leak in ("got None", "format None", "exists: ", "__init__()", "['")), lines[0]


def _case_id(args: list[str]) -> str:
    return " ".join(args[{"bench-serve": 2, "bench": 6}.get(args[0], 1):]) or args[0]


@pytest.mark.parametrize("args, fragment", CASES, ids=[_case_id(a) for a, _ in CASES])
def test_user_error_is_one_line_exit_2(args, fragment, tmp_path):
    files = {"NOT_JSON": "not json at all\n", "NO_FORMAT": '{"stages": {}}\n', "PARTIAL.json": '{"name": "x"}\n',
             "BAD_FIT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": 1}}\n',
             "BAD_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[0, 1]]}\n',
             "NAN_FIT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": 0, "b": 1e-6, "d": NaN}}\n',
             "NEG_FIT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": 0, "b": 1e-6, "d": -0.01}}\n',
             "INF_COUNT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": 0, "b": 1e-6, "d": 0, '
                          '"num_samples": Infinity}}\n',
             "STR_FIT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": "1e-9", "b": 1e-6, "d": 0}}\n',
             "HALF_LAYERS": '{"format": "sglang-vpp.fitted-cost", "stages": {"0": {"a": 0, "b": 1e-6, "d": 0, '
                            '"layers": 2}, "1": {"a": 0, "b": 1e-6, "d": 0, "layers": 1.5}}}\n',
             "BOOL_LAYERS": '{"format": "sglang-vpp.fitted-cost", "stages": {"0": {"a": 0, "b": 1e-6, "d": 0, '
                            '"layers": true}}}\n',
             "PP2_FIT": '{"format": "sglang-vpp.fitted-cost", "stages": {"0": {"a": 0, "b": 1e-6, "d": 0, "layers": 2}, '
                        '"1": {"a": 0, "b": 1e-6, "d": 0, "layers": 2}}}\n',
             "INF_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[Infinity, 0, 0, 1]]}\n',
             "NEG_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[0, 0, 0, -1]]}\n',
             "PER_LAYER_FIT": '{"format": "sglang-vpp.fitted-cost", "per_layer": {"a": 0, "b": 1e-6, "d": 0}}\n',
             "EMPTY_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [], "transfer": [[0, 0, 0, 1]]}\n',
             "STR_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[0, 0, 0, "0.5"]]}\n',
             "BOOL_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[0, 0, 0, true]]}\n',
             "FRACTION_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[0.7, 0, 0, 0.5]]}\n',
             "NEG_INDEX_TABLE": '{"format": "sglang-vpp.table-cost", "compute": [[-1, 0, 0, 0.5]]}\n',
             "PLOT.txt": "", "OUT.png": "", "MODEL.json": "{}\n",
             "REQS": '{"length": 64}\n{"length": 8, "arrival": 0.5}\n', "BAD_LEN": '{"length": 3}\n{"length": 0}\n',
             "LONG_REQ": '{"length": 8}\n{"length": 16385, "arrival": 1}\n', "LIST.json": "[]\n",
             "DEEP.json": '{"a": ' * 100_000 + "0" + "}" * 100_000 + "\n", "OUT.json": "{}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    hardware = json.loads((resources.files("sglang_vpp.sim") / "presets" / "hardware" / "cpu.json").read_text())
    files["NO_HOP.json"] = json.dumps({**hardware, "pp_tensors": 0})
    (tmp_path / "NO_HOP.json").write_text(files["NO_HOP.json"])
    (tmp_path / "FOLDER.json").mkdir()
    files["FOLDER.json"] = ""
    args = [str(tmp_path / a) if a in files else a for a in args]
    _assert_one_line_error(CliRunner().invoke(app, args), fragment)


def test_launch_without_sglang_says_so(monkeypatch):
    monkeypatch.setattr(bench_serve_launch, "missing_requirements", lambda: ["sglang", "transformers"])
    result = CliRunner().invoke(app, ["bench-serve", "--launch", "cpp", "--no-progress"])
    _assert_one_line_error(result, "not installed")


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("sglang-vpp ")


def test_bench_serve_without_sglang_says_so(monkeypatch):
    from sglang_vpp.cli import bench_serve_cmd

    monkeypatch.setattr(bench_serve_cmd, "bench_serving_missing", lambda: "bench-serve needs sglang (not installed)")
    _assert_one_line_error(CliRunner().invoke(app, _URL), "not installed")


def test_bare_simulate_runs_the_documented_default():
    from sglang_vpp.cli.simulate_cmd import DEFAULT_LONG_SEQ_LEN

    result = CliRunner().invoke(app, ["simulate", "--modes", "cpp"])
    assert result.exit_code == 0, result.output
    assert DEFAULT_LONG_SEQ_LEN == "128k" and "1 x [131072] tokens" in result.output
    assert f"defaults to {DEFAULT_LONG_SEQ_LEN}" in (Path(__file__).parents[2] / "docs" / "cli.md").read_text()


def test_plot_without_suffix_is_written_and_named_as_png(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--seq-len", "8k", "--modes", "cpp", "--plot", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"plot: {tmp_path / 'out.png'}" in result.output and (tmp_path / "out.png").is_file()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["simulate", "--seq-len", "8k", "--modes", "cpp"], _URL],
                         ids=["simulate", "bench-serve"])
def test_a_plot_name_ending_in_a_dot_is_refused_not_written_as_dot_dot_png(command, tmp_path):
    # Path reads the empty suffix of "out." as none; appending ".png" would write "out..png".
    plot = tmp_path / "out."
    result = CliRunner().invoke(app, command + ["--plot", str(plot)])
    _assert_one_line_error(result, f"--plot {str(plot)!r}: empty file suffix; end the name in .png, .svg or "
                                   ".pdf, or drop the dot for .png")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, fragment", [
    (["--costs", "c.json", "--trace", "c.vpp.json"], "--trace and --costs's vpp samples both name"),
    (["--json", "c.cpp.json", "--costs", "c.json"], "--json and --costs's cpp samples both name"),
    (["--costs", "c", "--json", "c.vpp.json"], "--json and --costs's vpp samples both name"),
], ids=["trace on vpp samples", "json on cpp samples", "json on samples of a stem"])
def test_bench_refuses_an_output_on_a_cost_samples_file_of_costs(flags, fragment, tmp_path):
    """``--costs c.json`` also writes ``c.<mode>.json``; another output there was overwritten silently.
    The trailing --device npu is refused later, so no run starts without the check."""
    flags = [str(tmp_path / f) if f.startswith("c") else f for f in flags]
    _assert_one_line_error(CliRunner().invoke(app, _BENCH + ["--modes", "cpp,vpp", *flags, "--device", "npu"]),
                           fragment)


def test_bench_with_a_mode_named_twice_and_costs_is_not_a_clash(tmp_path):
    """A mode listed twice runs once and writes one samples file: nothing to refuse (the trailing
    --device npu is then what refuses the command)."""
    result = CliRunner().invoke(app, _BENCH + ["--modes", "vpp,vpp", "--costs", str(tmp_path / "c.json"),
                                               "--device", "npu"])
    assert result.exit_code == 2 and "both name" not in result.output and "npu" in result.output, result.output


@pytest.mark.parametrize("flags, fragment", [
    (["--plot", "t.png", "--json", "t-gantt.png"], "--json and --plot's -gantt.png both name"),
    (["--output-file", "t-gantt.png", "--plot", "t"], "--output-file and --plot's -gantt.png both name"),
], ids=["json on the gantt", "output-file on the gantt of a plot without suffix"])
def test_bench_serve_launch_refuses_an_output_on_the_gantt_of_plot(flags, fragment, tmp_path):
    """``--launch --plot t.png`` also writes ``t-gantt.png``; another output there was overwritten
    silently. The trailing --port 70000 is refused later, so no server starts without the check."""
    flags = [str(tmp_path / f) if f.startswith("t") else f for f in flags]
    _assert_one_line_error(CliRunner().invoke(app, ["bench-serve", "--launch", "cpp", "--no-progress", *flags,
                                                    "--port", "70000"]), fragment)


def test_a_checked_output_path_leaves_nothing_behind(tmp_path):
    from sglang_vpp.cli.common import check_output_path

    check_output_path(tmp_path / "a" / "b" / "out.json", "--json")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept.json").write_text("old")
    check_output_path(tmp_path / "kept.json", "--json")
    assert (tmp_path / "kept.json").read_text() == "old"


@pytest.mark.parametrize("command", ["layout", "schedule", "check", "simulate", "bench", "bench-serve", "doctor"])
def test_help_keeps_every_option_name_whole_in_80_columns(command):
    import re

    import typer.main

    result = CliRunner().invoke(app, [command, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert "…" not in result.output
    # A hyphenated name is never split across lines (``--pp-`` / ``mode``).
    assert not [line for line in lines if re.search(r"\w-$", line)], result.output
    params = typer.main.get_command(app).commands[command].params
    for name in (o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")):
        assert re.search(re.escape(name) + r"(?![\w-])", result.output), f"{command} --help cuts {name}"


@pytest.mark.parametrize("server_args, fragment", [
    (("--pp-mode", "vpp"), "sets pp-mode to 'vpp', which bench-serve sets itself; use bench-serve's --launch"),
    (("--pipeline-parallel-size=4",), "sets pp-size to 4"),
    (("--model", "/elsewhere"), "use bench-serve's --model-path"),
])
def test_launch_refuses_a_server_arg_that_overrides_what_it_sets(server_args, fragment):
    pytest.importorskip("sglang")
    spec = bench_serve_launch.LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64, server_args=server_args)
    with pytest.raises(bench_serve_launch.LaunchError, match="--launch cpp: --server-arg ") as caught:
        bench_serve_launch.check_launch_args(spec, ["cpp"])
    assert fragment in str(caught.value)
    bench_serve_launch.check_launch_args(
        bench_serve_launch.LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64,
                                      server_args=("--max-total-tokens", "32768", "--pp-mode=cpp")), ["cpp"])


def test_launch_refuses_a_server_arg_trace_directory_it_would_ignore():
    pytest.importorskip("sglang")
    spec = bench_serve_launch.LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64,
                                         server_args=("--vpp-trace=/tmp/mine",))
    with pytest.raises(bench_serve_launch.LaunchError, match="sets --vpp-trace, which bench-serve sets itself"):
        bench_serve_launch.check_launch_args(spec, ["vpp"])


def test_a_plot_path_that_is_a_directory_is_refused_not_written_next_to_it(tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    result = CliRunner().invoke(app, ["simulate", "--seq-len", "8k", "--modes", "cpp", "--plot", str(folder)])
    _assert_one_line_error(result, "is a directory")
    assert not (tmp_path / "plots.png").exists()


def test_bench_on_a_model_dir_whose_config_is_not_an_object_is_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text("[]")
    (tmp_path / "model.safetensors").write_bytes(b"")
    result = CliRunner().invoke(app, [*_BENCH, "--model", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: --model {tmp_path}: config.json holds list [], not the model's object of settings"]


_DEEP = '{"a": ' * 100_000 + "0" + "}" * 100_000 + "\n"


def test_bench_on_a_model_dir_whose_config_is_nested_too_deep_is_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(_DEEP)
    (tmp_path / "model.safetensors").write_bytes(b"")
    _assert_one_line_error(CliRunner().invoke(app, [*_BENCH, "--model", str(tmp_path)]),
                           "cannot read config.json (nested too deep to read")


def test_check_trace_whose_records_are_nested_too_deep_is_one_line_exit_2(tmp_path):
    (tmp_path / "vpp_rank0.records.json").write_text(_DEEP)
    _assert_one_line_error(CliRunner().invoke(app, ["check", "--trace", str(tmp_path)]),
                           "is not a readable records file (nested too deep to read")


def test_layout_fold_help_says_what_layout_does_with_a_contiguous_mode():
    """The other commands run cpp/dcpp as always under --fold fused; layout refuses it, and its
    help said it was ignored."""
    help_text = " ".join(CliRunner().invoke(app, ["layout", "--help"]).output.split())
    assert "ignore it" not in help_text
    assert "cpp and dcpp have no fold: --fold fused with them is an error" in help_text
    _assert_one_line_error(CliRunner().invoke(app, ["layout", "--pp", "2", "--layers", "8", "--mode", "dcpp",
                                                    "--fold", "fused"]), "has no fold")


def test_a_table_cost_file_still_reads_tp_for_the_actions_it_lacks(tmp_path):
    """Only a fitted file replaces the analytic model: a table one falls back to it, --tp included."""
    table = tmp_path / "table.json"
    table.write_text('{"format": "sglang-vpp.table-cost", "compute": [[0, 0, 0, 0.5]]}\n')
    result = CliRunner().invoke(app, ["simulate", "--costs", str(table), "--seq-len", "8k", "--modes", "cpp",
                                      "--tp", "4"])
    assert result.exit_code == 0, result.output


def test_an_output_named_like_a_preset_is_written(tmp_path, monkeypatch):
    """A shipped preset name reads the shipped preset, never a file of that name in the working
    directory: such a file may be the output."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deepseek-v3.1").write_text("{}\n")
    result = CliRunner().invoke(app, ["simulate", "--seq-len", "8k", "--modes", "cpp", "--json", "deepseek-v3.1"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "deepseek-v3.1").read_text())["config"]["model"] == "deepseek-v3.1"


class _PastThePortCheck(Exception):
    """Raised where run_launched would go on to start servers."""


@pytest.mark.parametrize("first_port, modes, accepted", [
    (65535, ["cpp"], True),  # one server, on the highest port
    (65534, ["cpp", "vpp"], True),
    (65535, ["cpp", "vpp"], False),
])
def test_the_highest_port_is_one_rule_for_bench_serve_and_the_launcher(monkeypatch, first_port, modes, accepted):
    """Server i listens on --port + i: the last of N servers on --port + N - 1 <= 65535. The command's
    check and run_launched's ask one helper, so both accept and refuse the same ports in the same words."""
    def past_the_port_check() -> None:
        raise _PastThePortCheck

    monkeypatch.setattr(bench_serve_launch, "check_can_launch", past_the_port_check)
    spec = bench_serve_launch.LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64, first_port=first_port)
    expected = pytest.raises(_PastThePortCheck) if accepted else pytest.raises(
        bench_serve_launch.LaunchError, match=rf"^--port {first_port}: {len(modes)} server\(s\) need ports ")
    with expected:
        bench_serve_launch.run_launched(spec, modes, repeats=1, warm_up=lambda _url: 0,
                                        run_once=lambda _url, _repeat: None)
    error = bench_serve_launch.port_range_error(first_port, len(modes))
    assert (error is None) == accepted
