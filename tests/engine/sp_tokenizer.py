"""A SentencePiece-style tokenizer for tests (Llama 2 / Mistral shape), built offline.

Real Llama 2 tokenizers cannot be downloaded here, and `tokenizers` cannot train one
with byte fallback directly, so a BPE is trained on the demo corpus with the `▁`
normalizer and then given the layout Llama 2's tokenizer.json has: `<unk>`, `<s>`,
`</s>`, then the 256 `<0xNN>` byte tokens in the model's vocabulary, `byte_fallback`,
and the decoder Replace(▁→space), ByteFallback, Fuse, Strip(one leading space).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from hydrant.engine.demo_model import demo_corpus

SPACE_MARK = "\u2581"


def write_sentencepiece_style(out: Path) -> Path:
    """A Llama-2-shaped tokenizer.json: `▁` for spaces, a prepended `▁`, the 256 `<0xNN>` byte
    tokens in the model's vocabulary (byte fallback), and the decoder Llama 2 ships."""
    # Trained word by word (as SentencePiece splits on whitespace), so no merge crosses a
    # space and a text's tokens start with its prefix's tokens; served without that split,
    # as Llama 2's tokenizer.json has no pre-tokenizer.
    trained = BackendTokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(SPACE_MARK, prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>"], show_progress=False)
    trained.train_from_iterator(demo_corpus().splitlines(), trainer)
    spec = json.loads(trained.to_str())
    spec["pre_tokenizer"] = None
    spec["normalizer"] = json.loads(
        normalizers.Sequence(
            [normalizers.Prepend(SPACE_MARK), normalizers.Replace(" ", SPACE_MARK)]
        ).__getstate__()
    )
    pieces = sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    vocab = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    vocab += [p for p in pieces if p not in vocab]
    spec["model"]["vocab"] = {piece: i for i, piece in enumerate(vocab)}
    spec["model"]["byte_fallback"] = True
    spec["model"]["fuse_unk"] = True
    spec["added_tokens"] = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate(["<unk>", "<s>", "</s>"])
    ]
    backend = BackendTokenizer.from_str(json.dumps(spec))
    llama2_decoder = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback()]
    backend.decoder = decoders.Sequence(
        [*llama2_decoder, decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    out.mkdir(parents=True, exist_ok=True)
    backend.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    return out
