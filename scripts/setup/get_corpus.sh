#!/bin/sh
# Builds the small corpus of the default runs: the King James Bible (public domain), taken
# from Debian's bible-kjv packages, as byte-level token shards in data/corpus/ (gitignored).
#   scripts/setup/get_corpus.sh [BUILD_DIR]     (default build; needs BUILD_DIR/prepare)
# Skips the work when data/corpus/train_000.bin and val_000.bin exist (delete data/corpus to
# redo).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
corpus=$root/data/corpus

# Both files: prepare writes val last, so a run cut short is redone rather than trusted.
if [ -f "$corpus/train_000.bin" ] && [ -f "$corpus/val_000.bin" ]; then
  echo "get_corpus: $corpus already holds the shards; nothing to do (delete it to rebuild)"
  exit 0
fi
if [ ! -x "$build/prepare" ]; then
  echo "get_corpus: $build/prepare not found; expected the prepare tool: build it first" \
       "(cmake -S . -B build && cmake --build build --target prepare), or pass the build" \
       "directory as the first argument" >&2
  exit 1
fi

# The text ships compressed for the `bible` program (package bible-kjv; the data is in
# bible-kjv-text). The program is the only reader of that format, so install it if missing.
if ! command -v bible > /dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
    echo "get_corpus: installing bible-kjv (the reader of the KJV text) with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv > /dev/null
  else
    echo "get_corpus: the 'bible' program was not found; expected package bible-kjv: install" \
         "it (sudo apt-get install bible-kjv) and run this script again" >&2
    exit 1
  fi
fi

mkdir -p "$corpus"
text=$corpus/kjv.txt
# Pretty-printed (book and chapter headings, one verse a line: -l with a width no verse
# reaches turns the line wrapping off). Gen1:1-Rev22:21 is the whole text; stdin is closed so
# the program never waits for interactive commands.
bible -l 100000 Gen1:1-Rev22:21 < /dev/null > "$text.tmp"
n_bytes=$(wc -c < "$text.tmp" | tr -d ' ')
n_verses=$(grep -c '^  [0-9]' "$text.tmp" || true)
# The full KJV is 31102 verses, about 4.3 MB; anything much smaller is a broken extraction.
if [ "$n_verses" -ne 31102 ] || [ "$n_bytes" -lt 4000000 ]; then
  echo "get_corpus: 'bible' produced $n_bytes bytes and $n_verses verses; expected the whole" \
       "King James text (31102 verses, about 4.3 MB): check the bible-kjv-text package" \
       "(dpkg -L bible-kjv-text)" >&2
  rm -f "$text.tmp"
  exit 1
fi
mv "$text.tmp" "$text"
echo "get_corpus: extracted $n_verses verses ($n_bytes bytes) to $text"

"$build/prepare" --out "$corpus" --val-fraction 0.05 "$text"
