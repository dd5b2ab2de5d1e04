"""A tiny real model for tests: a few `qwen2` layers with seeded random weights and a BPE tokenizer.

`mlx_lm.server --model <dir>` serves it, alone, tensor-parallel or with `--pipeline` over
ring (qwen2 supports pipelining; `model.safetensors.index.json` is what distributed
loading reads to pick each rank's files). Nothing is downloaded; the same seed gives the
same files. The answers are gibberish: tests check the serving path, not the words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Divisible by 1, 2, 3 and 6: heads, kv heads, MLP width and layers split over 1-3 ranks
# tensor-parallel and 1-3 (or 6) pipeline stages.
CONFIG: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 96,
    "num_hidden_layers": 6,
    "intermediate_size": 192,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "rms_norm_eps": 1e-6,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Orphaned ranks keep a stuck sshd as their parent, so ppid is not 1.",
    "mlx.launch starts one rank per node over ssh with the ring backend.",
    "Hello! How are you today? I am a tiny model that answers in gibberish.",
    "Protection domains leak when a JACCL rank never exits.",
    "Prometheus scrapes the exporter; Alertmanager calls the remediator.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]
WEIGHTS_FILE = "model.safetensors"


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tokenizer


def make_tiny_model(path: Path, seed: int = 0) -> Path:
    """Write the model into `path` (created; existing files are overwritten) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(CONFIG["vocab_size"])
    if tokenizer.get_vocab_size() > CONFIG["vocab_size"]:
        raise ValueError("the trained tokenizer outgrew the model's vocabulary")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=CONFIG["max_position_embeddings"],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(str(path))

    config = dict(CONFIG)
    config["eos_token_id"] = tokenizer.token_to_id("<|im_end|>")
    config["bos_token_id"] = None
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(path / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    index = {
        "metadata": {"total_size": sum(w.nbytes for w in weights.values())},
        "weight_map": {name: WEIGHTS_FILE for name in sorted(weights)},
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config["eos_token_id"], "do_sample": False}) + "\n"
    )
    return path
