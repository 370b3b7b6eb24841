"""Tokenizer parity with transformers on the same directory: encode, decode, chat templates.

Each case loads one directory twice, with our `Tokenizer` and with
transformers' `AutoTokenizer`, and requires identical output: the engine has
to feed the model exactly what it was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

from hydrant.engine.demo_model import LLAMA3_CHAT_TEMPLATE, demo_corpus, write_demo_tokenizer
from hydrant.engine.errors import ChatTemplateError, InvalidRequestError, ModelLoadError
from hydrant.engine.tokenizer import Tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Multi-line, with trim/lstrip-sensitive blocks and every helper transformers provides.
FEATURE_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(count=0) %}
{% for message in messages %}
    {% if message['role'] == 'tool' %}{% continue %}{% endif %}
    {% if (message['role'] == 'user') != (ns.count % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
    [{{ message['role'] | upper }}] {{ message['content'] | trim }}
    {% if message['role'] == 'assistant' %}
{% generation %}{{ eos_token }}{% endgeneration %}
    {% endif %}
    {{ message | tojson }}
{% endfor %}
{% if tools %}TOOLS {{ tools | tojson(indent=2) }}{% endif %}
{% if add_generation_prompt %}[ASSISTANT] {{ strftime_now('%Y') }}{% endif %}
"""

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hello there!"}],
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    [
        {"role": "system", "content": "Be kind. 请用中文回答。"},
        {"role": "user", "content": "  Tell me about the sea 🌊  "},
        {"role": "assistant", "content": "The sea is large & <deep>."},
        {"role": "user", "content": 'And the "sky"?\nTwo lines.'},
    ],
    [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
    ],
]

TEXTS = [
    "",
    "Hello world",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n\nend",
    "你好，世界！今天的天气很好。",
    "emoji 🎉🚀 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "special <|eot_id|> inside <|im_end|> text",
    "numbers 12345678 and code: def f(x): return x * 2",
]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False), "utf-8")


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("llama3_tok")
    tok = write_demo_tokenizer(directory)
    eos = [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]
    _write_json(directory / "generation_config.json", {"bos_token_id": 0, "eos_token_id": eos})
    return directory


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2-shaped tokenizer: byte-level BPE, ChatML specials, no BOS at all."""
    directory = tmp_path_factory.mktemp("chatml_tok")
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(demo_corpus().splitlines(), trainer)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.add_special_tokens(specials)
    backend.save(str(directory / "tokenizer.json"))
    decoder = {
        str(backend.token_to_id(t)): {"content": t, "special": True, "normalized": False}
        for t in specials
    }
    # Declared only in the config, as some checkpoints do: both loaders must add it.
    decoder[str(backend.get_vocab_size())] = {
        "content": "<|extra_0|>",
        "special": True,
        "normalized": False,
    }
    _write_json(
        directory / "tokenizer_config.json",
        {
            "added_tokens_decoder": decoder,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": CHATML_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 32768,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    eos = [backend.token_to_id("<|im_end|>"), backend.token_to_id("<|endoftext|>")]
    _write_json(directory / "generation_config.json", {"eos_token_id": eos})
    return directory


@pytest.fixture(params=["llama3", "chatml"])
def tokenizer_dir(request: pytest.FixtureRequest, llama3_dir: Path, chatml_dir: Path) -> Path:
    return llama3_dir if request.param == "llama3" else chatml_dir


def test_encode_matches_transformers(tokenizer_dir: Path) -> None:
    ours = Tokenizer.from_pretrained(tokenizer_dir)
    theirs = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in [*TEXTS, "an <|extra_0|> token"]:
        for add_special in (True, False):
            expected = theirs.encode(text, add_special_tokens=add_special)
            assert ours.encode(text, add_special_tokens=add_special) == expected, text
    assert ours.vocab_size == len(theirs)


def test_decode_matches_transformers(tokenizer_dir: Path) -> None:
    ours = Tokenizer.from_pretrained(tokenizer_dir)
    theirs = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in TEXTS:
        ids = theirs.encode(text, add_special_tokens=True)
        for skip in (True, False):
            expected = theirs.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == expected, text


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tokenizer_dir: Path, conversation: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    ours = Tokenizer.from_pretrained(tokenizer_dir)
    theirs = AutoTokenizer.from_pretrained(tokenizer_dir)
    expected = theirs.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(conversation, add_generation_prompt) == expected
    expected_ids = theirs.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert ours.encode_chat(conversation, add_generation_prompt) == expected_ids


def test_demo_tool_template_matches_transformers(llama3_dir: Path) -> None:
    """The demo's Llama 3.1-style tool turns: the tools listed in the first user turn, a
    call written as JSON, its answer an ipython turn; without tools, Llama 3's prompt."""
    ours = Tokenizer.from_pretrained(llama3_dir)
    theirs = AutoTokenizer.from_pretrained(llama3_dir)
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather <now> & later",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = {"name": "get_weather", "arguments": {"city": "Zürich"}}
    conversation: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4 degrees"},
        {"role": "tool", "tool_call_id": "c2", "content": {"rain": True}},
        {"role": "user", "content": "And tomorrow?"},
    ]
    for given in (tools, None):
        expected = theirs.apply_chat_template(
            conversation, tools=given, tokenize=False, add_generation_prompt=True
        )
        assert ours.apply_chat_template(conversation, tools=given) == expected
        assert ("Given the following functions" in expected) is (given is not None)
        ids = theirs.apply_chat_template(
            conversation, tools=given, add_generation_prompt=True, return_dict=False
        )
        assert ours.encode_chat(conversation, tools=given) == ids
    assert '{"name": "get_weather", "parameters": {"city": "Zürich"}}' in expected


def test_feature_template_matches_transformers(llama3_dir: Path, tmp_path: Path) -> None:
    """namespace, loop controls, tojson, raise_exception, strftime_now, generation tag."""
    (tmp_path / "tokenizer.json").write_bytes((llama3_dir / "tokenizer.json").read_bytes())
    config = json.loads((llama3_dir / "tokenizer_config.json").read_text("utf-8"))
    config.pop("chat_template")
    _write_json(tmp_path / "tokenizer_config.json", config)
    (tmp_path / "chat_template.jinja").write_text(FEATURE_TEMPLATE, "utf-8")
    ours = Tokenizer.from_pretrained(tmp_path)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    tools: list[Any] = [
        {"type": "function", "function": {"name": "lookup", "parameters": {"q": "<&>"}}}
    ]
    for conversation in CONVERSATIONS[2:]:
        convo = [m for m in conversation if m["role"] != "system"]
        convo.insert(1, {"role": "tool", "content": "ignored"})
        expected = theirs.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(convo) == expected
        expected = theirs.apply_chat_template(convo, tools=tools, tokenize=False)
        assert ours.apply_chat_template(convo, False, tools=tools) == expected
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="must alternate") as info:
        ours.apply_chat_template(bad)
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.param == "messages"


def test_special_ids_from_config_files(llama3_dir: Path, chatml_dir: Path) -> None:
    llama = Tokenizer.from_pretrained(llama3_dir)
    ids = {t: llama.token_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")}
    assert llama.bos_token_id == ids["<|begin_of_text|>"]
    assert llama.eos_token_ids == frozenset({ids["<|end_of_text|>"], ids["<|eot_id|>"]})
    assert set(ids.values()) <= llama.special_token_ids
    assert llama.encode("hi")[0] == llama.bos_token_id
    chatml = Tokenizer.from_pretrained(chatml_dir)
    assert chatml.bos_token_id is None
    im_end, eot = chatml.token_to_id("<|im_end|>"), chatml.token_to_id("<|endoftext|>")
    assert chatml.eos_token_ids == frozenset({im_end, eot})
    assert chatml.token_to_id("<|extra_0|>") in chatml.special_token_ids
    assert chatml.encode("hi") == chatml.encode("hi", add_special_tokens=False)


def test_missing_template_and_files_raise_clear_errors(llama3_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((llama3_dir / "tokenizer.json").read_bytes())
    bare = Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "tokenizer_config.json").write_text("{not json", "utf-8")
    with pytest.raises(ModelLoadError, match="tokenizer_config"):
        Tokenizer.from_pretrained(tmp_path)


def test_post_processor_from_flags_when_file_has_none(llama3_dir: Path, tmp_path: Path) -> None:
    """A tokenizer.json without post-processor: add_bos_token/add_eos_token decide (Llama)."""
    data = json.loads((llama3_dir / "tokenizer.json").read_text("utf-8"))
    data["post_processor"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), "utf-8")
    config = json.loads((llama3_dir / "tokenizer_config.json").read_text("utf-8"))
    _write_json(tmp_path / "tokenizer_config.json", {**config, "add_bos_token": False})
    tok = Tokenizer.from_pretrained(tmp_path)
    plain = tok.encode("hello", add_special_tokens=False)
    assert tok.encode("hello") == plain
    _write_json(
        tmp_path / "tokenizer_config.json",
        {**config, "add_bos_token": True, "add_eos_token": True, "eos_token": "<|end_of_text|>"},
    )
    tok = Tokenizer.from_pretrained(tmp_path)
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    assert tok.encode("hello") == [bos, *plain, eos]


def test_template_sandbox_blocks_attribute_escape(llama3_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((llama3_dir / "tokenizer.json").read_bytes())
    (tmp_path / "chat_template.jinja").write_text(
        "{{ messages.__class__.__mro__[1].__subclasses__() }}", "utf-8"
    )
    tok = Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert LLAMA3_CHAT_TEMPLATE.startswith("{% set loop_messages")
