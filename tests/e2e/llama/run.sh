#!/bin/sh
# run.sh LLAMA_LOGITS PYTHON OUT [KEY=VALUE...]: kolos's logits into OUT,
# then llama_reference.py's check of them.
set -e
logits=$1 python=$2 out=$3
shift 3
"$logits" "$out" "$@"
exec "$python" "$(dirname "$0")/llama_reference.py" "$out"
