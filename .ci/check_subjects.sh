#!/bin/bash
# CI: every commit after the one named in .ci/subjects_base (the commits of `git rev-list
# BASE..HEAD`, merged ones included) has a subject of at most 72 characters. Older history is
# not checked. Exit 1 naming each commit whose subject is longer; exit 0 with a notice when BASE
# is not in this clone (a shallow clone, say), since then nothing can be checked.
#   .ci/check_subjects.sh [BASE_FILE (default .ci/subjects_base)]
set -euo pipefail
cd "$(dirname "$0")/.."
base_file=${1:-.ci/subjects_base}
max=72

base=$(grep -v '^[[:space:]]*#' "$base_file" | tr -d '[:space:]')
if [[ -z $base ]]; then
  echo "commit subjects: $base_file names no commit" >&2
  exit 1
fi
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "commit subjects: not checked: base commit $base is not in this clone (shallow clone?)"
  exit 0
fi

# Characters, not bytes: UTF-8 continuation bytes (0x80-0xBF) are not counted.
chars() { printf '%s' "$1" | LC_ALL=C tr -d '\200-\277' | wc -c; }

commits=$(git rev-list "$base..HEAD")
checked=0
long=0
for commit in $commits; do
  subject=$(git log -1 --format=%s "$commit")
  n=$(chars "$subject")
  checked=$((checked + 1))
  if ((n > max)); then
    long=$((long + 1))
    echo "$(git rev-parse --short "$commit") $subject ($n characters)"
  fi
done

if ((long > 0)); then
  echo "commit subjects: $long of $checked longer than $max characters (since ${base:0:12})" >&2
  exit 1
fi
echo "commit subjects: $checked checked, all <= $max characters"
