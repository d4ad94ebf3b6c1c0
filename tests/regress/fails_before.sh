#!/usr/bin/env bash
# Does a test fail before its fix? Builds the given test files against an older revision and runs them there.
#
#   tests/regress/fails_before.sh [--tests-from REV2] REV TARGET FILTER [TEST_FILE...]
#     e.g. tests/regress/fails_before.sh a9943b6 test_reliability_security 'KeyedChecksums.*' \
#            tests/reliability/security_test.cc
#
# Makes a temporary git worktree of REV under /tmp, copies TEST_FILEs (paths from the repository root; default: the
# TARGET's own tests/<sub>/<name>_test.cc) over it, with tests/support and, where a test file names it,
# tests/data/format-vectors, configures the dev preset (warnings not errors), builds only TARGET, runs each test that
# gtest's --gtest_filter=FILTER selects in a process of its own, prints PASS, FAIL or SKIPPED per test, and removes
# the worktree. The files come from this checkout's working tree, or from commit REV2 with --tests-from (the tests as
# a commit added them, where later commits ported them to an API REV lacks).
#
# Where the TARGET does not build at REV (the test file uses what REV lacks), each TEST block of TARGET's source is
# built alone (every other TEST block blanked) and reported DOES-NOT-BUILD, with the compiler's first errors, where
# it still does not build. A helper function of the file that does not build is blanked too (its callers then do not
# build); where the file's shared code still does not build, its tests are DOES-NOT-BUILD (shared code). Here
# FILTER's patterns are matched, as bash globs, against Suite.Name (and Prefix/Suite.Name/P for TEST_P).
# DOES-NOT-BUILD counts as failing before only where what is missing is the fix itself (an API the fix added): read
# the errors printed and say so where you cite it.
#
# Exit status: 0 when every selected test failed or did not build at REV, 1 when any passed or was skipped there, 2
# on a usage or setup error (REV does not configure, no test selected). Environment: JOBS (build jobs, default 2),
# TEST_TIMEOUT (seconds per test, default 600), KEEP=1 (leave the worktree, and print where). Everything runs
# under nice -n 19.
set -euo pipefail

usage() {
  sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() { echo "fails_before.sh: ERROR: $*" >&2; exit 2; }

tests_from=""
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --tests-from) [[ $# -ge 2 ]] || usage; tests_from=$2; shift 2 ;;
    -h|--help) usage ;;
    *) usage ;;
  esac
done
[[ $# -ge 3 ]] || usage
rev=$1 target=$2 filter=$3
shift 3
repo=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
jobs=${JOBS:-2}
test_timeout=${TEST_TIMEOUT:-600}
rev_hash=$(git -C "$repo" rev-parse --verify --quiet "$rev^{commit}") || die "no commit $rev"
if [[ -n $tests_from ]]; then
  tests_from=$(git -C "$repo" rev-parse --verify --quiet "$tests_from^{commit}") || die "no commit $tests_from"
fi

# tests/<sub>/<name>_test.cc -> test_<sub>_<name> (CMakeLists.txt's rule).
target_of() {
  local n=${1#tests/}
  n=${n%_test.cc}
  echo "test_${n//\//_}"
}
# The file's text in the source of the tests (the working tree, or --tests-from's commit).
source_text() {
  if [[ -n $tests_from ]]; then git -C "$repo" show "$tests_from:$1"; else cat "$repo/$1"; fi
}
source_has() {
  if [[ -n $tests_from ]]; then
    git -C "$repo" cat-file -e "$tests_from:$1" 2>/dev/null
  else
    [[ -e $repo/$1 ]]
  fi
}
copy_in() {  # copy_in PATH: a file or a directory, from the source of the tests into the worktree
  if [[ -n $tests_from ]]; then
    git -C "$repo" archive "$tests_from" -- "$1" | tar -x -C "$wt"
  else
    (cd "$repo" && cp -a --parents "$1" "$wt/")
  fi
}

files=("$@")
if [[ ${#files[@]} -eq 0 ]]; then
  for f in $(if [[ -n $tests_from ]]; then git -C "$repo" ls-tree -r --name-only "$tests_from" tests/;
             else (cd "$repo" && find tests -name '*_test.cc'); fi); do
    [[ $f == *_test.cc && $(target_of "$f") == "$target" ]] && files=("$f")
  done
  [[ ${#files[@]} -gt 0 ]] || die "no tests/**/*_test.cc builds $target"
fi
main_file=""
for f in "${files[@]}"; do
  source_has "$f" || die "$f is not in ${tests_from:-the working tree}"
  [[ $f == *_test.cc && $(target_of "$f") == "$target" ]] && main_file=$f
done

tmp=$(mktemp -d /tmp/fails_before.XXXXXX)
wt=$tmp/src
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if [[ ${KEEP:-0} == 1 ]]; then
    echo "fails_before.sh: kept $wt (git -C $repo worktree remove --force $wt)" >&2
    return
  fi
  git -C "$repo" worktree remove --force "$wt" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  git -C "$repo" worktree prune
}
trap cleanup EXIT

echo "== fails_before: REV $rev ($rev_hash), target $target, filter '$filter'"
echo "== tests from: ${tests_from:-the working tree of $repo ($(git -C "$repo" rev-parse --short HEAD))}"
echo "== files: ${files[*]}"
git -C "$repo" worktree add --detach --quiet "$wt" "$rev_hash"
extra=()
for f in "${files[@]}" tests/support; do copy_in "$f"; done
for f in "${files[@]}"; do
  if source_text "$f" | grep -q 'format-vectors' && source_has tests/data/format-vectors; then
    copy_in tests/data/format-vectors
  fi
  # A test that finds its data through KVTIER_SOURCE_DIR where REV's CMakeLists.txt does not define it.
  if source_text "$f" | grep -q KVTIER_SOURCE_DIR && ! grep -q KVTIER_SOURCE_DIR "$wt/CMakeLists.txt"; then
    extra=(-DCMAKE_CXX_FLAGS="-DKVTIER_SOURCE_DIR='\"$wt\"'")
  fi
done

(cd "$wt" && nice -n 19 cmake --preset dev -DKVTIER_WERROR=OFF "${extra[@]}") >"$tmp/configure.log" 2>&1 || {
  tail -n 30 "$tmp/configure.log"
  die "$rev does not configure with the dev preset"
}

build() {  # build LOG: builds TARGET in the worktree
  (cd "$wt" && nice -n 19 cmake --build --preset dev -j "$jobs" --target "$target") >"$1" 2>&1
}
first_errors() { grep -E 'error:|undefined reference' "$1" | head -n "${2:-5}" | sed 's/^/      /'; }

declare -a names=() results=()
record() { names+=("$1"); results+=("$2"); echo "-- $2 $1"; }

# Runs each test of the built TARGET that FILTER selects, each in a process of its own.
run_selected() {
  local bin line suite="" t rc
  bin=$(find "$wt/build/dev" -name "$target" -type f -perm -u+x | head -n 1)
  [[ -n $bin ]] || die "built, but no $target binary under $wt/build/dev"
  local -a tests=()
  while IFS= read -r line; do
    line=${line%%#*}
    line=${line%"${line##*[![:space:]]}"}
    [[ -z $line ]] && continue
    if [[ $line == " "* ]]; then
      t=$suite${line#"${line%%[![:space:]]*}"}
      [[ $t == *DISABLED_* ]] || tests+=("$t")
    else
      suite=$line
    fi
  done < <("$bin" --gtest_list_tests --gtest_filter="$filter")
  for t in "${tests[@]}"; do
    echo
    echo "==== $t"
    rc=0
    (cd "$tmp" && nice -n 19 timeout "$test_timeout" "$bin" --gtest_filter="$t" --gtest_color=no) \
      >"$tmp/run.log" 2>&1 || rc=$?
    cat "$tmp/run.log"
    if grep -qF "[  SKIPPED ] $t" "$tmp/run.log"; then
      record "$t" SKIPPED
    elif [[ $rc -eq 0 ]] && grep -qF "[       OK ] $t" "$tmp/run.log"; then
      record "$t" PASS
    else
      record "$t" "FAIL"
      [[ $rc -eq 124 ]] && echo "   (timed out after ${test_timeout}s)"
      [[ $rc -gt 128 && $rc -ne 124 ]] && echo "   (killed by signal $((rc - 128)))"
    fi
  done
  return 0
}

# selected NAME [PREFIX...]: matches Suite.Name (and PREFIX/Suite.Name/P for each instantiation PREFIX of a TEST_P)
# against FILTER's patterns, as gtest would.
selected() {
  local name=$1 pos=${filter%%-*} neg="" p
  shift
  [[ $filter == *-* ]] && neg=${filter#*-}
  [[ -z $pos ]] && pos='*'
  local -a cands=("$name")
  for p in "$@"; do cands+=("$p/$name/P"); done
  local hit=0 c
  IFS=: read -ra pats <<<"$pos"
  for p in "${pats[@]}"; do for c in "${cands[@]}"; do
    # shellcheck disable=SC2053
    [[ $c == $p ]] && hit=1
  done; done
  [[ $hit == 1 ]] || return 1
  IFS=: read -ra pats <<<"$neg"
  for p in "${pats[@]}"; do for c in "${cands[@]}"; do
    # shellcheck disable=SC2053
    [[ -n $p && $c == $p ]] && return 1
  done; done
  return 0
}

echo "== building $target at $rev (log: build.log below on failure)"
if build "$tmp/build.log"; then
  run_selected
elif [[ -z $main_file ]]; then
  tail -n 40 "$tmp/build.log"
  die "$target does not build at $rev, and none of the files given is its source"
else
  echo "== $target does not build at $rev with $main_file:"
  first_errors "$tmp/build.log" 10
  echo "== building each TEST of $main_file alone"
  src=$wt/$main_file
  cp "$src" "$tmp/full.cc"
  # TEST blocks: from a line 'TEST(', 'TEST_F(' or 'TEST_P(' to the next '}' in column 0.
  mapfile -t blocks < <(awk '/^TEST(_F|_P)?\(/ { start = NR; head = $0 } start && /^}/ { print start, NR, head; start = 0 }' \
                          "$tmp/full.cc")
  # The file with the lines of the spans in $2 ("from to" pairs) blanked, except the span starting at line $1 (-1:
  # none). Blanked, not deleted, so the compiler's line numbers are the file's.
  without_blocks() {
    awk -v keep="$1" -v spans="$2" 'BEGIN { n = split(spans, s, " ") }
         { drop = 0; for (i = 1; i < n; i += 2) if (s[i] != keep && NR >= s[i] && NR <= s[i + 1]) drop = 1 }
         { print drop ? "" : $0 }' "$tmp/full.cc"
  }
  spans=""
  for b in "${blocks[@]}"; do read -r from to _ <<<"$b"; spans+="$from $to "; done
  # The shared code (everything but the TEST blocks) must build. Where a helper function does not build at REV (it
  # uses what REV lacks), it is blanked too, so the tests that do not call it can still be built; those that do are
  # then DOES-NOT-BUILD ("not declared"). A helper: from a line in column 0 ending in '{' (not a namespace) before
  # the error to the next '}' in column 0.
  helpers=""
  shared_ok=0
  for _ in 1 2 3 4 5 6 7 8; do
    without_blocks -1 "$spans $helpers" >"$src"
    if build "$tmp/build-shared.log"; then shared_ok=1; break; fi
    echo "== the file's shared code (everything but its TEST blocks${helpers:+ and the helpers above}) does not build at $rev:"
    first_errors "$tmp/build-shared.log" 10
    more=$(grep -oE "^$src:[0-9]+:[0-9]+: error:" "$tmp/build-shared.log" | cut -d: -f2 | sort -un |
           while read -r line; do
             awk -v at="$line" '/^[A-Za-z_]/ && /\{[[:space:]]*$/ && !/^(namespace|extern)/ && NR <= at { start = NR }
                                /^}/ && NR < at { start = 0 }
                                /^}/ && NR >= at { if (start) print start, NR; exit }' "$tmp/full.cc"
           done | sort -u | tr '\n' ' ')
    [[ -n ${more// /} ]] || break
    new_helpers=0
    read -ra nums <<<"$more"
    for ((i = 0; i + 1 < ${#nums[@]}; i += 2)); do
      [[ " $helpers " == *" ${nums[i]} ${nums[i + 1]} "* ]] && continue
      new_helpers=1
      helpers+="${nums[i]} ${nums[i + 1]} "
      echo "== blanked helper, lines ${nums[i]}-${nums[i + 1]}: $(sed -n "${nums[i]}p" "$tmp/full.cc")"
    done
    [[ $new_helpers == 1 ]] || break
  done
  [[ $shared_ok == 1 && -n $helpers ]] && echo "== the shared code builds without those helpers"
  for b in "${blocks[@]}"; do
    read -r from to head <<<"$b"
    # TEST(Suite, Name) -> Suite.Name
    sig=${head#*(}
    sig=${sig%%)*}
    suite=${sig%%,*}
    tname=${sig#*,}
    tname=${tname// /}
    prefixes=()
    if [[ $head == TEST_P* ]]; then
      mapfile -t prefixes < <(grep -oE "INSTANTIATE_TEST_SUITE_P\( *[A-Za-z0-9_]+, *$suite\b" "$tmp/full.cc" |
                              sed -E 's/.*\( *([A-Za-z0-9_]+),.*/\1/')
      [[ ${#prefixes[@]} -gt 0 ]] || prefixes=(I)
    fi
    selected "$suite.$tname" "${prefixes[@]}" || continue
    [[ $tname == DISABLED_* ]] && continue
    if [[ $shared_ok == 0 ]]; then
      record "$suite.$tname" "DOES-NOT-BUILD (shared code)"
      continue
    fi
    without_blocks "$from" "$spans $helpers" >"$src"
    echo
    echo "==== $suite.$tname built alone"
    if build "$tmp/build-one.log"; then
      run_selected
    else
      first_errors "$tmp/build-one.log" 5
      record "$suite.$tname" DOES-NOT-BUILD
    fi
  done
fi

echo
echo "== at $rev ($rev_hash), $target, filter '$filter':"
[[ ${#names[@]} -gt 0 ]] || die "no test selected by '$filter'"
status=0
for i in "${!names[@]}"; do
  printf '%-30s %s\n' "${results[$i]}" "${names[$i]}"
  [[ ${results[$i]} == PASS || ${results[$i]} == SKIPPED ]] && status=1
done
if [[ $status == 0 ]]; then
  echo "== every selected test fails (or does not build) at $rev"
else
  echo "== NOT every selected test fails at $rev: see PASS/SKIPPED above"
fi
exit "$status"
