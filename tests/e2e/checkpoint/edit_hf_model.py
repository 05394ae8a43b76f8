"""A copy of a Hugging Face model directory (model.safetensors, config.json)
changed by a line of Python, for the import tests' refusals:

    edit_hf_model.py SOURCE DIR CODE

DIR is made afresh as a copy of SOURCE (an existing DIR is replaced), then
CODE runs with `t` (the tensors, torch), `cfg` (config.json as a dict),
`torch` and `np` at hand; both are written back to DIR.
"""
import json
import shutil
import sys

import numpy as np  # noqa: F401  (for CODE)
import torch  # noqa: F401  (for CODE)
from safetensors.torch import load_file, save_file

source, d, code = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(d, ignore_errors=True)
shutil.copytree(source, d)
t = load_file(d + "/model.safetensors")
with open(d + "/config.json") as f:
    cfg = json.load(f)
exec(code)
save_file(t, d + "/model.safetensors", metadata={"format": "pt"})
with open(d + "/config.json", "w") as f:
    json.dump(cfg, f)
