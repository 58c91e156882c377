"""The `hf` extra: transformers alone runs the Hugging Face plug-in (the models extra's other packages absent)."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("peft", "onnx", "onnxruntime", "onnxscript")  # what the models extra adds beyond transformers' own needs

SCRIPT = f"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ImportError(name + " is not installed (the hf extra alone)")
sys.meta_path.insert(0, Absent())
import torch, transformers as tf
import multihead as mh, multihead.hf
config = tf.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
torch.manual_seed(0)
model = tf.LlamaForCausalLM._from_config(config, attn_implementation="multihead").eval()
ids = torch.randint(3, 50, (1, 70))
with mh.trace() as t:
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
model.set_attn_implementation("eager")
assert torch.equal(out, model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0))
assert [m for m in sys.modules if m.split(".")[0] in {ABSENT!r}] == []
print(sorted(t.backends()))
"""


def test_the_hf_extra_is_transformers_alone():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [req.split(">")[0] for req in extras["hf"]] == ["transformers"]
    assert extras["hf"][0] in extras["models"]


def test_the_plugin_runs_a_model_without_the_models_extras_other_packages():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['decode', 'sdpa']"
