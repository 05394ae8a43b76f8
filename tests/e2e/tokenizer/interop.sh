#!/usr/bin/env bash
# Runs interop.py with the virtual environment's interpreter (never the
# system's Python packages).
#   interop.sh TOKENIZER_LINES KOLOS WORKDIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=${KOLOS_VENV:-$here/../../../.cache/torch-venv}
python=$venv/bin/python
if ! "$python" -c 'import tokenizers, sentencepiece' 2>/dev/null; then
  echo "e2e_tokenizer_interop: $python cannot import tokenizers and sentencepiece;" \
       "run scripts/install-venv.sh (KOLOS_VENV=$venv)" >&2
  exit 1
fi
rm -rf "$3"
exec "$python" "$here/interop.py" "$@"
