#!/usr/bin/env bash
# Screen several tuning candidates side by side on a many-core machine: one `benchmarks.compare` matrix per line of a
# batch file, all started at once with one worker per seed, detached from this shell so that they outlive it.
# Run it from the repository's root:
#
#   benchmarks/screen_batch.sh start BATCH SEEDS TIMESTEPS     # BATCH: lines "ALGO ENV CANDIDATE_FILE OUT_FOLDER"
#   benchmarks/screen_batch.sh wait BATCH SECONDS [COPY_TO]    # until every matrix ends or SECONDS pass, then copy
#                                                              # each OUT_FOLDER/runs.jsonl to COPY_TO/FOLDER.jsonl
#
# PYTHON (default .venv/bin/python) runs the matrices; each worker trains with one thread. The runs land in each
# OUT_FOLDER/runs.jsonl as they finish (a folder that already has runs resumes, as `benchmarks.compare` does);
# `python -m benchmarks.screen FOLDER...` compares them. `wait` exits non-zero if a matrix is still running at the
# deadline or failed. Each matrix writes its exit status to OUT_FOLDER/screen_batch.rc when it ends, so a finished
# matrix counts as ended even where nothing reaps the detached process.
set -euo pipefail

PYTHON=${PYTHON:-.venv/bin/python}
EVAL_FREQ=${EVAL_FREQ:-50000}
POLL_SECONDS=${POLL_SECONDS:-10}
USAGE="usage: $0 start BATCH SEEDS TIMESTEPS | wait BATCH SECONDS [COPY_TO]"

candidates() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1"; }

is_running() { [[ -f $1/screen_batch.pid && ! -f $1/screen_batch.rc ]] && kill -0 "$(cat "$1/screen_batch.pid")" 2>/dev/null; }

start() {
    local batch=$1 seeds=$2 timesteps=$3 workers
    workers=$(tr ',' '\n' <<<"$seeds" | wc -l)
    while read -r algo env file out extra; do
        if [[ -z $out || -n $extra ]]; then echo "a batch line needs 4 fields: $algo $env $file $out $extra" >&2; exit 2; fi
        if is_running "$out"; then echo "$out: a matrix is still running there" >&2; exit 1; fi
        mkdir -p "$out"
        rm -f "$out/screen_batch.rc"
        OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 setsid nohup bash -c '"${@:2}"; echo $? >"$1/screen_batch.rc"' _ "$out" \
            "$PYTHON" -m benchmarks.compare --algos "$algo" --conf "$algo=$file" --envs "$env" --seeds "$seeds" \
            --timesteps "$timesteps" --eval-freq "$EVAL_FREQ" --workers "$workers" --out "$out" \
            >>"$out/screen_batch.log" 2>&1 </dev/null &
        echo "$!" >"$out/screen_batch.pid"
        echo "started $algo $env $file -> $out (pid $!)"
    done < <(candidates "$batch")
}

running() {
    local out
    while read -r _ _ _ out; do
        if is_running "$out"; then echo "$out"; fi
    done < <(candidates "$1")
}

wait_for() {
    local batch=$1 seconds=$2 copy_to=${3:-} deadline out status=0
    deadline=$((SECONDS + seconds))
    while [[ -n $(running "$batch") && $SECONDS -lt $deadline ]]; do sleep "$POLL_SECONDS"; done
    echo "still running: $(running "$batch" | tr '\n' ' ')"
    [[ -z $(running "$batch") ]] || status=1
    while read -r _ _ _ out; do
        echo "$out: $(cat "$out/runs.jsonl" 2>/dev/null | wc -l) runs recorded, exit status $(cat "$out/screen_batch.rc" 2>/dev/null || echo -)"
        if [[ -f $out/screen_batch.rc && $(cat "$out/screen_batch.rc") != 0 ]]; then status=1; fi
        if [[ -n $copy_to && -f $out/runs.jsonl ]]; then cp "$out/runs.jsonl" "$copy_to/$(basename "$out").jsonl"; fi
    done < <(candidates "$batch")
    return "$status"
}

case ${1:-} in
    start) [[ $# -eq 4 ]] || { echo "$USAGE" >&2; exit 2; }; start "$2" "$3" "$4" ;;
    wait) [[ $# -eq 3 || $# -eq 4 ]] || { echo "$USAGE" >&2; exit 2; }; wait_for "$2" "$3" "${4:-}" ;;
    *) echo "$USAGE" >&2; exit 2 ;;
esac
