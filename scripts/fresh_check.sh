#!/usr/bin/env bash
# Cold check of the README's two commands: clone this repository's HEAD into a temporary folder and run
#   (a) bash scripts/install.sh && .venv/bin/agentenv train
#   (b) bash scripts/test.sh
# there with empty caches (a fresh .venv in the clone, PIP_CACHE_DIR, AGENTENV_CACHE and XDG_CACHE_HOME
# in new temporary folders), timing each phase and printing a table of phase, seconds and exit status.
#
#   bash scripts/fresh_check.sh                          # all four phases (hours on 2 cores)
#   nice -n 19 bash scripts/fresh_check.sh --only install
#   bash scripts/fresh_check.sh --only train --train-args "--updates 1 eval.problems=8"
#   bash scripts/fresh_check.sh --only test --test-args "-x tests/test_pool.py"
#
# Phases, in this order (--only takes a comma-separated list of phases or groups):
#   install-core  bash scripts/install.sh                  (group `install` = install-core,install-all)
#   train         .venv/bin/agentenv train TRAIN_ARGS     (group `train` = install-core,train: command a)
#   install-all   bash scripts/install.sh --all
#   test          bash scripts/test.sh TEST_ARGS          (group `test` = test: command b, which installs
#                                                          everything itself)
# A phase whose prerequisite failed (train or install-all after install-core) is reported as skipped.
#
# Options:
#   --only LIST           phases to run (default: all)
#   --train-args "..."    arguments for `agentenv train` (word-split), e.g. "--updates 1 eval.problems=8"
#   --test-args "..."     arguments for scripts/test.sh, i.e. pytest (word-split)
#   --timeout PHASE=S     per-phase limit in seconds (repeatable; defaults below); a phase that runs
#                         past it is killed with its whole process group and reported as exit 124
#   --rev REV             what to clone (default HEAD of this checkout: commit first what you want checked)
#   --dir DIR             work in DIR instead of a new temporary folder; DIR is kept (a second run with the
#                         same --dir reuses its clone, venv and caches, e.g. --only install, then --only test)
#   --keep                keep the temporary folder (clone, venv, caches) at the end
#   --results FILE        where the table goes (default: the log folder's results.tsv)
#
# Logs (one per phase) and the table go to a log folder that is always kept:
# ${TMPDIR:-/tmp}/agentenv-fresh-check-YYYYmmdd-HHMMSS/. The clone is placed at WORK/main with WORK/shared
# a link to the shared/ folder beside this checkout, the same layout as here (data in ../shared/data).
#
# The Docker daemon that install_docker.sh starts is shared machine-wide (exec root /run/agentenv-docker,
# one socket): a clone finds it answering and reuses it (and the image already imported into it), so a
# cold check starts no second daemon and never stops the one running. Exit status: 0 when every phase
# that ran passed.
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALL_PHASES=(install-core train install-all test)
declare -A LIMIT=([install-core]=1800 [train]=5400 [install-all]=5400 [test]=7200)
only="" train_args="" test_args="" rev=HEAD dir="" keep=0 results=""

usage() { sed -n '2,39p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="${2:?--only needs a value}"; shift 2 ;;
    --only=*) only="${1#*=}"; shift ;;
    --train-args) train_args="${2?--train-args needs a value}"; shift 2 ;;
    --train-args=*) train_args="${1#*=}"; shift ;;
    --test-args) test_args="${2?--test-args needs a value}"; shift 2 ;;
    --test-args=*) test_args="${1#*=}"; shift ;;
    --timeout) t="${2:?--timeout needs PHASE=SECONDS}"; shift 2
      p="${t%%=*}"; s="${t#*=}"
      [ -n "${LIMIT[$p]+x}" ] && [[ "$s" =~ ^[0-9]+$ ]] \
        || { echo "fresh_check: bad --timeout $t (phases: ${ALL_PHASES[*]})" >&2; exit 2; }
      LIMIT[$p]="$s" ;;
    --rev) rev="${2:?--rev needs a value}"; shift 2 ;;
    --dir) dir="${2:?--dir needs a value}"; shift 2 ;;
    --keep) keep=1; shift ;;
    --results) results="${2:?--results needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fresh_check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

# Which phases: expand groups, keep the fixed order.
declare -A WANT=()
if [ -z "$only" ]; then
  for p in "${ALL_PHASES[@]}"; do WANT[$p]=1; done
else
  IFS=',' read -ra items <<<"$only"
  for it in "${items[@]}"; do
    case "$it" in
      install) WANT[install-core]=1; WANT[install-all]=1 ;;
      train) WANT[install-core]=1; WANT[train]=1 ;;
      install-core|install-all|test) WANT[$it]=1 ;;
      *) echo "fresh_check: unknown phase $it (install, train, test, install-core, install-all)" >&2; exit 2 ;;
    esac
  done
fi

stamp="$(date +%Y%m%d-%H%M%S)"
logdir="${TMPDIR:-/tmp}/agentenv-fresh-check-$stamp"
mkdir -p "$logdir"
results="${results:-$logdir/results.tsv}"

if [ -n "$dir" ]; then
  mkdir -p "$dir"; work="$(cd "$dir" && pwd)"; keep=1
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/agentenv-fresh.XXXXXX")"
fi
clone="$work/main"
mkdir -p "$work/pip-cache" "$work/agentenv-cache" "$work/xdg-cache"

running_pid=""
cleanup() {
  local rc=$?
  if [ -n "$running_pid" ] && kill -0 "$running_pid" 2>/dev/null; then
    kill -TERM "$running_pid" 2>/dev/null  # the phase's `timeout`, which passes it to the phase's group
    sleep 5
    kill -KILL "$running_pid" 2>/dev/null
  fi
  if [ "$keep" = 1 ]; then
    echo "fresh_check: kept $work"
  else
    rm -rf "$work"
  fi
  echo "fresh_check: logs in $logdir"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "fresh_check: interrupted" >&2; exit 130' INT TERM

if [ ! -d "$clone/.git" ]; then
  commit="$(git -C "$src" rev-parse --verify "$rev^{commit}")" || { echo "fresh_check: no commit $rev" >&2; exit 2; }
  git clone -q --no-hardlinks "$src" "$clone" && git -C "$clone" checkout -q --detach "$commit" \
    || { echo "fresh_check: git clone failed" >&2; exit 1; }
  if [ -n "$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    echo "fresh_check: note: $src has uncommitted changes; the clone checks commit ${commit:0:12} only" >&2
  fi
fi
commit="$(git -C "$clone" rev-parse HEAD)"
# The same layout as the source checkout: ../shared beside it (read-only data, test fixtures).
if [ -e "$src/../shared" ] && [ ! -e "$work/shared" ]; then ln -s "$(cd "$src/../shared" && pwd)" "$work/shared"; fi

# Empty caches for everything the phases run; PATH as the caller has it (whatever `python` is there).
export PIP_CACHE_DIR="$work/pip-cache" AGENTENV_CACHE="$work/agentenv-cache" XDG_CACHE_HOME="$work/xdg-cache"
unset PY PIP PYTHON VIRTUAL_ENV PIP_CONSTRAINT AGENTENV_CONSTRAINTS AGENTENV_DATA

{
  echo "fresh_check: $(date -Is) commit ${commit:0:12} in $clone"
  echo "fresh_check: python on PATH: $(command -v python 2>/dev/null || echo none) / python3: $(command -v python3 2>/dev/null || echo none)"
  echo "fresh_check: $(nproc) cores, nice $(nice), caches under $work, logs in $logdir"
} | tee "$logdir/header.txt"

declare -A SECS=() STATUS=()
run_phase() {  # run_phase NAME CMD...: bounded by LIMIT[NAME], in the clone, log to $logdir/NAME.log
  local name="$1"; shift
  local limit="${LIMIT[$name]}" t0 t1 rc
  echo "fresh_check: [$name] $* (limit ${limit}s, log $logdir/$name.log)"
  t0=$(date +%s.%N)
  # timeout puts the phase in its own process group and kills the whole group on expiry
  (cd "$clone" && exec timeout --kill-after=60 "$limit" "$@") >"$logdir/$name.log" 2>&1 </dev/null &
  running_pid=$!
  wait "$running_pid"; rc=$?
  running_pid=""
  t1=$(date +%s.%N)
  SECS[$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
  STATUS[$name]=$rc
  if [ "$rc" = 0 ]; then
    echo "fresh_check: [$name] passed in ${SECS[$name]}s"
  else
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "fresh_check: [$name] ran past ${limit}s and was killed" >&2
    echo "fresh_check: [$name] FAILED (exit $rc) after ${SECS[$name]}s; last lines of its log:" >&2
    grep -v "^WARNING: Location" "$logdir/$name.log" | tail -n 25 >&2
  fi
  return "$rc"
}

read -ra TRAIN_ARGS <<<"$train_args"
read -ra TEST_ARGS <<<"$test_args"
core_ok=1
for p in "${ALL_PHASES[@]}"; do
  [ -n "${WANT[$p]:-}" ] || continue
  case "$p" in
    install-core) run_phase install-core bash scripts/install.sh || core_ok=0 ;;
    train)
      if [ "$core_ok" = 1 ]; then run_phase train .venv/bin/agentenv train "${TRAIN_ARGS[@]}"
      else STATUS[train]="skipped"; fi ;;
    install-all)
      if [ "$core_ok" = 1 ]; then run_phase install-all bash scripts/install.sh --all
      else STATUS[install-all]="skipped"; fi ;;
    test) run_phase test bash scripts/test.sh "${TEST_ARGS[@]}" ;;
  esac
done

# The table: phase, seconds, exit status (also written to $results).
fail=0
{
  printf '%-13s %8s  %s\n' phase seconds status
  for p in "${ALL_PHASES[@]}"; do
    [ -n "${WANT[$p]:-}" ] || continue
    st="${STATUS[$p]:-skipped}"
    [ "$st" = 0 ] || fail=1
    printf '%-13s %8s  %s\n' "$p" "${SECS[$p]:--}" "$([ "$st" = 0 ] && echo "0 (passed)" || echo "$st")"
  done
} >"$logdir/table.txt"
{
  printf 'phase\tseconds\tstatus\tcommit\tdate\n'
  for p in "${ALL_PHASES[@]}"; do
    [ -n "${WANT[$p]:-}" ] || continue
    printf '%s\t%s\t%s\t%s\t%s\n' "$p" "${SECS[$p]:--}" "${STATUS[$p]:-skipped}" "${commit:0:12}" "$stamp"
  done
} >"$results"
echo
cat "$logdir/table.txt"
echo "fresh_check: table written to $results"
exit "$fail"
