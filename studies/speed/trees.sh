#!/bin/bash
# The speed table's command (1 thread, 3 rounds) in two source trees, alternating, one
# process each, so that both see the same machine: OLD_SRC and NEW_SRC are the trees'
# src/ folders (e.g. a `git worktree` of the older commit); one JSON per run in OUT.
#   OLD_SRC=/tmp/old/src NEW_SRC=$PWD/src OUT=/tmp/trees studies/speed/trees.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT: a folder for the JSON files}; mkdir -p "$out"
i=0
for B in "" "--zipf"; do for K in avx2 default; do
  reps="old new old new"; [ $K = default ] && reps="old new"
  for v in $reps; do
    i=$((i+1))
    if [ $v = old ]; then P=${OLD_SRC:?}; else P=${NEW_SRC:?}; fi
    PYTHONPATH=$P python benchmarks/bench_advantages.py --preset paper $B \
      --ngram 1,3 --prefix-value --no-reference --repeats 3 --no-memory --threads 1 \
      --kernel $K --json $out/$i-$v-$K${B:+-zipf}.json > $out/$i-$v-$K${B:+-zipf}.txt 2>&1
  done
done; done
