"""A Hugging Face model directory (model.safetensors, config.json) changed
in place by a line of Python, for the import tests' refusals:

    edit_hf_model.py DIR CODE

CODE runs with `t` (the tensors, torch), `cfg` (config.json as a dict),
`torch` and `np` at hand; both are written back.
"""
import json
import sys

import numpy as np  # noqa: F401  (for CODE)
import torch  # noqa: F401  (for CODE)
from safetensors.torch import load_file, save_file

d, code = sys.argv[1], sys.argv[2]
t = load_file(d + "/model.safetensors")
with open(d + "/config.json") as f:
    cfg = json.load(f)
exec(code)
save_file(t, d + "/model.safetensors", metadata={"format": "pt"})
with open(d + "/config.json", "w") as f:
    json.dump(cfg, f)
