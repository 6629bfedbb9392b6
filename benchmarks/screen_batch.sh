#!/usr/bin/env bash
# Screen several tuning candidates side by side on a many-core machine: one `benchmarks.compare` matrix per line of a
# batch file, all started at once with one worker per seed, detached from this shell so that they outlive it.
#
#   benchmarks/screen_batch.sh start BATCH SEEDS TIMESTEPS     # BATCH: lines "ALGO ENV CANDIDATE_FILE OUT_FOLDER"
#   benchmarks/screen_batch.sh wait BATCH SECONDS [COPY_TO]    # until every matrix ends or SECONDS pass, then copy
#                                                              # each OUT_FOLDER/runs.jsonl to COPY_TO/FOLDER.jsonl
#
# PYTHON (default .venv/bin/python) runs the matrices; each worker trains with one thread. The runs land in each
# OUT_FOLDER/runs.jsonl as they finish; `python -m benchmarks.screen FOLDER...` compares them.
set -euo pipefail

PYTHON=${PYTHON:-.venv/bin/python}
EVAL_FREQ=${EVAL_FREQ:-50000}
POLL_SECONDS=10

candidates() { grep -v -e '^#' -e '^[[:space:]]*$' "$1"; }

start() {
    local batch=$1 seeds=$2 timesteps=$3 workers
    workers=$(tr ',' '\n' <<<"$seeds" | wc -l)
    while read -r algo env file out; do
        mkdir -p "$out"
        OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 setsid nohup "$PYTHON" -m benchmarks.compare --algos "$algo" \
            --conf "$algo=$file" --envs "$env" --seeds "$seeds" --timesteps "$timesteps" --eval-freq "$EVAL_FREQ" \
            --workers "$workers" --out "$out" >"$out/screen_batch.log" 2>&1 </dev/null &
        echo "$!" >"$out/screen_batch.pid"
        echo "started $algo $env $file -> $out (pid $!)"
    done < <(candidates "$batch")
}

running() {
    local out
    while read -r _ _ _ out; do
        if kill -0 "$(cat "$out/screen_batch.pid")" 2>/dev/null; then echo "$out"; fi
    done < <(candidates "$1")
}

wait_for() {
    local batch=$1 seconds=$2 copy_to=${3:-} deadline out
    deadline=$((SECONDS + seconds))
    while [[ -n $(running "$batch") && $SECONDS -lt $deadline ]]; do sleep "$POLL_SECONDS"; done
    echo "still running: $(running "$batch" | tr '\n' ' ')"
    while read -r _ _ _ out; do
        echo "$out: $(cat "$out/runs.jsonl" 2>/dev/null | wc -l) runs finished"
        if [[ -n $copy_to && -f $out/runs.jsonl ]]; then cp "$out/runs.jsonl" "$copy_to/$(basename "$out").jsonl"; fi
    done < <(candidates "$batch")
}

case ${1:-} in
    start) start "$2" "$3" "$4" ;;
    wait) wait_for "$2" "$3" "${4:-}" ;;
    *) echo "usage: $0 start BATCH SEEDS TIMESTEPS | wait BATCH SECONDS [COPY_TO]" >&2; exit 2 ;;
esac
