"""The small model Hydrant generates for itself, so the embedded mode needs no download.

It is a real Llama-architecture checkpoint in the Hugging Face layout
(config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) that transformers loads as is, so every engine code
path (loader, paged attention, sampler, chat template, detokenizer) runs on it
exactly as on a downloaded model. The weights are random (HF's init, std
0.02): the text it writes is nonsense, but it is deterministic nonsense, and
two runs with the same seed write byte-identical files.

The tokenizer is a byte-level BPE shaped like Llama 3's (same split regex,
same special-token names, BOS added by a TemplateProcessing post-processor),
trained on `data/demo_corpus.txt`, which mixes English prose with Chinese and
emoji lines so that multi-byte characters get merges and split-character
streaming gets exercised.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS_TOKEN = "<|begin_of_text|>"  # noqa: S105 - a vocabulary token, not a secret
EOS_TOKEN = "<|end_of_text|>"  # noqa: S105
EOT_TOKEN = "<|eot_id|>"  # noqa: S105
SPECIAL_TOKENS = (
    BOS_TOKEN,
    EOS_TOKEN,
    "<|start_header_id|>",
    "<|end_header_id|>",
    EOT_TOKEN,
)
DEMO_VOCAB_SIZE = 2048
MODEL_MAX_LENGTH = 2048

# Llama 3's pre-tokenizer split pattern (tiktoken cl100k style).
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Llama 3 instruct chat template, extended with Llama 3.1's JSON tool calling: with
# `tools`, the first user turn lists them and asks for `{"name": ..., "parameters": ...}`;
# an assistant turn of tool calls is written that way, a tool's answer is an `ipython`
# turn. Without tools it renders exactly as the original single-line Llama 3 template.
LLAMA3_TOOL_PROMPT = (
    "Given the following functions, please respond with a JSON for a function call with its"
    " proper arguments that best answers the given prompt.\\n\\nRespond in the format"
    ' {\\"name\\": function name, \\"parameters\\": dictionary of argument name and its'
    " value}. Do not use variables.\\n\\n"
)
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% set ns = namespace(tools_shown=false) %}"
    "{% for message in loop_messages %}"
    "{% if message['tool_calls'] is defined %}"
    "{% set body = namespace(text='') %}"
    "{% for call in message['tool_calls'] %}"
    "{% set fn = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first %}{% set body.text = body.text + '; ' %}{% endif %}"
    "{% set body.text = body.text + '{\"name\": \"' + fn['name'] + '\", \"parameters\": '"
    " + fn['arguments'] | tojson + '}' %}"
    "{% endfor %}"
    "{% set content = '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + body.text"
    " + '<|eot_id|>' %}"
    "{% elif message['role'] == 'tool' or message['role'] == 'ipython' %}"
    "{% set result = message['content'] if message['content'] is string"
    " else message['content'] | tojson %}"
    "{% set content = '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + result"
    " + '<|eot_id|>' %}"
    "{% else %}"
    "{% set text = message['content'] | trim %}"
    "{% if tools and message['role'] == 'user' and not ns.tools_shown %}"
    "{% set ns.tools_shown = true %}"
    "{% set listing = namespace(text='') %}"
    "{% for tool in tools %}"
    "{% set listing.text = listing.text + tool | tojson(indent=4) + '\\n\\n' %}"
    "{% endfor %}"
    "{% set text = '" + LLAMA3_TOOL_PROMPT + "' + listing.text + text %}"
    "{% endif %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + text + '<|eot_id|>' %}"
    "{% endif %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

DEMO_SHAPE: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}
INIT_STD = 0.02


def demo_corpus() -> str:
    """The training text of the demo tokenizer, read from the package data."""
    return resources.files("hydrant.engine").joinpath("data/demo_corpus.txt").read_text("utf-8")


def build_demo_tokenizer(vocab_size: int = DEMO_VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE; the special tokens come last, as in Llama 3."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(demo_corpus().splitlines(keepends=True), trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise RuntimeError(f"demo tokenizer lost its special token {token!r}")
    return int(token_id)


def _tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    decoder = {
        str(_token_id(tokenizer, token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": decoder,
        "bos_token": BOS_TOKEN,
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOT_TOKEN,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": MODEL_MAX_LENGTH,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def _model_config(vocab_size: int, bos_id: int, eos_ids: list[int]) -> dict[str, Any]:
    heads = DEMO_SHAPE["num_attention_heads"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "head_dim": DEMO_SHAPE["hidden_size"] // heads,
        "hidden_act": "silu",
        "initializer_range": INIT_STD,
        "mlp_bias": False,
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
        **DEMO_SHAPE,
    }


def _weight_shapes(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes exactly as HF's LlamaForCausalLM names them, in a fixed order."""
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    head_dim = config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", (config["vocab_size"], hidden))
    ]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes += [
            (f"{p}.input_layernorm.weight", (hidden,)),
            (f"{p}.self_attn.q_proj.weight", (q_out, hidden)),
            (f"{p}.self_attn.k_proj.weight", (kv_out, hidden)),
            (f"{p}.self_attn.v_proj.weight", (kv_out, hidden)),
            (f"{p}.self_attn.o_proj.weight", (hidden, q_out)),
            (f"{p}.post_attention_layernorm.weight", (hidden,)),
            (f"{p}.mlp.gate_proj.weight", (inter, hidden)),
            (f"{p}.mlp.up_proj.weight", (inter, hidden)),
            (f"{p}.mlp.down_proj.weight", (hidden, inter)),
        ]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (config["vocab_size"], hidden))]
    return shapes


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """HF's Llama init: normal(0, 0.02) for matrices, ones for RMSNorm weights."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in _weight_shapes(config):
        if len(shape) == 1:
            weights[name] = torch.ones(shape, dtype=torch.float32)
        else:
            weights[name] = torch.empty(shape, dtype=torch.float32).normal_(
                0.0, INIT_STD, generator=generator
            )
    return weights


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", "utf-8")


def write_demo_tokenizer(out_dir: Path) -> Tokenizer:
    """Write tokenizer.json and tokenizer_config.json; enough for `Tokenizer.from_pretrained`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_demo_tokenizer()
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", "utf-8")
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(tokenizer))
    return tokenizer


def write_demo_model(
    out_dir: Path, *, seed: int = 0, progress: Callable[[str], None] | None = None
) -> Path:
    """Write the demo checkpoint into `out_dir` (created if missing) and return it.

    Existing files of the same names are overwritten, so a half-written
    directory from an interrupted run is repaired by running again.
    """
    report = progress or (lambda _message: None)
    out_dir = Path(out_dir)
    report("training the demo tokenizer")
    tokenizer = write_demo_tokenizer(out_dir)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    bos_id = _token_id(tokenizer, BOS_TOKEN)
    eos_ids = [_token_id(tokenizer, EOS_TOKEN), _token_id(tokenizer, EOT_TOKEN)]
    config = _model_config(vocab_size, bos_id, eos_ids)
    _write_json(out_dir / "config.json", config)
    _write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_ids},
    )
    report(f"writing random weights (seed {seed})")
    save_file(_random_weights(config, seed), str(out_dir / "model.safetensors"), {"format": "pt"})
    report(f"demo model written to {out_dir}")
    return out_dir
