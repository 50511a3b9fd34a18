#!/usr/bin/env bash
# Mutation testing as evidence that the wiring tests see a setting silently dropped.
#
#   studies/mutation/mutation.sh hand     the seven recorded one-line mutations (studies/mutation/hand_mutations.py);
#                                each must fail at least one test (about 4 minutes on 2 cores)
#   studies/mutation/mutation.sh mutmut [MODULE...]
#                                mutmut over the modules the wiring tests guard (or only the
#                                given ones, e.g. src/ktae/core/methods.py), restricted to their
#                                fast tests; prints the survivors per module (long: run it on a
#                                quiet machine; needs `pip install mutmut`; studies/mutation/report.md)
#
# Run from the repository root with the project's environment active.
set -euo pipefail
cd "$(dirname "$0")/../.."

case "${1:-hand}" in
hand)
    shift || true
    exec python studies/mutation/hand_mutations.py "$@"
    ;;
mutmut)
    shift
    exec python studies/mutation/mutmut_run.py "$@"
    ;;
*)
    echo "usage: studies/mutation/mutation.sh [hand [N...] | mutmut [MODULE...]]" >&2
    exit 2
    ;;
esac
