"""The checkpoint contract every backend must meet, checked the way a user would: files on disk, then a fresh
interpreter that loads the checkpoint with plain transformers + peft (no xtrain import) and generates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import HANG_SECONDS

from xtrain.train.checkpoint import check_checkpoint

LOAD_AND_GENERATE = """
import json, sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
checkpoint, base = Path(sys.argv[1]), sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(checkpoint)
if (checkpoint / "adapter_config.json").is_file():
    from peft import PeftModel
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), checkpoint)
else:
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
prompt = tokenizer.apply_chat_template(
    [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)
out = model.generate(**prompt, max_new_tokens=6, do_sample=False)
print(json.dumps({"new_tokens": int(out.shape[1] - prompt["input_ids"].shape[1])}))
"""


def assert_checkpoint_contract(checkpoint: Path, base_model: Path, backend: str) -> dict:
    """Check `checkpoint` against the contract (xtrain.train.checkpoint), then load it as a user would; returns its
    train_metrics.json."""
    metrics = check_checkpoint(checkpoint, backend)
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_AND_GENERATE, str(checkpoint), str(base_model)],
        capture_output=True, text=True, timeout=HANG_SECONDS,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout.strip().splitlines()[-1])["new_tokens"] > 0
    return metrics
